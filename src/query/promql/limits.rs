//! What a PromQL text may be before anything recursive sees it.
//!
//! The parser (`promql-parser`), its checks, [`super::compile`], the
//! evaluation and the drop of each tree all recurse once per level of the
//! expression, on a worker's stack. So the text is measured first, in one
//! pass with a stack on the heap: its length in bytes, its depth and its
//! nodes, each against a `[query]` setting. The measures are upper bounds of
//! the parsed tree's (a property test holds them to it), so a text within
//! the limits parses into a tree within them.
//!
//! - **Nodes**: names, numbers, strings, operators and opening brackets. Each
//!   node of the tree (a selector, a literal, an operator, a call, an
//!   aggregation, parentheses, a range or subquery) begins at a token of its
//!   own, so the tree has at most as many.
//! - **Depth**: within one argument, a chain of `k` operators (a `[` range or
//!   subquery counts as one) over operands at most `d` deep is at most
//!   `k + d` deep, and brackets add one level to what they hold.

use super::error::PromError;

/// `[query]`'s limits on a PromQL text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes (`query.max_query_length`).
    pub max_length: usize,
    /// Levels (`query.max_query_depth`).
    pub max_depth: usize,
    /// Nodes (`query.max_query_nodes`).
    pub max_nodes: usize,
    /// Bytes of one series' labels when a function builds them
    /// (`label_replace`, `label_join`; `query.max_label_bytes`): checked
    /// before the value is built, so a short text cannot ask for gigabytes.
    pub max_label_bytes: usize,
    /// Regex matchers (`query.max_regex_matchers`), counted from the
    /// tokens before the parser compiles them.
    pub max_regex_matchers: usize,
}

/// The deepest tree the service is proven to handle on a worker's stack
/// (the `deep_queries` tests); `query.max_query_depth` may not exceed it.
pub const DEPTH_CEILING: usize = 1000;

impl Default for Limits {
    fn default() -> Self {
        Self {
            // VictoriaMetrics' -search.maxQueryLen.
            max_length: 16 * 1024,
            max_depth: 250,
            max_nodes: 2000,
            max_label_bytes: 16 * 1024,
            max_regex_matchers: 16,
        }
    }
}

/// A text's measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Measure {
    pub length: usize,
    pub depth: usize,
    pub nodes: usize,
}

/// One open bracket's argument being read.
#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    /// Parentheses hold expressions; `[` a range, `{` label matchers,
    /// which add no level of their own.
    parens: bool,
    /// The parenthesis (this frame or one below) whose argument this one
    /// is in, and how many are open up to it.
    home: usize,
    open: usize,
    /// Operators in the current argument.
    ops: usize,
    /// The deepest bracket closed in the current argument.
    child: usize,
    /// The deepest argument before it.
    best: usize,
}

impl Frame {
    fn argument(&self) -> usize {
        self.ops + self.child.max(1)
    }

    fn depth(&self) -> usize {
        self.best.max(self.argument())
    }
}

/// The longest duration a number may give (a range, a subquery's step or an
/// offset), in seconds: Prometheus' bound, what nanoseconds in an `i64` hold
/// (about 292 years).
pub const MAX_DURATION_SECONDS: f64 = 9_223_372_036.0;

/// Refuses a number given where a duration goes (`[1e300]`, `[5m:Inf]`,
/// `offset 0x1p99`) that no duration holds: the parser would turn it into a
/// `Duration` with a panic. Run after [`check`], so the text is short; the
/// lexer is the parser's own and loops, never recursing.
///
/// Also counts the regex matchers (`=~`, `!~`) and `label_replace` calls
/// into `regexes`: the parser compiles each matcher, at up to 10 MiB, and
/// the evaluation each call's expression ([`function_regex`]), so their
/// number is bounded before either runs ([`Limits::max_regex_matchers`]).
pub fn check_tokens(text: &str, regexes: &mut usize, limits: &Limits) -> Result<(), PromError> {
    use lrpar::{Lexeme, Lexer, NonStreamingLexer};
    use promql_parser::parser::{lexer, token};
    // What the lexer refuses, the parser reports.
    let Ok(lexer) = lexer(text) else {
        return Ok(());
    };
    let mut before = [None, None];
    for lexeme in lexer.iter().flatten() {
        let id = lexeme.tok_id();
        // label_replace's regular expression counts with the matchers'
        // (the name alone: a call has exactly one).
        let compiles = id == token::T_EQL_REGEX
            || id == token::T_NEQ_REGEX
            || (id == token::T_IDENTIFIER
                && lexer
                    .span_str(lexeme.span())
                    .eq_ignore_ascii_case("label_replace"));
        if compiles {
            *regexes += 1;
            if *regexes > limits.max_regex_matchers {
                return Err(PromError::BadData(format!(
                    "the request has more than {} regular-expression matchers (query.max_regex_matchers)",
                    limits.max_regex_matchers
                )));
            }
        }
        let duration_here = matches!(
            before,
            [
                _,
                Some(token::T_LEFT_BRACKET | token::T_COLON | token::T_OFFSET)
            ] | [Some(token::T_OFFSET), Some(token::T_ADD | token::T_SUB)]
        );
        if id == token::T_NUMBER && duration_here {
            let number = lexer.span_str(lexeme.span());
            if let Ok(seconds) = promql_parser::util::parse_str_radix(number)
                && !(0.0..=MAX_DURATION_SECONDS).contains(&seconds)
            {
                return Err(PromError::BadData(format!(
                    "the duration {number} is out of range: at most {MAX_DURATION_SECONDS} seconds"
                )));
            }
        }
        before = [before[1], Some(id)];
    }
    Ok(())
}

