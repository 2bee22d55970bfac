//! Evaluation of a compiled expression, in two pure passes around the
//! reads: [`leaves`] lists every selector read the expression needs (which
//! series function, at which evaluation times: subqueries and `@` move them),
//! the caller reads them all, and [`run`] evaluates the tree over what was
//! read. Both walk the tree in one order, so the n-th read is the n-th leaf.

use std::sync::Arc;

use super::aggregate::{Param, aggregate, valid_label_name};
use super::ast::{At, Func, LOOKBACK_MS, Node, RangeArg, RangeFunc, Selector};
use super::binary::binary;
use super::budget::{self, Ledger};
use super::error::PromError;
use super::functions::{
    Window, calendar, go_log2, go_log10, go_max, go_min, range_value, round, sgn,
};
use super::value::{LabelSet, NAME, Series, Value, map_values, vector};
use super::window::Steps;
use crate::domain::{Sample, Summary};

/// What a selector read computes at each of its evaluation times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafFunc {
    /// The newest reading in the lookback (an instant selector).
    Instant,
    /// Its time (`timestamp(selector)`).
    Timestamp,
    Range(RangeFunc),
}

/// One selector read.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub selector: Selector,
    pub func: LeafFunc,
    /// The range, or the lookback of an instant selector.
    pub range_ms: i64,
    /// Evaluation times (a single one with `@`), before the offset.
    pub steps: Steps,
    /// `quantile_over_time`'s φ at each evaluation time.
    pub param: Vec<f64>,
}

impl Leaf {
    /// Whether the answer keeps `__name__`.
    pub fn keeps_name(&self) -> bool {
        match self.func {
            LeafFunc::Instant => true,
            LeafFunc::Timestamp => false,
            LeafFunc::Range(f) => f.keeps_name(),
        }
    }
}

/// The query's own evaluation times (`@ start()` and `@ end()` refer to
/// them) and what its evaluation may take.
#[derive(Debug, Clone)]
pub struct Query {
    pub steps: Steps,
    /// Most evaluation times of one subquery (`query.max_samples`): its
    /// values are held at each.
    pub max_steps: usize,
    /// When the evaluation gives up (`query.timeout`); checked at every node
    /// and in every loop over series.
    pub deadline: Option<std::time::Instant>,
    /// Bytes of one series' labels a function may build.
    pub max_label_bytes: usize,
    /// What the evaluation holds, charged before it is built.
    pub ledger: Arc<Ledger>,
}

#[cfg(test)]
impl Query {
    /// A query at `steps` with no deadline and room for any subquery that
    /// fits `max_steps`.
    pub fn new(steps: Steps, max_steps: usize) -> Self {
        Self {
            steps,
            max_steps,
            deadline: None,
            max_label_bytes: super::Limits::default().max_label_bytes,
            ledger: Arc::new(Ledger::unlimited()),
        }
    }
}

impl Query {
    fn at(&self, at: At) -> i64 {
        match at {
            At::Ms(t) => t,
            At::Start => self.steps.start_ms,
            At::End => self.steps.at(self.steps.n.saturating_sub(1)),
        }
    }

    /// Where a selector with `at` is evaluated when its expression is at `steps`.
    fn steps_of(&self, at: Option<At>, steps: &Steps) -> Steps {
        match at {
            Some(a) => Steps {
                start_ms: self.at(a),
                step_ms: 1,
                n: usize::from(steps.n > 0),
            },
            None => *steps,
        }
    }

    /// The inner evaluation times of a subquery: multiples of its step from
    /// the first window's start to the last window's end (as Prometheus
    /// aligns them).
    fn subquery_steps(
        &self,
        outer: &Steps,
        range_ms: i64,
        step_ms: i64,
        offset_ms: i64,
        at: Option<At>,
    ) -> Steps {
        if outer.n == 0 {
            return Steps {
                start_ms: 0,
                step_ms,
                n: 0,
            };
        }
        let (first, last) = match at {
            Some(a) => (self.at(a), self.at(a)),
            None => (outer.start_ms, outer.at(outer.n - 1)),
        };
        let low = first.saturating_sub(offset_ms).saturating_sub(range_ms);
        let mut start = low.div_euclid(step_ms).saturating_mul(step_ms);
        if start < low {
            start = start.saturating_add(step_ms);
        }
        Steps::new(start, last.saturating_sub(offset_ms), step_ms)
    }

