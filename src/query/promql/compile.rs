//! A parsed expression checked against what Hourglass answers and turned
//! into a tree of [`Node`]s. Anything else is a `bad_data` error naming what
//! is not supported. Pure.

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::token::{self, TokenId};
use promql_parser::parser::{
    self, AtModifier, Expr, LabelModifier, Offset, VectorMatchCardinality,
};

use super::PromError;
use super::limits::{self, Limits};
use crate::query::plan::Need;

/// Prometheus' default lookback for instant selectors.
pub const LOOKBACK_MS: i64 = 5 * 60 * 1000;
/// A subquery's step when it names none (Prometheus' default evaluation interval).
pub const DEFAULT_SUBQUERY_STEP_MS: i64 = 60_000;

/// The `@` modifier: a fixed evaluation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Ms(i64),
    /// The query's first evaluation time.
    Start,
    /// Its last.
    End,
}

/// A series selector with where it looks.
#[derive(Debug, Clone)]
pub struct Selector {
    pub matchers: Vec<Matcher>,
    pub offset_ms: i64,
    pub at: Option<At>,
}

/// What a function computes over each window of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeFunc {
    Avg,
    Sum,
    Min,
    Max,
    Count,
    Last,
    Present,
    Absent,
    Stddev,
    Stdvar,
    Quantile,
    Rate,
    Increase,
    Delta,
    Irate,
    Idelta,
    Deriv,
    Resets,
    Changes,
}

impl RangeFunc {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "avg_over_time" => Self::Avg,
            "sum_over_time" => Self::Sum,
            "min_over_time" => Self::Min,
            "max_over_time" => Self::Max,
            "count_over_time" => Self::Count,
            "last_over_time" => Self::Last,
            "present_over_time" => Self::Present,
            "absent_over_time" => Self::Absent,
            "stddev_over_time" => Self::Stddev,
            "stdvar_over_time" => Self::Stdvar,
            "quantile_over_time" => Self::Quantile,
            "rate" => Self::Rate,
            "increase" => Self::Increase,
            "delta" => Self::Delta,
            "irate" => Self::Irate,
            "idelta" => Self::Idelta,
            "deriv" => Self::Deriv,
            "resets" => Self::Resets,
            "changes" => Self::Changes,
            _ => return None,
        })
    }

    /// What the readings of a window must give: aggregates, summaries
    /// (first, last, counters, moments) or every value (quantiles).
    pub fn need(self) -> Need {
        match self {
            Self::Avg
            | Self::Sum
            | Self::Min
            | Self::Max
            | Self::Count
            | Self::Present
            | Self::Absent => Need::Aggregates,
            Self::Quantile => Need::Values,
            _ => Need::Summaries,
        }
    }

    /// `last_over_time` keeps `__name__` (as a selector does); the others drop it.
    pub fn keeps_name(self) -> bool {
        self == Self::Last
    }
}

/// Functions of instant vectors and scalars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Abs,
    Ceil,
    Floor,
    Round,
    Sqrt,
    Exp,
    Ln,
    Log2,
    Log10,
    Sgn,
    Clamp,
    ClampMin,
    ClampMax,
    Timestamp,
    Time,
    Vector,
    Scalar,
    LabelReplace,
    LabelJoin,
    Sort,
    SortDesc,
    DayOfWeek,
    DayOfMonth,
    DayOfYear,
    DaysInMonth,
    Hour,
    Minute,
    Month,
    Year,
    Absent,
}

