//! Binary operators with Prometheus' vector matching: arithmetic and
//! comparisons between scalars and vectors, one-to-one, many-to-one and
//! one-to-many matching with `on`/`ignoring` and `group_left`/`group_right`,
//! and the set operators. Matching happens at each step among the series
//! with a value there, as Prometheus evaluates it. Pure.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::ast::{ArithOp, BinOp, Card, CmpOp, Matching, SetOp};
use super::budget::{self, Ledger};
use super::error::PromError;
use super::value::{LabelSet, NAME, Series, Value, vector};

/// `lhs op rhs` over `n` steps; each series it builds is charged to
/// `ledger` first.
pub fn binary(
    op: BinOp,
    matching: &Matching,
    lhs: Value,
    rhs: Value,
    n: usize,
    ledger: &Ledger,
) -> Result<Value, PromError> {
    match (lhs, rhs) {
        (Value::Scalar(a), Value::Scalar(b)) => Ok(Value::Scalar(
            a.iter()
                .zip(&b)
                .map(|(&x, &y)| match op {
                    BinOp::Arith(o) => o.apply(x, y),
                    BinOp::Cmp(c) => f64::from(u8::from(c.holds(x, y))),
                    BinOp::Set(_) => f64::NAN,
                })
                .collect(),
        )),
        (Value::Vector(v), Value::Scalar(s)) => with_scalar(op, matching.bool, v, &s, false),
        (Value::Scalar(s), Value::Vector(v)) => with_scalar(op, matching.bool, v, &s, true),
        (Value::Vector(l), Value::Vector(r)) => match op {
            BinOp::Set(set) => {
                ledger
                    .reserve(budget::vector_bytes(&l).saturating_add(budget::vector_bytes(&r)))?;
                vector(set_op(set, matching, &l, &r, n))
            }
            _ => vector(matched(op, matching, (&l, &r), n, ledger)?),
        },
        (a, b) => Err(PromError::BadData(format!(
            "binary operators take scalars and instant vectors, not a {} and a {}",
            a.kind(),
            b.kind()
        ))),
    }
}

/// A vector and a scalar: arithmetic keeps every value, a comparison the
/// values it holds for (the vector's value, whichever side it is on).
fn with_scalar(
    op: BinOp,
    bool_: bool,
    v: Vec<Series>,
    s: &[f64],
    scalar_first: bool,
) -> Result<Value, PromError> {
    let out = v
        .into_iter()
        .map(|mut x| {
            let drop_name = matches!(op, BinOp::Arith(_)) || bool_;
            if drop_name {
                x.labels.remove(NAME);
            }
            for (v, &y) in x.values.iter_mut().zip(s) {
                let Some(value) = *v else { continue };
                let (a, b) = if scalar_first { (y, value) } else { (value, y) };
                *v = match op {
                    BinOp::Arith(o) => Some(o.apply(a, b)),
                    BinOp::Cmp(c) if bool_ => Some(f64::from(u8::from(c.holds(a, b)))),
                    BinOp::Cmp(c) => c.holds(a, b).then_some(value),
                    BinOp::Set(_) => None,
                };
            }
            x
        })
        .collect();
    vector(out)
}