/// The most a function's regular expression may compile to (and its lazy
/// DFA's cache): a few milliseconds of work at worst.
pub const FUNCTION_REGEX_BYTES: usize = 1 << 20;

/// A function's regular expression (`label_replace`), anchored as
/// Prometheus anchors it, compiled within [`FUNCTION_REGEX_BYTES`].
pub fn function_regex(func: &str, regex: &str) -> Result<regex::Regex, PromError> {
    regex::RegexBuilder::new(&format!("^(?s:{regex})$"))
        .size_limit(FUNCTION_REGEX_BYTES)
        .dfa_size_limit(FUNCTION_REGEX_BYTES)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => PromError::Execution(format!(
                "the regular expression in {func}() compiles to more than {FUNCTION_REGEX_BYTES} bytes; simplify it"
            )),
            _ => PromError::Execution(format!(
                "invalid regular expression in {func}(): {regex}"
            )),
        })
}

/// Measures `text`, stopping as soon as a limit is passed (so the work is
/// bounded by the limits, not by the text).
pub fn check(text: &str, limits: &Limits) -> Result<Measure, PromError> {
    if text.len() > limits.max_length {
        return Err(PromError::BadData(format!(
            "the query is {} bytes long; at most {} are accepted (query.max_query_length)",
            text.len(),
            limits.max_length
        )));
    }
    let m = measure(text, limits.max_depth, limits.max_nodes);
    if m.depth > limits.max_depth {
        return Err(PromError::BadData(format!(
            "the query nests deeper than {} levels (query.max_query_depth)",
            limits.max_depth
        )));
    }
    if m.nodes > limits.max_nodes {
        return Err(PromError::BadData(format!(
            "the query has more than {} nodes (query.max_query_nodes)",
            limits.max_nodes
        )));
    }
    Ok(m)
}