    /// A subquery's inner evaluation times, unless they are too many to hold.
    fn inner_steps(
        &self,
        outer: &Steps,
        range_ms: i64,
        step_ms: i64,
        offset_ms: i64,
        at: Option<At>,
    ) -> Result<Steps, PromError> {
        let inner = self.subquery_steps(outer, range_ms, step_ms, offset_ms, at);
        if inner.n > self.max_steps {
            return Err(PromError::BadData(format!(
                "a subquery would be evaluated at {} times, more than {} (query.max_samples); use a longer subquery step or a shorter range",
                inner.n, self.max_steps
            )));
        }
        Ok(inner)
    }

    /// An error once the deadline has passed.
    fn in_time(&self) -> Result<(), PromError> {
        match self.deadline {
            Some(d) if std::time::Instant::now() >= d => Err(PromError::Timeout),
            _ => Ok(()),
        }
    }
}

/// Every selector read `node` needs when evaluated at `steps`, in the order
/// [`run`] takes them.
pub fn leaves(node: &Node, q: &Query, steps: &Steps) -> Result<Vec<Leaf>, PromError> {
    let mut out = Vec::new();
    collect(node, q, steps, &mut out)?;
    Ok(out)
}

fn collect(node: &Node, q: &Query, steps: &Steps, out: &mut Vec<Leaf>) -> Result<(), PromError> {
    super::limits::deep(|| collect_level(node, q, steps, out))
}

fn collect_level(
    node: &Node,
    q: &Query,
    steps: &Steps,
    out: &mut Vec<Leaf>,
) -> Result<(), PromError> {
    match node {
        Node::Number(_) | Node::Str(_) => {}
        Node::Instant(sel) => out.push(Leaf {
            selector: sel.clone(),
            func: LeafFunc::Instant,
            range_ms: LOOKBACK_MS,
            steps: q.steps_of(sel.at, steps),
            param: Vec::new(),
        }),
        Node::Range { func, arg, param } => match arg {
            RangeArg::Selector { selector, range_ms } => {
                let at = q.steps_of(selector.at, steps);
                let param = match param {
                    Some(p) => static_scalar(p, q, &at, "quantile_over_time's φ")?,
                    None => Vec::new(),
                };
                out.push(Leaf {
                    selector: selector.clone(),
                    func: LeafFunc::Range(*func),
                    range_ms: *range_ms,
                    steps: at,
                    param,
                });
            }
            RangeArg::Subquery {
                expr,
                range_ms,
                step_ms,
                offset_ms,
                at,
            } => {
                if let Some(p) = param {
                    collect(p, q, steps, out)?;
                }
                let inner = q.inner_steps(steps, *range_ms, *step_ms, *offset_ms, *at)?;
                collect(expr, q, &inner, out)?;
            }
        },
        Node::Call { func, args } => {
            if let (Func::Timestamp, [Node::Instant(sel)]) = (func, args.as_slice()) {
                out.push(Leaf {
                    selector: sel.clone(),
                    func: LeafFunc::Timestamp,
                    range_ms: LOOKBACK_MS,
                    steps: q.steps_of(sel.at, steps),
                    param: Vec::new(),
                });
            } else {
                for a in args {
                    collect(a, q, steps, out)?;
                }
            }
        }
        Node::Neg(e) => collect(e, q, steps, out)?,
        Node::Binary { lhs, rhs, .. } => {
            collect(lhs, q, steps, out)?;
            collect(rhs, q, steps, out)?;
        }
        Node::Aggregate { param, expr, .. } => {
            if let Some(p) = param {
                collect(p, q, steps, out)?;
            }
            collect(expr, q, steps, out)?;
        }
    }
    Ok(())
}

/// A parameter that must not read data, at each step.
fn static_scalar(node: &Node, q: &Query, steps: &Steps, what: &str) -> Result<Vec<f64>, PromError> {
    if !leaves(node, q, steps)?.is_empty() {
        return Err(PromError::BadData(format!(
            "{what} must be a number (or an expression of numbers) in Hourglass"
        )));
    }
    match run(node, q, steps, &mut Vec::new().into_iter())? {
        Value::Scalar(v) => Ok(v),
        other => Err(PromError::BadData(format!(
            "{what} must be a scalar, not a {}",
            other.kind()
        ))),
    }
}