/// The labels two series are matched on.
fn signature(labels: &LabelSet, m: &Matching) -> Vec<(String, String)> {
    labels
        .iter()
        .filter(|(k, _)| {
            if m.on {
                m.labels.iter().any(|l| l == *k)
            } else {
                *k != NAME && !m.labels.iter().any(|l| l == *k)
            }
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The result's labels: the "many" side's, without `__name__` for
/// arithmetic (and `bool`), cut to `on` or without `ignoring` labels when
/// one-to-one, with the `group_x` labels taken from the "one" side.
fn result_labels(many: &LabelSet, one: &LabelSet, op: BinOp, m: &Matching) -> LabelSet {
    let mut out = many.clone();
    if matches!(op, BinOp::Arith(_)) || m.bool {
        out.remove(NAME);
    }
    match &m.card {
        Card::OneToOne => {
            if m.on {
                out.retain(|k, _| m.labels.iter().any(|l| l == k));
            } else {
                out.retain(|k, _| !m.labels.iter().any(|l| l == k));
            }
        }
        Card::ManyToOne(include) | Card::OneToMany(include) => {
            for l in include {
                match one.get(l) {
                    Some(v) if !v.is_empty() => {
                        out.insert(l.clone(), v.clone());
                    }
                    _ => {
                        out.remove(l);
                    }
                }
            }
        }
        Card::ManyToMany => {}
    }
    out
}

fn matched(
    op: BinOp,
    m: &Matching,
    (lhs, rhs): (&[Series], &[Series]),
    n: usize,
    ledger: &Ledger,
) -> Result<Vec<Series>, PromError> {
    // Long: vector matching in one pass: the sides' signatures, the matches, the cardinality checks.
    // The "one" side is the right one; group_right swaps the sides.
    let swapped = matches!(m.card, Card::OneToMany(_));
    let (many, one) = if swapped { (rhs, lhs) } else { (lhs, rhs) };
    // The signatures copy labels of both sides.
    ledger.reserve(budget::labels_of(many).saturating_add(budget::labels_of(one)))?;
    let many_sigs: Vec<Vec<(String, String)>> =
        many.iter().map(|s| signature(&s.labels, m)).collect();
    let one_sigs: Vec<Vec<(String, String)>> =
        one.iter().map(|s| signature(&s.labels, m)).collect();
    let mut labels_of: HashMap<(usize, usize), LabelSet> = HashMap::new();
    let mut out: BTreeMap<LabelSet, Vec<Option<f64>>> = BTreeMap::new();
    for k in 0..n {
        let mut ones: HashMap<&[(String, String)], usize> = HashMap::new();
        for (j, s) in one.iter().enumerate() {
            if s.values[k].is_none() {
                continue;
            }
            if let Some(&other) = ones.get(one_sigs[j].as_slice()) {
                return Err(PromError::Execution(format!(
                    "found duplicate series for the match group {} on the {} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                    show(&one_sigs[j]),
                    if swapped { "left" } else { "right" },
                    show_labels(&s.labels),
                    show_labels(&one[other].labels),
                )));
            }
            ones.insert(one_sigs[j].as_slice(), j);
        }
        let mut seen: HashMap<&[(String, String)], HashSet<LabelSet>> = HashMap::new();
        for (i, s) in many.iter().enumerate() {
            let Some(vm) = s.values[k] else { continue };
            let Some(&j) = ones.get(many_sigs[i].as_slice()) else {
                continue;
            };
            let Some(vo) = one[j].values[k] else { continue };
            let (vl, vr) = if swapped { (vo, vm) } else { (vm, vo) };
            let value = match op {
                BinOp::Arith(o) => Some(o.apply(vl, vr)),
                BinOp::Cmp(c) if m.bool => Some(f64::from(u8::from(c.holds(vl, vr)))),
                BinOp::Cmp(c) => c.holds(vl, vr).then_some(vl),
                BinOp::Set(_) => None,
            };
            let Some(value) = value else { continue };
            let labels = match labels_of.entry((i, j)) {
                std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    // Kept here, then as a series of the answer (and in
                    // the check of its group).
                    ledger.reserve(
                        budget::series_bytes(&s.labels, n)
                            .saturating_add(3 * budget::label_bytes(&one[j].labels)),
                    )?;
                    e.insert(result_labels(&s.labels, &one[j].labels, op, m))
                        .clone()
                }
            };
            let group = seen.entry(many_sigs[i].as_slice());
            match (&m.card, group) {
                (Card::OneToOne, std::collections::hash_map::Entry::Occupied(_)) => {
                    return Err(PromError::Execution(
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)".into(),
                    ));
                }
                (_, std::collections::hash_map::Entry::Occupied(mut e)) => {
                    if !e.get_mut().insert(labels.clone()) {
                        return Err(PromError::Execution(
                            "multiple matches for labels: grouping labels must ensure unique matches".into(),
                        ));
                    }
                }
                (_, std::collections::hash_map::Entry::Vacant(e)) => {
                    e.insert(HashSet::from([labels.clone()]));
                }
            }
            let slot = &mut out.entry(labels).or_insert_with(|| vec![None; n])[k];
            if slot.is_some() {
                return Err(PromError::Execution(
                    "vector cannot contain metrics with the same labelset".into(),
                ));
            }
            *slot = Some(value);
        }
    }
    Ok(out
        .into_iter()
        .map(|(labels, values)| Series { labels, values })
        .collect())
}

/// `and`, `or`, `unless`: series kept whole, by their signatures' presence
/// on the other side at each step.
fn set_op(op: SetOp, m: &Matching, lhs: &[Series], rhs: &[Series], n: usize) -> Vec<Series> {
    let lsig: Vec<Vec<(String, String)>> = lhs.iter().map(|s| signature(&s.labels, m)).collect();
    let rsig: Vec<Vec<(String, String)>> = rhs.iter().map(|s| signature(&s.labels, m)).collect();
    let mut left: Vec<Series> = lhs
        .iter()
        .map(|s| Series {
            labels: s.labels.clone(),
            values: vec![None; n],
        })
        .collect();
    let mut right: Vec<Series> = rhs
        .iter()
        .map(|s| Series {
            labels: s.labels.clone(),
            values: vec![None; n],
        })
        .collect();
    for k in 0..n {
        let present =
            |sigs: &[Vec<(String, String)>], side: &[Series]| -> HashSet<Vec<(String, String)>> {
                side.iter()
                    .zip(sigs)
                    .filter(|(s, _)| s.values[k].is_some())
                    .map(|(_, g)| g.clone())
                    .collect()
            };
        match op {
            SetOp::And | SetOp::Unless => {
                let on_right = present(&rsig, rhs);
                for (i, s) in lhs.iter().enumerate() {
                    if s.values[k].is_some() && on_right.contains(&lsig[i]) == (op == SetOp::And) {
                        left[i].values[k] = s.values[k];
                    }
                }
            }
            SetOp::Or => {
                let on_left = present(&lsig, lhs);
                for (i, s) in lhs.iter().enumerate() {
                    left[i].values[k] = s.values[k];
                }
                for (j, s) in rhs.iter().enumerate() {
                    if s.values[k].is_some() && !on_left.contains(&rsig[j]) {
                        right[j].values[k] = s.values[k];
                    }
                }
            }
        }
    }
    // A series on both sides under one label set is one series.
    let mut out: BTreeMap<LabelSet, Vec<Option<f64>>> = BTreeMap::new();
    for s in left.into_iter().chain(right) {
        let values = out.entry(s.labels).or_insert_with(|| vec![None; n]);
        for (into, v) in values.iter_mut().zip(s.values) {
            if v.is_some() {
                *into = v;
            }
        }
    }
    out.into_iter()
        .map(|(labels, values)| Series { labels, values })
        .collect()
}

fn show(sig: &[(String, String)]) -> String {
    let inner: Vec<String> = sig.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", inner.join(", "))
}

fn show_labels(l: &LabelSet) -> String {
    let inner: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{{{}}}", inner.join(", "))
}

impl ArithOp {
    pub fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            ArithOp::Add => a + b,
            ArithOp::Sub => a - b,
            ArithOp::Mul => a * b,
            ArithOp::Div => a / b,
            ArithOp::Mod => a % b,
            ArithOp::Pow => a.powf(b),
            ArithOp::Atan2 => a.atan2(b),
        }
    }
}

