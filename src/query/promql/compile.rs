//! A parsed PromQL expression checked against the subset Hourglass answers
//! and turned into a tree of [`Node`]s over data [`Leaf`]s. Anything else
//! is a `bad_data` error naming what is not supported. Pure.

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::token::{self, TokenId};
use promql_parser::parser::{self, Expr, LabelModifier, Offset};

use super::PromError;

/// What a leaf computes per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Avg,
    Sum,
    Min,
    Max,
    Count,
    Last,
}

impl Func {
    fn over_time(name: &str) -> Option<Self> {
        Some(match name {
            "avg_over_time" => Func::Avg,
            "sum_over_time" => Func::Sum,
            "min_over_time" => Func::Min,
            "max_over_time" => Func::Max,
            "count_over_time" => Func::Count,
            "last_over_time" => Func::Last,
            _ => return None,
        })
    }
}

/// One selector with what to compute over its windows.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub matchers: Vec<Matcher>,
    pub func: Func,
    /// The window: the range of `f(x[range])`, or the lookback of a bare selector.
    pub range_ms: i64,
    pub offset_ms: i64,
    /// Bare selectors and `last_over_time` keep `__name__`; other functions drop it.
    pub keep_name: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
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
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggOp {
    Avg,
    Sum,
    Min,
    Max,
    Count,
}

/// `by (…)` keeps these labels; `without (…)` drops them and `__name__`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    By(Vec<String>),
    Without(Vec<String>),
}

#[derive(Debug, Clone)]
pub enum Node {
    Number(f64),
    Leaf(usize),
    Neg(Box<Node>),
    Arith {
        op: ArithOp,
        lhs: Box<Node>,
        rhs: Box<Node>,
    },
    Aggregate {
        op: AggOp,
        grouping: Grouping,
        expr: Box<Node>,
    },
}

/// Prometheus' default lookback for bare selectors.
pub const LOOKBACK_MS: i64 = 5 * 60 * 1000;

pub const SUPPORTED: &str = "selectors with =, !=, =~, !~ and offset; avg_over_time, sum_over_time, min_over_time, max_over_time, count_over_time, last_over_time; avg, sum, min, max, count with by/without; number literals and + - * / % ^ between a vector and a scalar";

fn unsupported(what: impl std::fmt::Display) -> PromError {
    PromError::BadData(format!(
        "{what} is not supported by Hourglass; supported: {SUPPORTED}"
    ))
}

/// Parses and checks `query`.
pub fn compile(query: &str) -> Result<(Node, Vec<Leaf>), PromError> {
    let expr = parser::parse(query).map_err(|e| PromError::BadData(format!("parse error: {e}")))?;
    let mut leaves = Vec::new();
    let node = walk(&expr, &mut leaves)?;
    Ok((node, leaves))
}

/// Whether an expression is a vector (as opposed to a scalar).
pub fn is_vector(node: &Node) -> bool {
    match node {
        Node::Number(_) => false,
        Node::Leaf(_) | Node::Aggregate { .. } => true,
        Node::Neg(e) => is_vector(e),
        Node::Arith { lhs, rhs, .. } => is_vector(lhs) || is_vector(rhs),
    }
}

fn offset_ms(offset: &Option<Offset>) -> i64 {
    match offset {
        None => 0,
        Some(Offset::Pos(d)) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4),
        Some(Offset::Neg(d)) => -i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4),
    }
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

fn selector(
    vs: &parser::VectorSelector,
    func: Func,
    range_ms: i64,
    keep_name: bool,
) -> Result<Leaf, PromError> {
    if vs.at.is_some() {
        return Err(unsupported("the @ modifier"));
    }
    Ok(Leaf {
        matchers: matchers(vs)?,
        func,
        range_ms,
        offset_ms: offset_ms(&vs.offset),
        keep_name,
    })
}