/// The measures of `text`, or the first to pass `max_depth` or `max_nodes`.
pub fn measure(text: &str, max_depth: usize, max_nodes: usize) -> Measure {
    // Long: the tokenizer's one pass over the text, a state machine over its bytes.
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = vec![Frame {
        parens: true,
        ..Frame::default()
    }];
    let mut nodes = 0usize;
    let mut deepest = 0usize;
    let mut i = 0;
    let over = |depth: usize, nodes: usize| Measure {
        length: text.len(),
        depth,
        nodes,
    };
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' | b'\'' | b'`' => {
                nodes += 1;
                i = string_end(bytes, i);
            }
            b'(' | b'[' | b'{' => {
                nodes += 1;
                if b == b'['
                    && let Some(top) = stack.last_mut().filter(|f| f.parens)
                {
                    // A range or a subquery wraps what it follows.
                    top.ops += 1;
                }
                let parens = b == b'(';
                let (home, open) = match stack.last() {
                    Some(top) if parens => (stack.len(), top.open + 1),
                    Some(top) => (top.home, top.open),
                    None => (0, 0),
                };
                stack.push(Frame {
                    parens,
                    home,
                    open,
                    ..Frame::default()
                });
                i += 1;
            }
            b')' | b']' | b'}' => {
                // An unbalanced bracket is the parser's to report.
                if stack.len() > 1 {
                    close(&mut stack);
                }
                i += 1;
            }
            b',' => {
                if let Some(top) = stack.last_mut() {
                    top.best = top.best.max(top.argument());
                    top.ops = 0;
                    top.child = 0;
                }
                i += 1;
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'^' | b'=' | b'!' | b'<' | b'>' => {
                nodes += 1;
                if let Some(top) = stack.last_mut().filter(|f| f.parens) {
                    top.ops += 1;
                }
                // Two-character operators are one.
                i += 1;
                if i < bytes.len() && matches!(bytes[i], b'=' | b'~') {
                    i += 1;
                }
            }
            _ if b.is_ascii_alphanumeric() || b == b'_' || b == b':' || b == b'.' || b >= 0x80 => {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric()
                        || matches!(bytes[i], b'_' | b':' | b'.')
                        || bytes[i] >= 0x80)
                {
                    i += 1;
                }
                let word = &bytes[start..i];
                if word != b":" {
                    nodes += 1;
                }
                if is_keyword_operator(word)
                    && let Some(top) = stack.last_mut().filter(|f| f.parens)
                {
                    top.ops += 1;
                }
            }
            _ => {
                // Anything else (`@`, stray bytes) is a node at most.
                nodes += 1;
                i += 1;
            }
        }
        // Depth so far (a lower bound of the final one): every open
        // parenthesis adds a level to what it holds.
        if let Some(top) = stack.last() {
            let here = stack.get(top.home).map_or(0, Frame::argument);
            deepest = deepest.max(top.open + here);
        }
        if deepest > max_depth || nodes > max_nodes {
            return over(deepest, nodes);
        }
    }
    // Close what was left open: the parser refuses it, but it is measured.
    while stack.len() > 1 {
        close(&mut stack);
    }
    let depth = stack.last().map_or(0, Frame::depth).max(deepest);
    Measure {
        length: text.len(),
        depth,
        nodes,
    }
}

/// Pops the innermost bracket into the argument around it.
fn close(stack: &mut Vec<Frame>) {
    if let Some(inner) = stack.pop()
        && inner.parens
        && let Some(top) = stack.last_mut()
    {
        top.child = top.child.max(1 + inner.depth());
    }
}

/// Binary operators spelled as words.
fn is_keyword_operator(word: &[u8]) -> bool {
    [&b"and"[..], b"or", b"unless", b"atan2"]
        .iter()
        .any(|k| word.eq_ignore_ascii_case(k))
}