impl CmpOp {
    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Gt => a > b,
            CmpOp::Lt => a < b,
            CmpOp::Ge => a >= b,
            CmpOp::Le => a <= b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::value::series;
    use super::*;

    fn matching(card: Card, on: bool, labels: &[&str]) -> Matching {
        Matching {
            card,
            on,
            labels: labels.iter().map(|s| (*s).to_owned()).collect(),
            bool: false,
        }
    }

    fn vectors(v: Value) -> Vec<Series> {
        match v {
            Value::Vector(s) => s,
            other => panic!("a vector: {other:?}"),
        }
    }

    #[test]
    fn one_to_one_matches_on_every_label_but_the_name() {
        let a = vec![
            series(&[("__name__", "a"), ("s", "1")], &[Some(6.0), Some(1.0)]),
            series(&[("__name__", "a"), ("s", "2")], &[Some(8.0), None]),
        ];
        let b = vec![series(
            &[("__name__", "b"), ("s", "1")],
            &[Some(2.0), Some(4.0)],
        )];
        let out = vectors(
            binary(
                BinOp::Arith(ArithOp::Div),
                &matching(Card::OneToOne, false, &[]),
                Value::Vector(a.clone()),
                Value::Vector(b.clone()),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(out, vec![series(&[("s", "1")], &[Some(3.0), Some(0.25)])]);
        // A comparison filters and keeps the left side's name and value.
        let out = vectors(
            binary(
                BinOp::Cmp(CmpOp::Gt),
                &matching(Card::OneToOne, false, &[]),
                Value::Vector(a),
                Value::Vector(b),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(
            out,
            vec![series(&[("__name__", "a"), ("s", "1")], &[Some(6.0), None])]
        );
    }

    #[test]
    fn group_left_takes_labels_from_the_one_side_and_many_to_many_is_refused() {
        let usage = vec![
            series(&[("room", "r1"), ("sensor", "a")], &[Some(10.0)]),
            series(&[("room", "r1"), ("sensor", "b")], &[Some(20.0)]),
            series(&[("room", "r2"), ("sensor", "c")], &[Some(30.0)]),
        ];
        let rooms = vec![
            series(&[("floor", "1"), ("room", "r1")], &[Some(2.0)]),
            series(&[("floor", "2"), ("room", "r2")], &[Some(3.0)]),
        ];
        let out = vectors(
            binary(
                BinOp::Arith(ArithOp::Mul),
                &matching(Card::ManyToOne(vec!["floor".into()]), true, &["room"]),
                Value::Vector(usage.clone()),
                Value::Vector(rooms.clone()),
                1,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(
            out,
            vec![
                series(
                    &[("floor", "1"), ("room", "r1"), ("sensor", "a")],
                    &[Some(20.0)]
                ),
                series(
                    &[("floor", "1"), ("room", "r1"), ("sensor", "b")],
                    &[Some(40.0)]
                ),
                series(
                    &[("floor", "2"), ("room", "r2"), ("sensor", "c")],
                    &[Some(90.0)]
                ),
            ]
        );
        // Without group_left, two left series match one right series.
        let err = binary(
            BinOp::Arith(ArithOp::Mul),
            &matching(Card::OneToOne, true, &["room"]),
            Value::Vector(usage.clone()),
            Value::Vector(rooms),
            1,
            &Ledger::unlimited(),
        );
        assert!(
            matches!(err, Err(PromError::Execution(m)) if m.contains("many-to-one matching must be explicit"))
        );
        // Swapped sides: the right is many, the duplicate is on the "one" (left) side.
        let err = binary(
            BinOp::Arith(ArithOp::Mul),
            &matching(Card::OneToMany(Vec::new()), true, &["room"]),
            Value::Vector(usage.clone()),
            Value::Vector(usage),
            1,
            &Ledger::unlimited(),
        );
        assert!(matches!(err, Err(PromError::Execution(m)) if m.contains("left hand-side")));
    }

    /// Prometheus 3 drops the name for `atan2` too (Prometheus 2 kept it).
    #[test]
    fn atan2_is_arithmetic() {
        let y = vec![series(&[("__name__", "y"), ("s", "1")], &[Some(1.0)])];
        let x = vec![series(&[("__name__", "x"), ("s", "1")], &[Some(-1.0)])];
        let out = vectors(
            binary(
                BinOp::Arith(ArithOp::Atan2),
                &matching(Card::OneToOne, false, &[]),
                Value::Vector(y),
                Value::Vector(x),
                1,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(
            out,
            vec![series(
                &[("s", "1")],
                &[Some(3.0 * std::f64::consts::FRAC_PI_4)]
            )]
        );
    }

    #[test]
    fn set_operators_keep_series_whole() {
        let a = vec![
            series(&[("__name__", "a"), ("s", "1")], &[Some(1.0), Some(1.0)]),
            series(&[("__name__", "a"), ("s", "2")], &[Some(2.0), None]),
        ];
        let b = vec![
            series(&[("__name__", "b"), ("s", "1")], &[None, Some(9.0)]),
            series(&[("__name__", "b"), ("s", "3")], &[Some(3.0), Some(3.0)]),
        ];
        let m = matching(Card::ManyToMany, false, &[]);
        let and = vectors(
            binary(
                BinOp::Set(SetOp::And),
                &m,
                Value::Vector(a.clone()),
                Value::Vector(b.clone()),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(
            and,
            vec![series(&[("__name__", "a"), ("s", "1")], &[None, Some(1.0)])]
        );
        let unless = vectors(
            binary(
                BinOp::Set(SetOp::Unless),
                &m,
                Value::Vector(a.clone()),
                Value::Vector(b.clone()),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(
            unless,
            vec![
                series(&[("__name__", "a"), ("s", "1")], &[Some(1.0), None]),
                series(&[("__name__", "a"), ("s", "2")], &[Some(2.0), None]),
            ]
        );
        let or = vectors(
            binary(
                BinOp::Set(SetOp::Or),
                &m,
                Value::Vector(a),
                Value::Vector(b),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(or.len(), 3);
        assert_eq!(
            or[2],
            series(&[("__name__", "b"), ("s", "3")], &[Some(3.0), Some(3.0)])
        );
    }

    #[test]
    fn comparisons_with_scalars_filter_or_answer_bool() {
        let t = vec![series(
            &[("__name__", "t"), ("s", "1")],
            &[Some(25.0), Some(35.0)],
        )];
        let m = matching(Card::OneToOne, false, &[]);
        let out = vectors(
            binary(
                BinOp::Cmp(CmpOp::Gt),
                &m,
                Value::Vector(t.clone()),
                Value::Scalar(vec![30.0, 30.0]),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(
            out,
            vec![series(
                &[("__name__", "t"), ("s", "1")],
                &[None, Some(35.0)]
            )]
        );
        // The scalar on the left: still the vector's value.
        let out = vectors(
            binary(
                BinOp::Cmp(CmpOp::Lt),
                &m,
                Value::Scalar(vec![30.0, 30.0]),
                Value::Vector(t.clone()),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(out[0].values, vec![None, Some(35.0)]);
        let b = Matching { bool: true, ..m };
        let out = vectors(
            binary(
                BinOp::Cmp(CmpOp::Gt),
                &b,
                Value::Vector(t),
                Value::Scalar(vec![30.0, 30.0]),
                2,
                &Ledger::unlimited(),
            )
            .expect("ok"),
        );
        assert_eq!(out, vec![series(&[("s", "1")], &[Some(0.0), Some(1.0)])]);
    }
}