/// Evaluates `node` at `steps`, taking the reads [`leaves`] listed, in order.
/// What its children answered and what it reserved are released when it
/// returns, and its own answer is charged in their place ([`budget`]).
pub fn run(
    node: &Node,
    q: &Query,
    steps: &Steps,
    reads: &mut std::vec::IntoIter<Vec<Series>>,
) -> Result<Value, PromError> {
    super::limits::deep(|| {
        let mark = q.ledger.mark();
        let answer = run_level(node, q, steps, reads);
        q.ledger.reset(mark);
        let answer = answer?;
        q.ledger.reserve(budget::value_bytes(&answer))?;
        Ok(answer)
    })
}

fn run_level(
    node: &Node,
    q: &Query,
    steps: &Steps,
    reads: &mut std::vec::IntoIter<Vec<Series>>,
) -> Result<Value, PromError> {
    // Long: one arm per kind of node.
    q.in_time()?;
    let n = steps.n;
    Ok(match node {
        Node::Number(x) => {
            q.ledger.reserve(n.saturating_mul(8))?;
            Value::Scalar(vec![*x; n])
        }
        Node::Str(s) => Value::String(s.clone()),
        Node::Instant(sel) => vector(broadcast(next(reads, q)?, sel.at, n, q)?)?,
        Node::Range { func, arg, param } => match arg {
            RangeArg::Selector { selector, .. } => {
                let read = broadcast(next(reads, q)?, selector.at, n, q)?;
                if *func == RangeFunc::Absent {
                    absent(&read, n, absent_labels(Some(selector)))
                } else {
                    vector(read)?
                }
            }
            RangeArg::Subquery {
                expr,
                range_ms,
                step_ms,
                offset_ms,
                at,
            } => {
                let param = match param {
                    Some(p) => Some(scalar(run(p, q, steps, reads)?, "quantile_over_time's φ")?),
                    None => None,
                };
                let inner_steps = q.inner_steps(steps, *range_ms, *step_ms, *offset_ms, *at)?;
                let Value::Vector(inner) = run(expr, q, &inner_steps, reads)? else {
                    return Err(PromError::BadData(
                        "a subquery needs an instant vector inside".into(),
                    ));
                };
                let outer: Vec<i64> = (0..n)
                    .map(|k| {
                        at.map_or(steps.at(k), |a| q.at(a))
                            .saturating_sub(*offset_ms)
                    })
                    .collect();
                let read = over_points(
                    *func,
                    &inner,
                    &inner_steps,
                    &outer,
                    *range_ms,
                    param.as_deref(),
                    q,
                )?;
                if *func == RangeFunc::Absent {
                    absent(&read, n, LabelSet::new())
                } else {
                    vector(read)?
                }
            }
        },
        Node::Call { func, args } => call(*func, args, q, steps, reads)?,
        Node::Neg(e) => match run(e, q, steps, reads)? {
            Value::Scalar(v) => Value::Scalar(v.into_iter().map(|x| -x).collect()),
            Value::Vector(s) => vector(map_values(s, |x| -x))?,
            Value::String(_) => {
                return Err(PromError::BadData("a string cannot be negated".into()));
            }
        },
        Node::Binary {
            op,
            lhs,
            rhs,
            matching,
        } => {
            let l = run(lhs, q, steps, reads)?;
            let r = run(rhs, q, steps, reads)?;
            binary(*op, matching, l, r, n, &q.ledger)?
        }
        Node::Aggregate {
            op,
            grouping,
            param,
            expr,
        } => {
            let param = match param {
                None => Param::None,
                Some(p) => match run(p, q, steps, reads)? {
                    Value::Scalar(v) => Param::Number(v),
                    Value::String(s) => Param::Label(s),
                    Value::Vector(_) => {
                        return Err(PromError::BadData(
                            "an aggregation's parameter is a scalar or a string".into(),
                        ));
                    }
                },
            };
            let Value::Vector(input) = run(expr, q, steps, reads)? else {
                return Err(PromError::BadData(
                    "aggregations expect an instant vector".into(),
                ));
            };
            vector(aggregate(
                *op,
                grouping,
                &param,
                &input,
                n,
                (q.max_steps, &q.ledger),
            )?)?
        }
    })
}

