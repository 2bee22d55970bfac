//! PromQL built from a grammar: every function of the dictionary with
//! arguments of its types, aggregations with their parameters, binary
//! operators with matching and modifiers, subqueries, offsets and `@`, at
//! depths and numbers a hostile dashboard would try.

use crate::helpers::Gen;

/// What a function takes: `v` an instant vector, `m` a range vector, `s` a
/// scalar, `t` a string; a trailing `?` is optional.
const FUNCTIONS: &[(&str, &str)] = &[
    ("abs", "v"),
    ("absent", "v"),
    ("absent_over_time", "m"),
    ("ceil", "v"),
    ("changes", "m"),
    ("clamp", "vss"),
    ("clamp_max", "vs"),
    ("clamp_min", "vs"),
    ("day_of_month", "v?"),
    ("day_of_week", "v?"),
    ("days_in_month", "v?"),
    ("delta", "m"),
    ("deriv", "m"),
    ("exp", "v"),
    ("floor", "v"),
    ("histogram_quantile", "sv"),
    ("holt_winters", "mss"),
    ("hour", "v?"),
    ("idelta", "m"),
    ("increase", "m"),
    ("irate", "m"),
    ("label_join", "vttt"),
    ("label_replace", "vtttt"),
    ("ln", "v"),
    ("log2", "v"),
    ("log10", "v"),
    ("minute", "v?"),
    ("month", "v?"),
    ("predict_linear", "ms"),
    ("rate", "m"),
    ("resets", "m"),
    ("round", "vs?"),
    ("scalar", "v"),
    ("sgn", "v"),
    ("sort", "v"),
    ("sort_desc", "v"),
    ("sqrt", "v"),
    ("time", ""),
    ("timestamp", "v"),
    ("vector", "s"),
    ("year", "v?"),
    ("avg_over_time", "m"),
    ("min_over_time", "m"),
    ("max_over_time", "m"),
    ("sum_over_time", "m"),
    ("count_over_time", "m"),
    ("quantile_over_time", "sm"),
    ("stddev_over_time", "m"),
    ("stdvar_over_time", "m"),
    ("last_over_time", "m"),
    ("present_over_time", "m"),
    ("acos", "v"),
    ("cosh", "v"),
    ("sin", "v"),
    ("rad", "v"),
    ("pi", ""),
];

const AGGREGATIONS: &[&str] = &[
    "sum", "avg", "min", "max", "count", "stddev", "stdvar", "group",
];
const PARAMETRIC: &[&str] = &["topk", "bottomk", "quantile", "count_values"];
const OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless", "atan2",
];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "2",
    "10",
    "1e3",
    "1e9",
    "1e300",
    "-1e300",
    "1e-300",
    "NaN",
    "Inf",
    "-Inf",
    "0x7fffffff",
    "9223372036854775807",
    "5000",
    "100000",
];
const DURATIONS: &[&str] = &[
    "1ms", "1s", "15s", "1m", "5m", "1h", "1d", "1w", "1y", "0s", "1h30m", "100y", "292y",
    "9999999y",
];
const METRICS: &[&str] = &["temp", "humidity", "up", "x", "__h0"];
const LABELS: &[&str] = &["sensor", "site", "__name__", "job", "a0", "le"];
const STRINGS: &[&str] = &[
    "",
    "a",
    "h.*",
    ".*",
    "(.*)",
    "$1$1$1$1",
    "\\\\w{0,200}",
    "(a|b|c)+",
    "[",
    "x{1000}",
    "sensor",
    "\\\\d+",
];

/// One random PromQL expression of at most `depth` levels.
pub fn query(g: &mut Gen, depth: u32) -> String {
    let mut out = String::new();
    vector(g, depth, &mut out);
    // Now and then a text that is not quite PromQL.
    match g.below(20) {
        0 => out.truncate(g.below(out.len() as u64 + 1) as usize),
        1 => out.push_str(&"(".repeat(g.below(300) as usize)),
        _ => {}
    }
    // A cut may land inside a character; keep the text a string.
    while !out.is_char_boundary(out.len()) {
        out.pop();
    }
    out
}

fn selector(g: &mut Gen, out: &mut String) {
    let name = *g.pick(METRICS);
    out.push_str(name);
    if g.below(2) == 0 {
        out.push('{');
        for i in 0..g.below(4) {
            if i > 0 {
                out.push(',');
            }
            out.push_str(g.word(LABELS));
            out.push_str(g.word(&["=", "!=", "=~", "!~"]));
            out.push('"');
            out.push_str(g.word(STRINGS));
            out.push('"');
        }
        out.push('}');
    }
    modifiers(g, out);
}

