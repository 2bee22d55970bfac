//! The storage server against an independent evaluation, for every command
//! shape the service sends.
//!
//! A workload drives the service through everything that reaches storage
//! (ingest at both granularities, wide and narrow flushes, late writes,
//! labels, every query route, PromQL, rebuilds, dead letters) with the
//! server's profiler on. Every command it sent is read back from
//! `system.profile` and grouped by shape (the command with its values
//! replaced by their types). Then:
//! - every read (`find`) is run again and its answer compared with a
//!   brute-force evaluation of the same filter, projection, sort and limit
//!   over all documents of the collection, read by a plain scan;
//! - every write (`update`, `insert`, `findAndModify`, `aggregate` with
//!   `$merge`) is judged by what it left: buckets whose aggregates equal
//!   their values and whose values equal what was written, rollups equal to
//!   their buckets, a registry that knows every series and label, the
//!   dead letters that were due;
//! - a command of a kind not listed here fails the test, so a new shape
//!   cannot go unchecked.
//!
//! A divergence names the shape. The stand-in's known divergences are
//! listed in docs/src/operating/storage-server.md beside it. The same test runs against a real
//! MongoDB (`MONGODB_URI`), whose profiler records the same commands.

mod evaluate;
mod shapes;
mod workload;

pub use shapes::{FRAMING, Sent};

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hourglass::Granularity;
use mongodb::bson::{Bson, doc};
use serde_json::json;

use crate::helpers::*;
use crate::rollup_checks::assert_rollups_match_buckets;

use evaluate::{Scans, check_entry_count, check_find};
use shapes::sent;
use workload::{conformance_settings, profiled, rebuilds, workload};

/// The write shapes sent so far (named when what they left is wrong).
async fn write_shapes(db: &mongodb::Database) -> String {
    let shapes: BTreeSet<String> = sent(db)
        .await
        .iter()
        .filter(|s| {
            matches!(
                s.kind.as_str(),
                "update" | "insert" | "findAndModify" | "aggregate" | "delete"
            )
        })
        .map(Sent::shape)
        .collect();
    shapes.into_iter().collect::<Vec<_>>().join("\n  ")
}

/// What the writes left: buckets exact and equal to what was written,
/// rollups equal to their buckets, a registry with every series and label,
/// the one dead letter. A failure names the write shapes sent.
async fn check_writes(
    app: &TestApp,
    db: &mongodb::Database,
    g: Granularity,
    truth: &BTreeMap<(String, String, i64), f64>,
    when: &str,
) {
    let docs = app.buckets().await;
    let outcome = std::panic::AssertUnwindSafe(async {
        assert_invariants(&docs, g);
        assert_eq!(
            &all_values(&docs, g),
            truth,
            "buckets against what was written"
        );
        assert_rollups_match_buckets(app, g).await;
        let want: BTreeSet<(String, String)> = truth
            .keys()
            .map(|(s, m, _)| (s.clone(), m.clone()))
            .collect();
        // The registrar runs beside the flushes: on a loaded machine it
        // may register a series a moment after its buckets are stored.
        eventually(
            Duration::from_secs(30),
            "the registry knows every series",
            || async {
                let listed = app.get_json("/api/v1/sensors?prefix=c-&limit=1000").await;
                let mut series: BTreeSet<(String, String)> = BTreeSet::new();
                for s in listed["sensors"].as_array().expect("sensors") {
                    for m in s["metrics"].as_array().expect("metrics") {
                        series.insert((
                            s["sensor"].as_str().expect("id").to_owned(),
                            m.as_str().expect("metric").to_owned(),
                        ));
                    }
                }
                want.is_subset(&series)
            },
        )
        .await;
        let c07 = app.get_json("/api/v1/sensors?prefix=c-07").await;
        assert_eq!(c07["sensors"][0]["labels"], json!({ "room": "r1" }));
        let c01 = app.get_json("/api/v1/sensors?prefix=c-01").await;
        assert_eq!(c01["sensors"][0]["labels"], json!({ "site": "south" }));
        let dead = app
            .documents(
                &app.settings.mongodb.dead_letter_collection,
                doc! { "sensor": 1 },
            )
            .await;
        assert_eq!(dead.len(), 1, "one dead letter: {dead:?}");
    });
    if let Err(e) = futures_util::FutureExt::catch_unwind(outcome).await {
        let message = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        panic!(
            "{when}: {message}\nthe write shapes sent:\n  {}",
            write_shapes(db).await
        );
    }
}