/// The next read, passing from the reads' charge into the tree's.
fn next(reads: &mut std::vec::IntoIter<Vec<Series>>, q: &Query) -> Result<Vec<Series>, PromError> {
    let read = reads
        .next()
        .ok_or_else(|| PromError::Execution("a selector was not read".into()))?;
    let bytes = budget::vector_bytes(&read);
    q.ledger.read_taken(bytes);
    // Held by this node until it answers.
    q.ledger.reserve(bytes)?;
    Ok(read)
}

/// A read at one fixed time (`@`) holds at every step.
fn broadcast(
    mut read: Vec<Series>,
    at: Option<At>,
    n: usize,
    q: &Query,
) -> Result<Vec<Series>, PromError> {
    if at.is_some() {
        q.ledger
            .reserve(read.len().saturating_mul(n.saturating_mul(budget::VALUE)))?;
        for s in &mut read {
            let v = s.values.first().copied().flatten();
            s.values = vec![v; n];
        }
    }
    Ok(read)
}

fn scalar(v: Value, what: &str) -> Result<Vec<f64>, PromError> {
    match v {
        Value::Scalar(v) => Ok(v),
        other => Err(PromError::BadData(format!(
            "{what} must be a scalar, not a {}",
            other.kind()
        ))),
    }
}

fn instant_vector(v: Value, what: &str) -> Result<Vec<Series>, PromError> {
    match v {
        Value::Vector(s) => Ok(s),
        other => Err(PromError::BadData(format!(
            "{what} expects an instant vector, not a {}",
            other.kind()
        ))),
    }
}

fn string(node: Option<&Node>, what: &str) -> Result<String, PromError> {
    match node {
        Some(Node::Str(s)) => Ok(s.clone()),
        _ => Err(PromError::BadData(format!("{what} must be a string"))),
    }
}

/// The labels `absent` answers with: the selector's equality matchers
/// (a label matched more than once, or otherwise, is left out).
fn absent_labels(sel: Option<&Selector>) -> LabelSet {
    use promql_parser::label::MatchOp;
    let mut out = LabelSet::new();
    let Some(sel) = sel else { return out };
    let mut has = std::collections::HashSet::new();
    for m in &sel.matchers {
        if m.name == NAME {
            continue;
        }
        if m.op == MatchOp::Equal && has.insert(m.name.clone()) {
            out.insert(m.name.clone(), m.value.clone());
        } else {
            out.remove(&m.name);
        }
    }
    out
}

/// 1 at the steps where no series has a value.
fn absent(read: &[Series], n: usize, labels: LabelSet) -> Value {
    let values: Vec<Option<f64>> = (0..n)
        .map(|k| (!read.iter().any(|s| s.values[k].is_some())).then_some(1.0))
        .collect();
    let out: Vec<Series> = if values.iter().any(Option::is_some) {
        vec![Series { labels, values }]
    } else {
        Vec::new()
    };
    Value::Vector(out)
}

/// A range function over the points of a subquery: each outer time's window
/// `(t − range, t]` of the inner evaluation times.
fn over_points(
    func: RangeFunc,
    inner: &[Series],
    inner_steps: &Steps,
    outer: &[i64],
    range_ms: i64,
    param: Option<&[f64]>,
    q: &Query,
) -> Result<Vec<Series>, PromError> {
    let step = inner_steps.step_ms.max(1);
    // Inner times are whole seconds: the compiler refuses other steps.
    let index_after = |t: i64| -> usize {
        // The first inner point later than t.
        if t < inner_steps.start_ms {
            return 0;
        }
        let k = (t - inner_steps.start_ms).div_euclid(step) + 1;
        usize::try_from(k).unwrap_or(usize::MAX).min(inner_steps.n)
    };
    let mut samples: Vec<Sample> = Vec::new();
    let mut out = Vec::with_capacity(inner.len());
    // Each window is read whole: long windows at short steps cost their
    // product, so the deadline is checked as they go.
    let mut scanned = 0usize;
    for s in inner {
        q.ledger
            .reserve(budget::series_bytes(&s.labels, outer.len()))?;
        let mut labels = s.labels.clone();
        if !func.keeps_name() {
            labels.remove(NAME);
        }
        let mut values = Vec::with_capacity(outer.len());
        for (k, &t) in outer.iter().enumerate() {
            let (a, b) = (index_after(t.saturating_sub(range_ms)), index_after(t));
            scanned += b.saturating_sub(a) + 1;
            if scanned >= 1 << 20 {
                scanned = 0;
                q.in_time()?;
            }
            samples.clear();
            samples.extend((a..b).filter_map(|j| {
                s.values[j].map(|v| Sample {
                    t: inner_steps.at(j).div_euclid(1000),
                    v,
                })
            }));
            let summary = Summary::of(&samples);
            let agg = summary.as_ref().map(Summary::agg).unwrap_or_default();
            let w = Window {
                start_ms: t.saturating_sub(range_ms),
                end_ms: t,
                range_ms,
                agg: &agg,
                summary: summary.as_ref(),
                samples: &samples,
            };
            values.push(range_value(func, &w, param.map_or(f64::NAN, |p| p[k])));
        }
        out.push(Series { labels, values });
    }
    Ok(out)
}