fn walk(expr: &Expr, leaves: &mut Vec<Leaf>) -> Result<Node, PromError> {
    let mut push = |leaf: Leaf| {
        leaves.push(leaf);
        Node::Leaf(leaves.len() - 1)
    };
    Ok(match expr {
        Expr::NumberLiteral(n) => Node::Number(n.val),
        Expr::Paren(p) => walk(&p.expr, leaves)?,
        Expr::Unary(u) => Node::Neg(Box::new(walk(&u.expr, leaves)?)),
        Expr::VectorSelector(vs) => push(selector(vs, Func::Last, LOOKBACK_MS, true)?),
        Expr::MatrixSelector(_) => {
            return Err(PromError::BadData(
                "a range vector is only supported inside a *_over_time function".into(),
            ));
        }
        Expr::Call(call) => {
            let Some(func) = Func::over_time(call.func.name) else {
                return Err(unsupported(format_args!("function {}", call.func.name)));
            };
            let [arg] = call.args.args.as_slice() else {
                return Err(PromError::BadData(format!(
                    "{} takes one range vector",
                    call.func.name
                )));
            };
            let Expr::MatrixSelector(ms) = arg.as_ref() else {
                return Err(unsupported(format_args!(
                    "{} of anything but a range selector (subqueries included)",
                    call.func.name
                )));
            };
            let range_ms = i64::try_from(ms.range.as_millis()).unwrap_or(i64::MAX / 4);
            push(selector(&ms.vs, func, range_ms, func == Func::Last)?)
        }
        Expr::Aggregate(a) => {
            let op = match a.op.id() {
                token::T_AVG => AggOp::Avg,
                token::T_SUM => AggOp::Sum,
                token::T_MIN => AggOp::Min,
                token::T_MAX => AggOp::Max,
                token::T_COUNT => AggOp::Count,
                _ => return Err(unsupported(format_args!("aggregation {}", a.op))),
            };
            let names = |l: &promql_parser::label::Labels| -> Vec<String> {
                l.labels.iter().map(|x| x.to_string()).collect()
            };
            let grouping = match &a.modifier {
                None => Grouping::By(Vec::new()),
                Some(LabelModifier::Include(l)) => Grouping::By(names(l)),
                Some(LabelModifier::Exclude(l)) => Grouping::Without(names(l)),
            };
            let inner = walk(&a.expr, leaves)?;
            if !is_vector(&inner) {
                return Err(PromError::BadData(format!(
                    "{} expects an instant vector, not a scalar",
                    a.op
                )));
            }
            Node::Aggregate {
                op,
                grouping,
                expr: Box::new(inner),
            }
        }
        Expr::Binary(b) => {
            let op = arith(b.op.id())
                .ok_or_else(|| unsupported(format_args!("the operator {}", b.op)))?;
            let lhs = walk(&b.lhs, leaves)?;
            let rhs = walk(&b.rhs, leaves)?;
            if is_vector(&lhs) && is_vector(&rhs) {
                return Err(unsupported("an operation between two vectors"));
            }
            if b.modifier.is_some() && (is_vector(&lhs) || is_vector(&rhs)) {
                return Err(unsupported(
                    "vector matching (on, ignoring, group_left, bool)",
                ));
            }
            Node::Arith {
                op,
                lhs: Box::new(lhs),
                rhs: Box::new(rhs),
            }
        }
        Expr::Subquery(_) => return Err(unsupported("a subquery")),
        Expr::StringLiteral(_) => return Err(unsupported("a string literal")),
        Expr::Extension(_) => return Err(unsupported("an extension")),
    })
}

fn arith(id: TokenId) -> Option<ArithOp> {
    Some(match id {
        token::T_ADD => ArithOp::Add,
        token::T_SUB => ArithOp::Sub,
        token::T_MUL => ArithOp::Mul,
        token::T_DIV => ArithOp::Div,
        token::T_MOD => ArithOp::Mod,
        token::T_POW => ArithOp::Pow,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(q: &str) -> String {
        match compile(q) {
            Err(PromError::BadData(m)) => m,
            other => panic!("{q}: {other:?}"),
        }
    }

    #[test]
    fn the_dashboard_subset_compiles() {
        for q in [
            "speed",
            r#"speed{sensor="x"}"#,
            r#"{__name__="odd.name", site=~"a|b"}"#,
            "avg_over_time(speed[5m])",
            "last_over_time(speed[1h] offset 5m)",
            "sum by (site) (avg_over_time(speed[1h]))",
            "count without (sensor) (speed)",
            "speed * 1.8 + 32",
            "1 + 1",
            "-speed",
            "2 ^ max(speed)",
        ] {
            compile(q).unwrap_or_else(|e| panic!("{q}: {e:?}"));
        }
    }

    #[test]
    fn unsupported_parts_are_named() {
        assert!(error("rate(speed[5m])").contains("function rate"));
        assert!(error("speed + speed").contains("two vectors"));
        assert!(error("speed > 3").contains("operator >"));
        assert!(error("topk(3, speed)").contains("aggregation topk"));
        assert!(error("speed[5m]").contains("range vector"));
        let e = error("avg_over_time(speed[5m:1m])");
        assert!(e.contains("subquer"), "{e}");
        assert!(error("speed @ 100").contains("@ modifier"));
        assert!(error("sum(1)").contains("scalar"));
        assert!(error("speed{").starts_with("parse error"));
    }

    #[test]
    fn selectors_carry_their_window() {
        let (_, leaves) = compile("max_over_time(speed[90s] offset 1m)").expect("compiles");
        assert_eq!(leaves[0].range_ms, 90_000);
        assert_eq!(leaves[0].offset_ms, 60_000);
        assert_eq!(leaves[0].func, Func::Max);
        assert!(!leaves[0].keep_name);
        assert!(
            leaves[0]
                .matchers
                .iter()
                .any(|m| m.name == "__name__" && m.value == "speed")
        );
        let (_, leaves) = compile("speed").expect("compiles");
        assert_eq!(leaves[0].range_ms, LOOKBACK_MS);
        assert!(leaves[0].keep_name);
    }
}