async fn conforms(g: Granularity) {
    let settings = conformance_settings(g);
    let Some(db) = profiled(&settings).await else {
        return;
    };
    let app = spawn_app_with(settings).await;
    let truth = workload(&app, g).await;
    // The test's own reads are not the service's: profiling is off for them.
    let profile = |level: i32| {
        let db = db.clone();
        async move {
            db.run_command(doc! { "profile": level })
                .await
                .expect("profiling set");
        }
    };
    profile(0).await;
    check_writes(&app, &db, g, &truth, "after the flushes").await;
    // What the service sent; the rebuilds below are an operator's command.
    let mut service: BTreeMap<String, Vec<Sent>> = BTreeMap::new();
    for s in sent(&db).await {
        service.entry(s.shape()).or_default().push(s);
    }
    profile(2).await;
    rebuilds(&app).await;
    profile(0).await;
    check_writes(&app, &db, g, &truth, "after the rebuilds").await;
    app.stop().await.expect("clean stop");

    let all = sent(&db).await;
    let mut by_shape: BTreeMap<String, Vec<Sent>> = BTreeMap::new();
    for s in all {
        by_shape.entry(s.shape()).or_default().push(s);
    }
    if std::env::var_os("CONFORMANCE_SHAPES").is_some() {
        for (shape, commands) in &by_shape {
            eprintln!("{:>6} × {shape}", commands.len());
        }
    }
    let mut failures = Vec::new();
    let mut scans = Scans::default();
    for (shape, commands) in &by_shape {
        let kind = commands[0].kind.as_str();
        match kind {
            "find" => {
                // The first, last and a few between: each against the evaluator.
                let step = (commands.len() / 8).max(1);
                for s in commands.iter().step_by(step).chain(commands.last()) {
                    if let Some(diff) = check_find(&db, &mut scans, s, shape).await {
                        failures.push(format!("{shape}\n  {diff}\n  command: {}", s.command));
                        break;
                    }
                }
            }
            // Judged by what they left, above.
            "update" | "insert" | "findAndModify" | "delete" => {}
            "aggregate" => {
                let pipeline = commands[0]
                    .command
                    .get_array("pipeline")
                    .expect("a pipeline");
                let merges = pipeline
                    .last()
                    .and_then(Bson::as_document)
                    .is_some_and(|s| s.contains_key("$merge"));
                if !merges {
                    assert!(
                        shape.contains("$objectToArray"),
                        "an aggregation that reads is not checked yet: {shape}"
                    );
                    if let Some(diff) = check_entry_count(&db, &commands[0]).await {
                        failures.push(format!("{shape}\n  {diff}"));
                    }
                }
            }
            // Indexes and their settings: checked by what queries answer.
            "createIndexes" | "listIndexes" | "collMod" | "dropIndexes" | "killCursors" => {}
            // The startup's probes of what the server answers from its
            // indexes (see `store::mongo::shapes`): plans and a scratch
            // collection, no data.
            "explain" | "drop" => {}
            // The collections, created with their block compressor: checked
            // by what `listCollections` answers (`buckets.rs`).
            "create" | "listCollections" => {}
            other => failures.push(format!(
                "a command this suite does not check: {other} ({shape})"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "shapes the server answers differently from the evaluation:\n{}",
        failures.join("\n\n")
    );
    let unbounded = crate::plans::check(&db, &service, g, &conformance_settings(g)).await;
    assert!(
        unbounded.is_empty(),
        "shapes that examine more than they return over a long history:\n{}",
        unbounded.join("\n\n")
    );
}

#[tokio::test]
async fn every_command_shape_conforms_to_an_independent_evaluation_with_minute_buckets() {
    conforms(Granularity::Minute).await;
}

#[tokio::test]
async fn every_command_shape_conforms_to_an_independent_evaluation_with_hour_buckets() {
    conforms(Granularity::Hour).await;
}