fn modifiers(g: &mut Gen, out: &mut String) {
    match g.below(8) {
        0 => {
            out.push_str(" offset ");
            if g.below(3) == 0 {
                out.push('-');
            }
            out.push_str(g.word(DURATIONS));
        }
        1 => {
            out.push_str(" @ ");
            out.push_str(g.word(&[
                "start()",
                "end()",
                "0",
                "1e10",
                "-1e10",
                "1000003161",
                "1e300",
                "NaN",
            ]));
        }
        _ => {}
    }
}

fn scalar(g: &mut Gen, depth: u32, out: &mut String) {
    if depth == 0 || g.below(3) > 0 {
        out.push_str(g.word(NUMBERS));
        return;
    }
    match g.below(3) {
        0 => {
            out.push_str("scalar(");
            vector(g, depth - 1, out);
            out.push(')');
        }
        1 => out.push_str("time()"),
        _ => {
            scalar(g, depth - 1, out);
            out.push(' ');
            out.push_str(g.word(&["+", "-", "*", "/", "^", "%"]));
            out.push(' ');
            scalar(g, depth - 1, out);
        }
    }
}

fn matrix(g: &mut Gen, depth: u32, out: &mut String) {
    if depth == 0 || g.below(3) > 0 {
        selector(g, out);
        out.push('[');
        out.push_str(g.word(DURATIONS));
        out.push(']');
        return;
    }
    // A subquery over any vector expression.
    out.push('(');
    vector(g, depth - 1, out);
    out.push_str(")[");
    out.push_str(g.word(DURATIONS));
    out.push(':');
    if g.below(4) > 0 {
        out.push_str(g.word(DURATIONS));
    }
    out.push(']');
    modifiers(g, out);
}

fn vector(g: &mut Gen, depth: u32, out: &mut String) {
    if depth == 0 {
        selector(g, out);
        return;
    }
    match g.below(6) {
        0 => selector(g, out),
        1 | 2 => {
            let (name, args) = *g.pick(FUNCTIONS);
            out.push_str(name);
            out.push('(');
            let optional = args.ends_with('?');
            let kinds = args.trim_end_matches('?');
            let take = if optional && g.below(2) == 0 {
                kinds.len() - 1
            } else {
                kinds.len()
            };
            for (i, kind) in kinds.chars().take(take).enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match kind {
                    'v' => vector(g, depth - 1, out),
                    'm' => matrix(g, depth - 1, out),
                    's' => scalar(g, depth - 1, out),
                    _ => {
                        out.push('"');
                        out.push_str(if g.below(2) == 0 {
                            g.word(LABELS)
                        } else {
                            g.word(STRINGS)
                        });
                        out.push('"');
                    }
                }
            }
            out.push(')');
        }
        3 => {
            if g.below(2) == 0 {
                out.push_str(g.word(AGGREGATIONS));
                out.push('(');
            } else {
                let op = *g.pick(PARAMETRIC);
                out.push_str(op);
                out.push('(');
                if op == "count_values" {
                    out.push('"');
                    out.push_str(g.word(LABELS));
                    out.push('"');
                } else {
                    scalar(g, depth - 1, out);
                }
                out.push_str(", ");
            }
            vector(g, depth - 1, out);
            out.push(')');
            if g.below(3) == 0 {
                out.push_str(g.word(&[" by (", " without ("]));
                out.push_str(g.word(LABELS));
                out.push(')');
            }
        }
        4 => {
            vector(g, depth - 1, out);
            out.push(' ');
            out.push_str(g.word(OPERATORS));
            if g.below(4) == 0 {
                out.push_str(" bool");
            }
            if g.below(5) == 0 {
                out.push_str(g.word(&[" on (", " ignoring ("]));
                out.push_str(g.word(LABELS));
                out.push(')');
                if g.below(2) == 0 {
                    out.push_str(g.word(&[" group_left", " group_right"]));
                }
            }
            out.push(' ');
            if g.below(3) == 0 {
                scalar(g, depth - 1, out);
            } else {
                vector(g, depth - 1, out);
            }
        }
        _ => {
            out.push('(');
            vector(g, depth - 1, out);
            out.push(')');
        }
    }
}