/// Refuses a label value of up to `value` bytes for `dst` when the series'
/// labels with it could pass `max` bytes (`query.max_label_bytes`).
fn check_label_bytes(
    labels: &LabelSet,
    dst: &str,
    value: usize,
    max: usize,
    func: &str,
) -> Result<(), PromError> {
    let others: usize = labels
        .iter()
        .filter(|(k, _)| k.as_str() != dst)
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if others.saturating_add(dst.len()).saturating_add(value) > max {
        return Err(PromError::Execution(format!(
            "{func}() would build labels of more than {max} bytes (query.max_label_bytes)"
        )));
    }
    Ok(())
}

fn call(
    func: Func,
    args: &[Node],
    q: &Query,
    steps: &Steps,
    reads: &mut std::vec::IntoIter<Vec<Series>>,
) -> Result<Value, PromError> {
    // Long: one arm per PromQL function; the long ones are functions of their own.
    let n = steps.n;
    let time = |k: usize| steps.at(k) as f64 / 1000.0;
    let mut arg = |i: usize| -> Result<Value, PromError> {
        match args.get(i) {
            Some(a) => run(a, q, steps, reads),
            None => Err(PromError::BadData(format!(
                "{func:?} is missing an argument"
            ))),
        }
    };
    let math = |v: Value, f: &dyn Fn(f64) -> f64| -> Result<Value, PromError> {
        vector(map_values(instant_vector(v, "the function")?, f))
    };
    Ok(match func {
        Func::Abs => math(arg(0)?, &f64::abs)?,
        Func::Ceil => math(arg(0)?, &f64::ceil)?,
        Func::Floor => math(arg(0)?, &f64::floor)?,
        Func::Sqrt => math(arg(0)?, &f64::sqrt)?,
        Func::Exp => math(arg(0)?, &f64::exp)?,
        Func::Ln => math(arg(0)?, &f64::ln)?,
        Func::Log2 => math(arg(0)?, &go_log2)?,
        Func::Log10 => math(arg(0)?, &go_log10)?,
        Func::Sgn => math(arg(0)?, &sgn)?,
        Func::Round => {
            let v = instant_vector(arg(0)?, "round")?;
            let to = if args.len() > 1 {
                scalar(arg(1)?, "round's to_nearest")?
            } else {
                vec![1.0; n]
            };
            vector(per_step(v, true, |k, x| Some(round(x, to[k]))))?
        }
        Func::Clamp => {
            let v = instant_vector(arg(0)?, "clamp")?;
            let lo = scalar(arg(1)?, "clamp's min")?;
            let hi = scalar(arg(2)?, "clamp's max")?;
            vector(per_step(v, true, |k, x| {
                (hi[k] >= lo[k]).then(|| go_max(lo[k], go_min(hi[k], x)))
            }))?
        }
        Func::ClampMin => {
            let v = instant_vector(arg(0)?, "clamp_min")?;
            let lo = scalar(arg(1)?, "clamp_min's min")?;
            vector(per_step(v, true, |k, x| Some(go_max(lo[k], x))))?
        }
        Func::ClampMax => {
            let v = instant_vector(arg(0)?, "clamp_max")?;
            let hi = scalar(arg(1)?, "clamp_max's max")?;
            vector(per_step(v, true, |k, x| Some(go_min(hi[k], x))))?
        }
        Func::Timestamp => match args {
            // The readings' own times, read as such.
            [Node::Instant(sel)] => vector(broadcast(next(reads, q)?, sel.at, n, q)?)?,
            _ => {
                let v = instant_vector(arg(0)?, "timestamp")?;
                vector(per_step(v, true, |k, _| Some(time(k))))?
            }
        },
        Func::Time => {
            q.ledger.reserve(n.saturating_mul(8))?;
            Value::Scalar((0..n).map(time).collect())
        }
        Func::Vector => {
            let s = scalar(arg(0)?, "vector's argument")?;
            q.ledger
                .reserve(budget::series_bytes(&LabelSet::new(), n))?;
            Value::Vector(vec![Series {
                labels: LabelSet::new(),
                values: s.into_iter().map(Some).collect(),
            }])
        }
        Func::Scalar => {
            let v = instant_vector(arg(0)?, "scalar")?;
            Value::Scalar(
                (0..n)
                    .map(|k| {
                        let mut present = v.iter().filter_map(|s| s.values[k]);
                        match (present.next(), present.next()) {
                            (Some(x), None) => x,
                            _ => f64::NAN,
                        }
                    })
                    .collect(),
            )
        }
        Func::Absent => {
            let v = instant_vector(arg(0)?, "absent")?;
            let sel = match args.first() {
                Some(Node::Instant(sel)) => Some(sel),
                _ => None,
            };
            absent(&v, n, absent_labels(sel))
        }
        Func::Sort | Func::SortDesc => Value::Vector(instant_vector(arg(0)?, "sort")?),
        Func::LabelReplace => {
            let v = instant_vector(arg(0)?, "label_replace")?;
            vector(label_replace(v, args, q)?)?
        }
        Func::LabelJoin => {
            let v = instant_vector(arg(0)?, "label_join")?;
            vector(label_join(v, args, q)?)?
        }
        Func::DayOfWeek
        | Func::DayOfMonth
        | Func::DayOfYear
        | Func::DaysInMonth
        | Func::Hour
        | Func::Minute
        | Func::Month
        | Func::Year => {
            if args.is_empty() {
                q.ledger
                    .reserve(budget::series_bytes(&LabelSet::new(), n))?;
                Value::Vector(vec![Series {
                    labels: LabelSet::new(),
                    values: (0..n).map(|k| Some(calendar(func, time(k)))).collect(),
                }])
            } else {
                let v = instant_vector(arg(0)?, "the calendar function")?;
                vector(per_step(v, true, |_, x| Some(calendar(func, x))))?
            }
        }
    })
}

