//! Queries at the deepest `query.max_query_depth` allows, through the whole
//! path (limits, parse, compile, reads, evaluation, drop) on a thread with a
//! worker's stack: what stays recursive, the parser included, is safe there.

use super::error::PromError;
use super::limits::{DEPTH_CEILING, Limits, measure};
use super::memory::{Budget, Memory};
use super::value::{LabelSet, NAME};
use super::window::Steps;
use crate::domain::Sample;
use crate::runtime::WORKER_STACK_BYTES;

/// A shape's text at `n` levels.
type Shape = fn(usize) -> String;

/// Each shape at `n` levels.
const SHAPES: &[(&str, Shape)] = &[
    ("a chain of sums", |n| vec!["temp"; n].join(" + ")),
    ("a chain of powers (right-associative)", |n| {
        vec!["temp"; n].join(" ^ ")
    }),
    ("a chain of `or`", |n| vec!["temp"; n].join(" or ")),
    ("matched divisions", |n| {
        vec!["temp"; n].join(" / on (sensor) group_left ")
    }),
    ("parentheses", |n| {
        format!("{}temp{}", "(".repeat(n), ")".repeat(n))
    }),
    ("negations", |n| {
        format!("{}temp{}", "-(".repeat(n), ")".repeat(n))
    }),
    ("calls", |n| {
        format!("{}temp{}", "abs(".repeat(n), ")".repeat(n))
    }),
    ("calls with arguments", |n| {
        format!("{}temp{}", "clamp(".repeat(n), ", 0, 1e9)".repeat(n))
    }),
    ("label_replace", |n| {
        format!(
            "{}temp{}",
            "label_replace(".repeat(n),
            r#", "x", "$1", "sensor", "(.*)")"#.repeat(n)
        )
    }),
    ("aggregations", |n| {
        format!("{}temp{}", "sum by (sensor) (".repeat(n), ")".repeat(n))
    }),
    ("topk", |n| {
        format!("{}temp{}", "topk(2, ".repeat(n), ")".repeat(n))
    }),
    ("subqueries", |n| {
        let mut q = String::from("temp");
        for _ in 0..n {
            q = format!("max_over_time(({q})[5m:1m])");
        }
        q
    }),
];

/// The most levels of `shape` whose measured depth is within `depth`.
fn deepest(shape: Shape, depth: usize) -> String {
    let mut n = 1;
    while measure(&shape(n + 1), usize::MAX, usize::MAX).depth <= depth {
        n += 1;
    }
    shape(n)
}

fn memory() -> Memory {
    let series = ["a", "b"]
        .iter()
        .map(|sensor| {
            let labels: LabelSet = [
                (NAME.to_string(), "temp".to_string()),
                ("sensor".to_string(), (*sensor).to_string()),
            ]
            .into_iter()
            .collect();
            let samples = (0..200).map(|t| Sample { t: t * 15, v: 2.0 }).collect();
            (labels, samples)
        })
        .collect();
    Memory { series }
}

/// Runs `f` on a thread with a worker's stack (an overflow aborts the test).
fn on_a_worker_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(WORKER_STACK_BYTES)
        .spawn(f)
        .expect("a thread")
        .join()
        .expect("no panic")
}

#[test]
fn every_shape_at_the_depth_ceiling_evaluates_on_a_worker_stack() {
    for (name, shape) in SHAPES {
        let query = deepest(*shape, DEPTH_CEILING);
        let budget = Budget {
            limits: Limits {
                max_length: usize::MAX,
                max_depth: DEPTH_CEILING,
                max_nodes: usize::MAX,
                // The label_replace shape has a regex a level.
                max_regex_matchers: usize::MAX,
                ..Limits::default()
            },
            max_series: 10_000,
            max_samples: 100_000_000,
            max_range_ms: 400 * 86_400_000,
            max_memory: usize::MAX,
            deadline: None,
        };
        let answer = on_a_worker_stack(move || {
            memory()
                .evaluate(&query, Steps::new(2_400_000, 3_000_000, 60_000), &budget)
                .map(|o| o.value.kind())
        });
        assert!(answer.is_ok(), "{name}: {answer:?}");
    }
}

#[test]
fn one_level_more_than_the_limit_is_refused_before_parsing() {
    let limits = Limits::default();
    for (name, shape) in SHAPES {
        let query = shape(limits.max_depth + 1);
        let err = memory()
            .evaluate(
                &query,
                Steps::new(0, 0, 1),
                &Budget {
                    limits: Limits {
                        max_length: usize::MAX,
                        ..limits
                    },
                    max_series: 10,
                    max_samples: 1000,
                    max_range_ms: 86_400_000,
                    max_memory: usize::MAX,
                    deadline: None,
                },
            )
            .expect_err("refused");
        assert!(
            format!("{err}").contains("query.max_query_depth"),
            "{name}: {err}"
        );
    }
}

/// The issue's 15 KB query: each level multiplies a label's length, so the
/// third would ask for gigabytes. Refused before anything is built.
fn nested_replacements(first: usize, each: usize) -> String {
    format!(
        r#"label_replace(label_replace(label_replace(vector(1),"a","{}","",""),"a","{}","a","(.*)"),"a","{}","a","(.*)")"#,
        "x".repeat(first),
        "$1".repeat(each),
        "$1".repeat(each)
    )
}

fn label_budget(max_label_bytes: usize) -> Budget {
    Budget {
        limits: Limits {
            max_label_bytes,
            ..Limits::default()
        },
        max_series: 10,
        max_samples: 1000,
        max_range_ms: 86_400_000,
        max_memory: usize::MAX,
        deadline: None,
    }
}

#[test]
fn labels_a_function_would_build_past_the_limit_are_refused_before_they_are_built() {
    let query = nested_replacements(5000, 2500);
    assert!(
        query.len() <= Limits::default().max_length,
        "{}",
        query.len()
    );
    let err = memory()
        .evaluate(&query, Steps::new(0, 0, 1), &label_budget(16 * 1024))
        .expect_err("refused");
    assert!(matches!(err, PromError::Execution(_)), "{err:?}");
    assert!(format!("{err}").contains("query.max_label_bytes"), "{err}");
    let join = format!(
        r#"label_join(label_replace(vector(1),"a","{}","",""),"b","{}","a","a","a")"#,
        "x".repeat(4000),
        "-".repeat(2000)
    );
    let err = memory()
        .evaluate(&join, Steps::new(0, 0, 1), &label_budget(16 * 1024))
        .expect_err("refused");
    assert!(format!("{err}").contains("query.max_label_bytes"), "{err}");
}

#[test]
fn labels_within_the_limit_are_built_exactly() {
    // 10 x's, then 4 and 16 copies: 640 bytes, under a 700-byte limit.
    let query = nested_replacements(10, 4);
    let exact = memory()
        .evaluate(&query, Steps::new(0, 0, 1), &label_budget(700))
        .expect("answered");
    match exact.value {
        super::Value::Vector(v) => assert_eq!(v[0].labels["a"], "x".repeat(160)),
        other => panic!("{other:?}"),
    }
    // The bound before building counts each `$1` as the longest group: "a"
    // and 4 + 4 x 40 bytes at the last level, which 165 allows and 164 not.
    assert!(
        memory()
            .evaluate(&query, Steps::new(0, 0, 1), &label_budget(165))
            .is_ok()
    );
    assert!(
        memory()
            .evaluate(&query, Steps::new(0, 0, 1), &label_budget(164))
            .is_err()
    );
}
