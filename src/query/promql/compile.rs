//! A parsed expression checked against what Hourglass answers and turned
//! into a tree of [`Node`]s. Anything else is a `bad_data` error naming what
//! is not supported. Pure.

use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::token::{self, TokenId};
use promql_parser::parser::{
    self, AtModifier, Expr, LabelModifier, Offset, VectorMatchCardinality,
};

use super::ast::{
    AggOp, ArithOp, At, BinOp, Card, CmpOp, DEFAULT_SUBQUERY_STEP_MS, Func, Grouping, Matching,
    Node, RangeArg, RangeFunc, SUPPORTED, Selector, SetOp,
};
use super::error::PromError;
use super::limits::{self, Limits};

fn unsupported(what: impl std::fmt::Display) -> PromError {
    PromError::BadData(format!(
        "{what} is not supported by Hourglass; supported: {SUPPORTED}"
    ))
}

/// Parses `query` once it is within `limits` (the parser recurses).
pub fn parse(query: &str, limits: &Limits) -> Result<Expr, PromError> {
    parse_counted(query, limits, &mut 0)
}

/// [`parse`], adding the query's regex matchers to `regexes`: several
/// selectors of one request share `query.max_regex_matchers`.
pub fn parse_counted(query: &str, limits: &Limits, regexes: &mut usize) -> Result<Expr, PromError> {
    limits::check(query, limits)?;
    limits::check_tokens(query, regexes, limits)?;
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
    // A quoted name may hold anything ({"a.b"="x"}); the store keys labels
    // by name, so only Prometheus' classic names are taken.
    if let Some(bad) = vs.matchers.matchers.iter().find(|m| !label_name(&m.name)) {
        return Err(PromError::BadData(format!(
            "invalid label name {:?}: a label name is letters, digits and _, not starting with a digit",
            bad.name
        )));
    }
    let mut matchers = vs.matchers.matchers.clone();
    if let Some(name) = &vs.name
        && !matchers.iter().any(|m| m.name == "__name__")
    {
        matchers.push(Matcher::new(MatchOp::Equal, "__name__", name));
    }
    Ok(matchers)
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`.
fn label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
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
    super::limits::deep(|| walk_level(expr))
}

fn walk_level(expr: &Expr) -> Result<Node, PromError> {
    // Long: one arm per kind of node of the parsed tree.
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
    fn quoted_label_names_must_be_classic_names() {
        for q in [
            r#"{"a.b"="x"}"#,
            r#"m{"$where"="1"}"#,
            r#"m{"9a"=~".*"}"#,
            r#"m{""="x"}"#,
        ] {
            assert!(error(q).contains("invalid label name"), "{q}");
        }
        assert!(compile(r#"m{"site_2"="x"}"#, &Limits::default()).is_ok());
    }

    #[test]
    fn regex_matchers_are_counted_before_they_are_compiled() {
        let limits = Limits {
            max_regex_matchers: 3,
            ..Limits::default()
        };
        let q = |n: usize| {
            (0..n)
                .map(|i| format!(r#"m{{a=~"\\w{{0,200}}{i}"}}"#))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        assert!(compile(&q(3), &limits).is_ok());
        match compile(&q(4), &limits) {
            Err(PromError::BadData(m)) => assert!(m.contains("query.max_regex_matchers"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Shared by the selectors of one request.
        let mut regexes = 0;
        assert!(parse_counted(&q(2), &limits, &mut regexes).is_ok());
        assert!(parse_counted(&q(2), &limits, &mut regexes).is_err());
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