/// `label_replace(v, dst, replacement, src, regex)` over `v`.
fn label_replace(v: Vec<Series>, args: &[Node], q: &Query) -> Result<Vec<Series>, PromError> {
    let dst = string(args.get(1), "label_replace's destination label")?;
    let replacement = string(args.get(2), "label_replace's replacement")?;
    let src = string(args.get(3), "label_replace's source label")?;
    let regex = string(args.get(4), "label_replace's regular expression")?;
    let re = super::limits::function_regex("label_replace", &regex)?;
    check_destination(&dst, "label_replace")?;
    let mut out = Vec::with_capacity(v.len());
    for mut s in v {
        q.in_time()?;
        let value = s.labels.get(&src).cloned().unwrap_or_default();
        if let Some(caps) = re.captures(&value) {
            // Each `$` reference (a byte at least) expands to at
            // most the longest group: a bound before it is built.
            let longest = caps.iter().flatten().map(|m| m.len()).max().unwrap_or(0);
            let refs = replacement.bytes().filter(|&b| b == b'$').count();
            let most = refs
                .saturating_mul(longest)
                .saturating_add(replacement.len() - refs);
            check_label_bytes(&s.labels, &dst, most, q.max_label_bytes, "label_replace")?;
            q.ledger.reserve(most)?;
            let mut res = String::new();
            caps.expand(&replacement, &mut res);
            set_label(&mut s.labels, &dst, res);
        }
        out.push(s);
    }
    Ok(out)
}