impl Func {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "abs" => Self::Abs,
            "ceil" => Self::Ceil,
            "floor" => Self::Floor,
            "round" => Self::Round,
            "sqrt" => Self::Sqrt,
            "exp" => Self::Exp,
            "ln" => Self::Ln,
            "log2" => Self::Log2,
            "log10" => Self::Log10,
            "sgn" => Self::Sgn,
            "clamp" => Self::Clamp,
            "clamp_min" => Self::ClampMin,
            "clamp_max" => Self::ClampMax,
            "timestamp" => Self::Timestamp,
            "time" => Self::Time,
            "vector" => Self::Vector,
            "scalar" => Self::Scalar,
            "label_replace" => Self::LabelReplace,
            "label_join" => Self::LabelJoin,
            "sort" => Self::Sort,
            "sort_desc" => Self::SortDesc,
            "day_of_week" => Self::DayOfWeek,
            "day_of_month" => Self::DayOfMonth,
            "day_of_year" => Self::DayOfYear,
            "days_in_month" => Self::DaysInMonth,
            "hour" => Self::Hour,
            "minute" => Self::Minute,
            "month" => Self::Month,
            "year" => Self::Year,
            "absent" => Self::Absent,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Atan2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Gt,
    Lt,
    Ge,
    Le,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOp {
    And,
    Or,
    Unless,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Arith(ArithOp),
    Cmp(CmpOp),
    Set(SetOp),
}

/// How the series of two vectors pair up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Card {
    OneToOne,
    /// `group_left(labels)`: many on the left, the labels taken from the right.
    ManyToOne(Vec<String>),
    /// `group_right(labels)`.
    OneToMany(Vec<String>),
    /// Set operators.
    ManyToMany,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matching {
    pub card: Card,
    /// `on(labels)` (true) or `ignoring(labels)` (false); without either,
    /// every label but `__name__` is compared.
    pub on: bool,
    pub labels: Vec<String>,
    /// Comparisons answer 0 or 1 instead of filtering.
    pub bool: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggOp {
    Avg,
    Sum,
    Min,
    Max,
    Count,
    Group,
    Stddev,
    Stdvar,
    Topk,
    Bottomk,
    Quantile,
    CountValues,
}

/// `by (…)` keeps these labels; `without (…)` drops them and `__name__`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    By(Vec<String>),
    Without(Vec<String>),
}

/// The range a range function reads: a selector's, or a subquery's.
#[derive(Debug, Clone)]
pub enum RangeArg {
    Selector {
        selector: Selector,
        range_ms: i64,
    },
    Subquery {
        expr: Box<Node>,
        range_ms: i64,
        step_ms: i64,
        offset_ms: i64,
        at: Option<At>,
    },
}

#[derive(Debug, Clone)]
pub enum Node {
    Number(f64),
    Str(String),
    /// An instant selector: each series' newest reading in the lookback.
    Instant(Selector),
    Range {
        func: RangeFunc,
        arg: RangeArg,
        /// `quantile_over_time`'s φ.
        param: Option<Box<Node>>,
    },
    Call {
        func: Func,
        args: Vec<Node>,
    },
    Neg(Box<Node>),
    Binary {
        op: BinOp,
        lhs: Box<Node>,
        rhs: Box<Node>,
        matching: Matching,
    },
    Aggregate {
        op: AggOp,
        grouping: Grouping,
        param: Option<Box<Node>>,
        expr: Box<Node>,
    },
}

pub const SUPPORTED: &str = "selectors with =, !=, =~, !~, offset and @; subqueries; \
*_over_time (avg, sum, min, max, count, last, present, absent, stddev, stdvar, quantile), rate, increase, delta, irate, idelta, deriv, resets, changes; \
abs, ceil, floor, round, sqrt, exp, ln, log2, log10, sgn, clamp, clamp_min, clamp_max, timestamp, time, vector, scalar, absent, \
label_replace, label_join, sort, sort_desc, day_of_week, day_of_month, day_of_year, days_in_month, hour, minute, month, year; \
+ - * / % ^ atan2, == != > < >= <= (with bool), and, or, unless, with on, ignoring, group_left, group_right; \
sum, avg, min, max, count, group, stddev, stdvar, topk, bottomk, quantile, count_values with by/without";

fn unsupported(what: impl std::fmt::Display) -> PromError {
    PromError::BadData(format!(
        "{what} is not supported by Hourglass; supported: {SUPPORTED}"
    ))
}

/// Parses `query` once it is within `limits` (the parser recurses).
pub fn parse(query: &str, limits: &Limits) -> Result<Expr, PromError> {
    limits::check(query, limits)?;
    parser::parse(query).map_err(|e| PromError::BadData(format!("parse error: {e}")))
}

/// Parses and checks `query`.
pub fn compile(query: &str, limits: &Limits) -> Result<Node, PromError> {
    walk(&parse(query, limits)?)
}

fn ms(d: &std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

fn offset_ms(offset: &Option<Offset>) -> i64 {
    match offset {
        None => 0,
        Some(Offset::Pos(d)) => ms(d),
        Some(Offset::Neg(d)) => -ms(d),
    }
}

fn at_of(at: &Option<AtModifier>) -> Option<At> {
    at.as_ref().map(|a| match a {
        AtModifier::Start => At::Start,
        AtModifier::End => At::End,
        AtModifier::At(t) => At::Ms(match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => ms(&d),
            Err(e) => -ms(&e.duration()),
        }),
    })
}

/// A selector's label matchers, its metric name among them.
pub fn matchers(vs: &parser::VectorSelector) -> Result<Vec<Matcher>, PromError> {
    if !vs.matchers.or_matchers.is_empty() {
        return Err(unsupported("the `or` of label matchers"));
    }
    let mut matchers = vs.matchers.matchers.clone();
    if let Some(name) = &vs.name
        && !matchers.iter().any(|m| m.name == "__name__")
    {
        matchers.push(Matcher::new(MatchOp::Equal, "__name__", name));
    }
    Ok(matchers)
}

fn selector(vs: &parser::VectorSelector) -> Result<Selector, PromError> {
    Ok(Selector {
        matchers: matchers(vs)?,
        offset_ms: offset_ms(&vs.offset),
        at: at_of(&vs.at),
    })
}

fn names(l: &promql_parser::label::Labels) -> Vec<String> {
    l.labels.iter().map(|x| x.to_string()).collect()
}

fn range_arg(arg: &Expr, name: &str) -> Result<RangeArg, PromError> {
    match arg {
        Expr::MatrixSelector(ms_) => Ok(RangeArg::Selector {
            selector: selector(&ms_.vs)?,
            range_ms: ms(&ms_.range),
        }),
        Expr::Subquery(sq) => Ok(RangeArg::Subquery {
            expr: Box::new(walk(&sq.expr)?),
            range_ms: ms(&sq.range),
            step_ms: match sq.step.as_ref().map_or(DEFAULT_SUBQUERY_STEP_MS, ms) {
                // Inner evaluation times are read as stored seconds.
                s if s > 0 && s % 1000 == 0 => s,
                _ => {
                    return Err(PromError::BadData(
                        "a subquery's step is a whole number of seconds in Hourglass".into(),
                    ));
                }
            },
            offset_ms: offset_ms(&sq.offset),
            at: at_of(&sq.at),
        }),
        Expr::Paren(p) => range_arg(&p.expr, name),
        _ => Err(PromError::BadData(format!(
            "{name} takes a range vector (a selector with a [range], or a subquery)"
        ))),
    }
}

fn walk(expr: &Expr) -> Result<Node, PromError> {
    super::deep(|| walk_level(expr))
}

fn walk_level(expr: &Expr) -> Result<Node, PromError> {
    Ok(match expr {
        Expr::NumberLiteral(n) => Node::Number(n.val),
        Expr::StringLiteral(s) => Node::Str(s.val.clone()),
        Expr::Paren(p) => walk(&p.expr)?,
        Expr::Unary(u) => Node::Neg(Box::new(walk(&u.expr)?)),
        Expr::VectorSelector(vs) => Node::Instant(selector(vs)?),
        Expr::MatrixSelector(_) | Expr::Subquery(_) => {
            return Err(PromError::BadData(
                "a range vector is only answered inside a function that takes one (rate, *_over_time, …); ask query_range for a series of points".into(),
            ));
        }
        Expr::Call(call) => {
            let name = call.func.name;
            let args = &call.args.args;
            if let Some(func) = RangeFunc::named(name) {
                let (param, range) = match (func, args.as_slice()) {
                    (RangeFunc::Quantile, [q, r]) => (Some(Box::new(walk(q)?)), r),
                    (_, [r]) => (None, r),
                    _ => {
                        return Err(PromError::BadData(format!(
                            "{name} takes {} argument(s)",
                            if func == RangeFunc::Quantile { 2 } else { 1 }
                        )));
                    }
                };
                Node::Range {
                    func,
                    arg: range_arg(range, name)?,
                    param,
                }
            } else if let Some(func) = Func::named(name) {
                Node::Call {
                    func,
                    args: args.iter().map(|a| walk(a)).collect::<Result<_, _>>()?,
                }
            } else {
                return Err(unsupported(format_args!("function {name}")));
            }
        }
        Expr::Aggregate(a) => {
            let op = match a.op.id() {
                token::T_AVG => AggOp::Avg,
                token::T_SUM => AggOp::Sum,
                token::T_MIN => AggOp::Min,
                token::T_MAX => AggOp::Max,
                token::T_COUNT => AggOp::Count,
                token::T_GROUP => AggOp::Group,
                token::T_STDDEV => AggOp::Stddev,
                token::T_STDVAR => AggOp::Stdvar,
                token::T_TOPK => AggOp::Topk,
                token::T_BOTTOMK => AggOp::Bottomk,
                token::T_QUANTILE => AggOp::Quantile,
                token::T_COUNT_VALUES => AggOp::CountValues,
                _ => return Err(unsupported(format_args!("aggregation {}", a.op))),
            };
            let grouping = match &a.modifier {
                None => Grouping::By(Vec::new()),
                Some(LabelModifier::Include(l)) => Grouping::By(names(l)),
                Some(LabelModifier::Exclude(l)) => Grouping::Without(names(l)),
            };
            Node::Aggregate {
                op,
                grouping,
                param: a
                    .param
                    .as_ref()
                    .map(|p| walk(p).map(Box::new))
                    .transpose()?,
                expr: Box::new(walk(&a.expr)?),
            }
        }
        Expr::Binary(b) => {
            let op = binop(b.op.id())
                .ok_or_else(|| unsupported(format_args!("the operator {}", b.op)))?;
            let matching = match &b.modifier {
                None => Matching {
                    card: if matches!(op, BinOp::Set(_)) {
                        Card::ManyToMany
                    } else {
                        Card::OneToOne
                    },
                    on: false,
                    labels: Vec::new(),
                    bool: false,
                },
                Some(m) => {
                    let (on, labels) = match &m.matching {
                        Some(LabelModifier::Include(l)) => (true, names(l)),
                        Some(LabelModifier::Exclude(l)) => (false, names(l)),
                        None => (false, Vec::new()),
                    };
                    Matching {
                        card: match &m.card {
                            VectorMatchCardinality::OneToOne => Card::OneToOne,
                            VectorMatchCardinality::ManyToOne(l) => Card::ManyToOne(names(l)),
                            VectorMatchCardinality::OneToMany(l) => Card::OneToMany(names(l)),
                            VectorMatchCardinality::ManyToMany => Card::ManyToMany,
                        },
                        on,
                        labels,
                        bool: m.return_bool,
                    }
                }
            };
            Node::Binary {
                op,
                lhs: Box::new(walk(&b.lhs)?),
                rhs: Box::new(walk(&b.rhs)?),
                matching,
            }
        }
        Expr::Extension(_) => return Err(unsupported("an extension")),
    })
}

fn binop(id: TokenId) -> Option<BinOp> {
    Some(match id {
        token::T_ADD => BinOp::Arith(ArithOp::Add),
        token::T_SUB => BinOp::Arith(ArithOp::Sub),
        token::T_MUL => BinOp::Arith(ArithOp::Mul),
        token::T_DIV => BinOp::Arith(ArithOp::Div),
        token::T_MOD => BinOp::Arith(ArithOp::Mod),
        token::T_POW => BinOp::Arith(ArithOp::Pow),
        token::T_ATAN2 => BinOp::Arith(ArithOp::Atan2),
        token::T_EQLC => BinOp::Cmp(CmpOp::Eq),
        token::T_NEQ => BinOp::Cmp(CmpOp::Ne),
        token::T_GTR => BinOp::Cmp(CmpOp::Gt),
        token::T_LSS => BinOp::Cmp(CmpOp::Lt),
        token::T_GTE => BinOp::Cmp(CmpOp::Ge),
        token::T_LTE => BinOp::Cmp(CmpOp::Le),
        token::T_LAND => BinOp::Set(SetOp::And),
        token::T_LOR => BinOp::Set(SetOp::Or),
        token::T_LUNLESS => BinOp::Set(SetOp::Unless),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(q: &str) -> String {
        match compile(q, &Limits::default()) {
            Err(PromError::BadData(m)) => m,
            other => panic!("{q}: {other:?}"),
        }
    }

    #[test]
    fn what_dashboards_and_alerts_use_compiles() {
        for q in [
            "speed",
            r#"speed{sensor="x"}"#,
            r#"{__name__="odd.name", site=~"a|b"}"#,
            "avg_over_time(speed[5m])",
            "last_over_time(speed[1h] offset 5m)",
            "sum by (site) (avg_over_time(speed[1h]))",
            "count without (sensor) (speed)",
            "speed * 1.8 + 32",
            "sum(sum_over_time(temp[1d])) / sum(count_over_time(temp[1d]))",
            "increase(energy_kwh[1d])",
            "rate(energy_kwh[5m]) * 3600",
            "topk(5, avg_over_time(temp[1h]))",
            "temp > 30",
            "temp > bool 30",
            "absent_over_time(temp{sensor=\"x\"}[10m])",
            "a / on(sensor) group_left(site) b",
            "a and b",
            "max_over_time(rate(c[5m])[1h:1m])",
            "temp @ 1700000000",
            "temp @ end()",
            "label_replace(temp, \"s\", \"$1\", \"sensor\", \"(.*)-.*\")",
            "quantile_over_time(0.9, temp[1h])",
            "count_values(\"value\", temp)",
            "day_of_week()",
            "clamp(temp, 0, 100)",
            "sort_desc(temp)",
            "vector(1) + scalar(temp)",
        ] {
            compile(q, &Limits::default()).unwrap_or_else(|e| panic!("{q}: {e:?}"));
        }
    }

    #[test]
    fn what_stays_refused_is_named() {
        assert!(
            error("histogram_quantile(0.9, rate(x[5m]))").contains("function histogram_quantile")
        );
        assert!(error("holt_winters(x[5m], 0.5, 0.5)").contains("function holt_winters"));
        assert!(error("speed[5m]").contains("range vector"));
        assert!(error("speed{").starts_with("parse error"));
        assert!(
            error("rate(speed)").contains("range vector") || error("rate(speed)").contains("parse")
        );
    }

    #[test]
    fn selectors_carry_their_window_offset_and_time() {
        let Node::Range {
            func,
            arg: RangeArg::Selector { selector, range_ms },
            ..
        } = compile(
            "max_over_time(speed[90s] offset 1m @ 1000)",
            &Limits::default(),
        )
        .expect("compiles")
        else {
            panic!("a range function")
        };
        assert_eq!(func, RangeFunc::Max);
        assert_eq!(range_ms, 90_000);
        assert_eq!(selector.offset_ms, 60_000);
        assert_eq!(selector.at, Some(At::Ms(1_000_000)));
        let Node::Range {
            arg: RangeArg::Subquery { step_ms, .. },
            ..
        } = compile("max_over_time(speed[1h:])", &Limits::default()).expect("compiles")
        else {
            panic!("a subquery")
        };
        assert_eq!(step_ms, DEFAULT_SUBQUERY_STEP_MS);
    }
}
