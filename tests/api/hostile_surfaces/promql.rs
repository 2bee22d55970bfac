//! PromQL and the Prometheus listings: texts too long, too deep, too large
//! or wrong.

use super::cases::{Case, enc, form, get, nested};

/// PromQL texts that are too long, too deep, too large or wrong.
pub fn cases() -> Vec<Case> {
    let mut sub = String::from("temp");
    for _ in 0..2000 {
        sub = format!("max_over_time(({sub})[5m:1m])");
    }
    let alternation = (0..20_000)
        .map(|i| format!("s{i}"))
        .collect::<Vec<_>>()
        .join("|");
    let many_args = format!(
        "label_join(temp, \"x\", \",\", {})",
        vec!["\"a\""; 2100].join(", ")
    );
    let queries: Vec<(&str, String)> = vec![
        ("a 3 000-term sum", vec!["temp"; 3000].join("+")),
        ("a 600-term sum within the length", vec!["t"; 600].join("+")),
        ("5 000 nested parentheses", nested("(", "temp", ")", 5000)),
        ("abs nested 3 000 deep", nested("abs(", "temp", ")", 3000)),
        ("abs nested 300 deep", nested("abs(", "t", ")", 300)),
        ("subqueries nested 2 000 deep", sub),
        (
            "a 1 MiB query",
            format!("temp{{a=\"{}\"}}", "x".repeat(1 << 20)),
        ),
        (
            "a 20 000-way regex alternation",
            format!("temp{{sensor=~\"{alternation}\"}}"),
        ),
        ("2 100 arguments", many_args),
        (
            "aggregations nested 400 deep",
            nested("sum by (a) (", "t", ")", 400),
        ),
        ("negations nested 400 deep", nested("-(", "t", ")", 400)),
        (
            "a subquery of 34 million steps",
            "max_over_time(temp[400d:1s])".into(),
        ),
        ("a range past max_range", "rate(temp[1000d])".into()),
        ("a range no duration holds", "rate(temp[1e300])".into()),
        ("an offset no duration holds", "temp offset -Inf".into()),
        ("an invalid regex", r#"temp{sensor=~"("}"#.into()),
        (
            "a regex nested 300 deep",
            format!("temp{{sensor=~\"{}\"}}", nested("(", "a", ")", 300)),
        ),
        (
            "a regex that compiles too large",
            r#"temp{sensor=~"(((a{100}){100}){100})"}"#.into(),
        ),
        (
            "label_replace with an invalid regex",
            r#"label_replace(temp, "a", "$1", "sensor", "(")"#.into(),
        ),
        (
            "label_replace with a regex too large",
            r#"label_replace(temp, "a", "$1", "sensor", "(((a{100}){100}){100})")"#.into(),
        ),
        ("unbalanced parentheses", "sum(temp".into()),
        ("a NUL byte", "temp\u{0}".into()),
        ("an empty query", String::new()),
        ("an unknown function", "frobnicate(temp)".into()),
        ("a bare range vector", "temp[5m]".into()),
        ("a string answer", "\"abc\"".into()),
        ("a comment only", "# nothing".into()),
    ];
    let mut cases: Vec<Case> = queries
        .into_iter()
        .map(|(name, q)| {
            form(
                format!("PromQL: {name}"),
                "/prometheus/api/v1/query",
                &[("query", &q), ("time", "1700000000")],
            )
        })
        .collect();
    // Within every limit, but a million windows of a million points each:
    // cut off at its timeout.
    let mut bomb = form(
        "PromQL: a million windows of a million points",
        "/prometheus/api/v1/query",
        &[
            (
                "query",
                "max_over_time(max_over_time(vector(1)[12d:1s])[12d:1s])",
            ),
            ("timeout", "2s"),
        ],
    );
    bomb.timeout = true;
    cases.push(bomb);
    cases.push(get(
        "PromQL: invalid UTF-8",
        "/prometheus/api/v1/query?query=temp%FF%FE",
    ));
    for (name, params) in [
        ("a zero step", "start=0&end=100&step=0"),
        ("a negative step", "start=0&end=100&step=-5"),
        ("a billion points", "start=0&end=1000000000&step=1"),
        ("end before start", "start=100&end=0&step=1"),
        ("a NaN start", "start=NaN&end=100&step=1"),
        ("a start of 1e300", "start=1e300&end=1e301&step=1e299"),
        ("a garbage step", "start=0&end=100&step=%24gt"),
        ("a garbage timeout", "start=0&end=100&step=1&timeout=soon"),
    ] {
        cases.push(get(
            format!("PromQL range: {name}"),
            format!("/prometheus/api/v1/query_range?query=temp&{params}"),
        ));
    }
    // The Prometheus listings: their match[] selectors are parsed too.
    for (name, m) in [
        ("a deep match[]", nested("(", "temp", ")", 5000)),
        (
            "a long match[]",
            format!("temp{{a=\"{}\"}}", "x".repeat(40_000)),
        ),
        ("an expression as match[]", "sum(temp)".into()),
        ("an invalid match[] regex", r#"{sensor=~"(("}"#.into()),
    ] {
        cases.push(form(
            format!("Prometheus series: {name}"),
            "/prometheus/api/v1/series",
            &[("match[]", &m)],
        ));
        cases.push(get(
            format!("Prometheus label values: {name}"),
            format!("/prometheus/api/v1/label/sensor/values?match[]={}", enc(&m)),
        ));
    }
    cases.push(get(
        "Prometheus labels: a limit that is not a number",
        "/prometheus/api/v1/labels?limit=-1",
    ));
    cases.push(get(
        "Prometheus series: no match[]",
        "/prometheus/api/v1/series",
    ));
    cases
}