/// A label function's destination must be a label name.
fn check_destination(dst: &str, func: &str) -> Result<(), PromError> {
    if valid_label_name(dst) {
        return Ok(());
    }
    Err(PromError::Execution(format!(
        "invalid destination label name in {func}(): {dst}"
    )))
}

/// `dst` set to `value`, or removed when `value` is empty (as Prometheus).
fn set_label(labels: &mut LabelSet, dst: &str, value: String) {
    labels.remove(dst);
    if !value.is_empty() {
        labels.insert(dst.to_owned(), value);
    }
}

/// `label_join(v, dst, separator, src...)` over `v`.
fn label_join(v: Vec<Series>, args: &[Node], q: &Query) -> Result<Vec<Series>, PromError> {
    let dst = string(args.get(1), "label_join's destination label")?;
    let sep = string(args.get(2), "label_join's separator")?;
    let srcs: Vec<String> = args
        .iter()
        .skip(3)
        .map(|a| string(Some(a), "label_join's source labels"))
        .collect::<Result<_, _>>()?;
    if let Some(bad) = srcs.iter().find(|s| !valid_label_name(s)) {
        return Err(PromError::Execution(format!(
            "invalid source label name in label_join(): {bad}"
        )));
    }
    check_destination(&dst, "label_join")?;
    let mut out = Vec::with_capacity(v.len());
    for mut s in v {
        q.in_time()?;
        let parts: Vec<&str> = srcs
            .iter()
            .map(|l| s.labels.get(l).map_or("", String::as_str))
            .collect();
        let length = parts
            .iter()
            .map(|p| p.len())
            .sum::<usize>()
            .saturating_add(sep.len().saturating_mul(parts.len().saturating_sub(1)));
        check_label_bytes(&s.labels, &dst, length, q.max_label_bytes, "label_join")?;
        q.ledger.reserve(length)?;
        let joined = parts.join(&sep);
        set_label(&mut s.labels, &dst, joined);
        out.push(s);
    }
    Ok(out)
}