/// The index just past the string that opens at `start` (or the end).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quote != b'`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Runs one level of a recursive walk over a tree, on a fresh stack
/// segment when the current stack is nearly used up (as rustc does). The
/// limits keep trees small enough for any worker's stack, but a debug
/// build's frames are many times a release build's; this keeps both safe.
pub(crate) fn deep<R>(f: impl FnOnce() -> R) -> R {
    const RED_ZONE: usize = if cfg!(debug_assertions) {
        256 * 1024
    } else {
        64 * 1024
    };
    stacker::maybe_grow(RED_ZONE, 1024 * 1024, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use promql_parser::parser::{self, Expr};
    use proptest::prelude::*;

    fn m(q: &str) -> Measure {
        measure(q, usize::MAX, usize::MAX)
    }

    /// The parsed tree's depth and node count, recursively (small trees only).
    fn tree(e: &Expr) -> (usize, usize) {
        let kids: Vec<&Expr> = match e {
            Expr::Aggregate(a) => {
                let mut k = vec![a.expr.as_ref()];
                k.extend(a.param.as_deref());
                k
            }
            Expr::Unary(u) => vec![u.expr.as_ref()],
            Expr::Binary(b) => vec![b.lhs.as_ref(), b.rhs.as_ref()],
            Expr::Paren(p) => vec![p.expr.as_ref()],
            Expr::Subquery(s) => vec![s.expr.as_ref()],
            Expr::Call(c) => c.args.args.iter().map(|a| a.as_ref()).collect(),
            _ => Vec::new(),
        };
        let (mut depth, mut nodes) = (0, 1);
        for k in kids {
            let (d, n) = tree(k);
            depth = depth.max(d);
            nodes += n;
        }
        (depth + 1, nodes)
    }

    #[test]
    fn chains_and_brackets_are_measured_as_the_tree_is_deep() {
        assert_eq!(m("temp").depth, 1);
        assert_eq!(m("temp + temp + temp").depth, 3);
        assert_eq!(m("(temp)").depth, 2);
        assert_eq!(m("abs(abs(temp))").depth, 3);
        assert_eq!(m(r#"temp{site="a", x!~"b"}"#).depth, 1);
        assert_eq!(m(r#"sum by (site) (rate(temp{site="a"}[5m]))"#).depth, 4);
        assert_eq!(m("max_over_time((temp)[5m:1m])").depth, 4);
        assert_eq!(m("temp + temp + temp").nodes, 5);
        // Brackets inside strings and comments are not the query's.
        assert_eq!(m(r#"temp{a="((((("} # (((("#).depth, 1);
        assert_eq!(m(r#"temp{a='\'(('}"#).depth, 1);
    }

    #[test]
    fn each_limit_is_named_with_its_setting() {
        let limits = Limits {
            max_length: 100,
            max_depth: 5,
            max_nodes: 9,
            ..Limits::default()
        };
        let err = |q: &str| match check(q, &limits) {
            Err(PromError::BadData(m)) => m,
            other => panic!("{q}: {other:?}"),
        };
        assert!(err(&"a".repeat(101)).contains("query.max_query_length"));
        assert!(err("((((((a))))))").contains("query.max_query_depth"));
        assert!(err("a+a+a+a+a+a").contains("query.max_query_depth"));
        assert!(err("f(a,a,a,a,a,a,a,a)").contains("query.max_query_nodes"));
        assert!(check("sum(rate(a[5m]))", &limits).is_ok());
    }

    #[test]
    fn a_number_no_duration_holds_is_refused_where_a_duration_goes() {
        for q in [
            "rate(a[1e300])",
            "a offset Inf",
            "a offset NaN",
            "max_over_time(a[5m:1e30])",
            "a offset 1e300",
            "a offset -1e300",
            "a offset +Inf",
            "a[0x7fffffffffffffff]",
            "a offset 1e20",
            "a[9223372037]",
            "a[ 1e300 ]",
        ] {
            match check_tokens(q, &mut 0, &Limits::default()) {
                Err(PromError::BadData(m)) => assert!(m.contains("out of range"), "{q}: {m}"),
                other => panic!("{q}: {other:?}"),
            }
        }
        for q in [
            "rate(a[300])",
            "a offset 60",
            "a[5m:15]",
            "a * 1e300",
            "a @ 1e9",
            "a[5m] offset 1m",
        ] {
            assert!(check_tokens(q, &mut 0, &Limits::default()).is_ok(), "{q}");
            assert!(parser::parse(q).is_ok(), "{q}");
        }
    }

    #[test]
    fn a_long_text_is_measured_only_up_to_its_first_excess() {
        let q = "(".repeat(1_000_000);
        let got = measure(&q, 10, usize::MAX);
        assert_eq!((got.depth, got.nodes), (11, 10));
    }

    /// PromQL texts of every shape the measure must bound.
    fn expr() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("temp".to_string()),
            Just(r#"temp{site=~"a|(b)", x!="]"}"#.to_string()),
            Just("1.5".to_string()),
            Just("-2".to_string()),
            Just(r#""s""#.to_string()),
            Just("temp offset 5m".to_string()),
        ];
        leaf.prop_recursive(6, 64, 4, |inner| {
            prop_oneof![
                (inner.clone(), inner.clone(), 0..8usize).prop_map(|(a, b, o)| {
                    let op = ["+", "-", "*", "/", "and", "or", "> bool", "^"][o];
                    format!("{a} {op} {b}")
                }),
                inner.clone().prop_map(|a| format!("({a})")),
                inner.clone().prop_map(|a| format!("-{a}")),
                inner.clone().prop_map(|a| format!("abs({a})")),
                inner.clone().prop_map(|a| format!("sum by (site) ({a})")),
                inner
                    .clone()
                    .prop_map(|a| format!("max_over_time(({a})[5m:1m])")),
                (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("topk({a}, {b})")),
                (inner.clone(), inner).prop_map(|(a, b)| format!("{a} / on (site) group_left {b}")),
                Just("rate(temp[5m])".to_string()),
            ]
        })
    }

    proptest! {
        #[test]
        fn the_measures_bound_the_parsed_tree(q in expr()) {
            if let Ok(e) = parser::parse(&q) {
                let (depth, nodes) = tree(&e);
                let got = m(&q);
                prop_assert!(got.depth >= depth, "{q}: depth {} < {depth}", got.depth);
                prop_assert!(got.nodes >= nodes, "{q}: nodes {} < {nodes}", got.nodes);
            }
        }

        #[test]
        fn any_text_is_measured_without_a_panic(q in "\\PC{0,200}") {
            let _ = check(&q, &Limits::default());
        }
    }
}
