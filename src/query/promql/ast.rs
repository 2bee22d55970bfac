//! The tree a PromQL query compiles to ([`Node`] and its parts), and the
//! list of what is supported. `compile` builds it; the evaluator walks it.

use promql_parser::label::Matcher;

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
    pub(super) fn named(name: &str) -> Option<Self> {
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
    pub(super) fn named(name: &str) -> Option<Self> {
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