/// Each value replaced by `f(step, value)` (none drops it), `__name__`
/// dropped when `drop_name`.
fn per_step(v: Vec<Series>, drop_name: bool, f: impl Fn(usize, f64) -> Option<f64>) -> Vec<Series> {
    v.into_iter()
        .map(|mut s| {
            if drop_name {
                s.labels.remove(NAME);
            }
            for (k, x) in s.values.iter_mut().enumerate() {
                if let Some(v) = *x {
                    *x = f(k, v);
                }
            }
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::compile::compile;
    use super::super::limits::Limits;
    use super::super::value::series;
    use super::*;

    fn eval(query: &str, reads: Vec<Vec<Series>>, n: usize) -> Result<Value, PromError> {
        let node = compile(query, &Limits::default()).expect("compiles");
        let steps = Steps {
            start_ms: 600_000,
            step_ms: 60_000,
            n,
        };
        let q = Query::new(steps, 1_000_000);
        let listed = leaves(&node, &q, &steps)?;
        assert_eq!(listed.len(), reads.len(), "{query}: reads");
        run(&node, &q, &steps, &mut reads.into_iter())
    }

    fn vectors(v: Value) -> Vec<Series> {
        match v {
            Value::Vector(s) => s,
            other => panic!("a vector: {other:?}"),
        }
    }

    #[test]
    fn arithmetic_drops_the_name_and_keeps_gaps() {
        let input = vec![series(
            &[("__name__", "t"), ("sensor", "a")],
            &[Some(10.0), None],
        )];
        let out = vectors(eval("t * 1.8 + 32", vec![input.clone()], 2).expect("ok"));
        assert_eq!(out, vec![series(&[("sensor", "a")], &[Some(50.0), None])]);
        let out = vectors(eval("100 - t", vec![input], 2).expect("ok"));
        assert_eq!(out[0].values, vec![Some(90.0), None]);
        assert_eq!(
            eval("2 ^ 3 % 5", vec![], 1).expect("ok"),
            Value::Scalar(vec![3.0])
        );
    }

    #[test]
    fn equal_label_sets_after_dropping_the_name_are_an_error() {
        let input = vec![
            series(&[("__name__", "a"), ("sensor", "s")], &[Some(1.0)]),
            series(&[("__name__", "b"), ("sensor", "s")], &[Some(2.0)]),
        ];
        assert!(matches!(
            eval(r#"-{__name__=~"a|b"}"#, vec![input], 1),
            Err(PromError::Execution(_))
        ));
    }

    #[test]
    fn the_ratio_of_two_fleet_sums_is_a_vector_division() {
        let sums = vec![series(&[], &[Some(30.0)])];
        let counts = vec![series(&[], &[Some(4.0)])];
        // Each aggregation reads its own leaf; the division matches `{}` with `{}`.
        let out = vectors(
            eval(
                "sum(sum_over_time(temp[1d])) / sum(count_over_time(temp[1d]))",
                vec![sums, counts],
                1,
            )
            .expect("ok"),
        );
        assert_eq!(out, vec![series(&[], &[Some(7.5)])]);
    }

    #[test]
    fn absent_answers_one_with_the_equality_matchers_labels() {
        let out = vectors(
            eval(
                r#"absent_over_time(temp{sensor="x", site=~"a.*"}[10m])"#,
                vec![vec![series(&[("sensor", "x")], &[Some(1.0), None])]],
                2,
            )
            .expect("ok"),
        );
        assert_eq!(out, vec![series(&[("sensor", "x")], &[None, Some(1.0)])]);
        let out = vectors(eval(r#"absent(nothing{job="a"})"#, vec![vec![]], 1).expect("ok"));
        assert_eq!(out, vec![series(&[("job", "a")], &[Some(1.0)])]);
    }

    #[test]
    fn labels_are_replaced_and_joined_as_prometheus_does() {
        let input = vec![series(
            &[("__name__", "t"), ("sensor", "hall-3"), ("site", "x")],
            &[Some(1.0)],
        )];
        let out = vectors(
            eval(
                r#"label_replace(t, "room", "$1", "sensor", "(.*)-\\d+")"#,
                vec![input.clone()],
                1,
            )
            .expect("ok"),
        );
        assert_eq!(out[0].labels["room"], "hall");
        assert_eq!(out[0].labels["__name__"], "t");
        let out = vectors(
            eval(
                r#"label_join(t, "id", "/", "site", "sensor")"#,
                vec![input.clone()],
                1,
            )
            .expect("ok"),
        );
        assert_eq!(out[0].labels["id"], "x/hall-3");
        assert!(matches!(
            eval(
                r#"label_replace(t, "1bad", "", "sensor", ".*")"#,
                vec![input],
                1
            ),
            Err(PromError::Execution(_))
        ));
    }

    #[test]
    fn subqueries_evaluate_inside_at_aligned_times_and_at_pins_a_time() {
        let node =
            compile("max_over_time(rate(c[5m])[10m:2m])", &Limits::default()).expect("compiles");
        let steps = Steps {
            start_ms: 3_600_000 + 30_000,
            step_ms: 60_000,
            n: 3,
        };
        let q = Query::new(steps, 1_000_000);
        let listed = leaves(&node, &q, &steps).expect("leaves");
        // Inner times: multiples of 2 m from the first window's start.
        assert_eq!(listed[0].steps.start_ms, 3_120_000);
        assert_eq!(listed[0].steps.step_ms, 120_000);
        assert_eq!(listed[0].steps.at(listed[0].steps.n - 1), 3_720_000);
        let node = compile("t @ end()", &Limits::default()).expect("compiles");
        let listed = leaves(&node, &q, &steps).expect("leaves");
        assert_eq!(listed[0].steps.n, 1);
        assert_eq!(listed[0].steps.start_ms, steps.at(2));
        let out = vectors(
            run(
                &node,
                &q,
                &steps,
                &mut vec![vec![series(&[("__name__", "t")], &[Some(4.0)])]].into_iter(),
            )
            .expect("ok"),
        );
        assert_eq!(out[0].values, vec![Some(4.0); 3]);
    }

    #[test]
    fn quantiles_over_time_take_a_number() {
        let node =
            compile("quantile_over_time(scalar(x), t[5m])", &Limits::default()).expect("compiles");
        let steps = Steps {
            start_ms: 0,
            step_ms: 1,
            n: 1,
        };
        assert!(matches!(
            leaves(&node, &Query::new(steps, 1_000_000), &steps),
            Err(PromError::BadData(_))
        ));
    }
}
