//! A short run of every subcommand against the local stack, so the tool cannot
//! rot: seconds of small data, and each run must verify exactly.

use std::process::Command;

fn loadtest(args: &[&str]) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let bin =
        std::env::var("HOURGLASS_BIN").unwrap_or_else(|_| format!("{root}/target/debug/hourglass"));
    assert!(
        std::path::Path::new(&bin).exists(),
        "{bin} is missing: `cargo build` (make test does)"
    );
    let results = tempfile::tempdir().expect("temp dir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass-loadtest"));
    if let Some(uri) = standin_uri() {
        cmd.env("MONGODB_URI", uri);
    }
    let out = cmd
        .args(["--quiet", "--json", "--results-dir"])
        .arg(results.path())
        .args(["--hourglass-bin", &bin])
        .args(args)
        // Inherited by the service: the journaled fleet's buckets are written
        // a second after their readings rather than after their minute.
        .env("HOURGLASS__BATCHER__MAX_HOLD", "1s")
        .output()
        .expect("the loadtest runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    let name = std::fs::read_dir(results.path())
        .expect("a results dir")
        .next()
        .expect("one report")
        .expect("entry");
    assert!(name.path().join("report.md").exists() && name.path().join("report.json").exists());
    report.to_string()
}

/// One of the stand-ins `make test` starts (`MONGODB_URIS`), by this
/// test's nextest slot as the service's tests choose theirs
/// (tests/api/support/helpers.rs); none without that list (`MONGODB_URI` then).
fn standin_uri() -> Option<String> {
    let list = std::env::var("MONGODB_URIS").unwrap_or_default();
    let uris: Vec<&str> = list.split_whitespace().collect();
    let slot = std::env::var("NEXTEST_TEST_GLOBAL_SLOT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(std::process::id() as usize);
    uris.get(slot % uris.len().max(1))
        .map(|uri| (*uri).to_owned())
}

const SMALL: &[&str] = &["--sensors", "2", "--metrics", "2", "--seconds", "120"];

fn with(cmd: &str, extra: &[&str]) -> Vec<String> {
    let mut v = vec![cmd.to_owned()];
    v.extend(SMALL.iter().map(|s| (*s).to_owned()));
    v.extend(extra.iter().map(|s| (*s).to_owned()));
    v
}

fn run(cmd: &str, extra: &[&str]) -> serde_json::Value {
    let args = with(cmd, extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    serde_json::from_str(&loadtest(&refs)).expect("json")
}

#[test]
fn backfill_stores_and_verifies_exactly() {
    let r = run("backfill", &["--batch", "100"]);
    assert_eq!(r["data"]["verify"]["exact"], true, "{r}");
    assert_eq!(r["data"]["backfill"]["readings"], 480);
    // The averages were timed 5 s after stored and settled, and the upkeep
    // rolled the backfilled hours up.
    let averages = r["data"]["backfill_averages"]
        .as_object()
        .expect("averages");
    assert!(!averages.is_empty(), "{r}");
    assert!(
        r["data"]["backfill_catch_up"]["series_hours_rolled_up"].as_f64() > Some(0.0),
        "{r}"
    );
}

#[test]
fn fleet_over_http_and_mqtt_verifies_exactly_with_and_without_the_journal() {
    for (transport, journal) in [("http", "on"), ("mqtt", "on"), ("http", "off")] {
        let mut args = vec![
            "--transport",
            transport,
            "--sensors",
            "2",
            "--metrics",
            "1",
            "--seconds",
            "3",
        ];
        if journal == "off" {
            args.push("--no-journal");
        }
        let report: serde_json::Value =
            serde_json::from_str(&loadtest(&[&["fleet"], &args[..]].concat())).expect("json");
        assert_eq!(
            report["data"]["verify"]["exact"], true,
            "{transport}, journal {journal}: {report}"
        );
    }
}

#[test]
fn two_instances_round_robin_verify_exactly_and_count_every_write() {
    let r: serde_json::Value = serde_json::from_str(&loadtest(&[
        "versions",
        "--sensors",
        "4",
        "--metrics",
        "1",
        "--seconds",
        "3",
        "--no-prune",
    ]))
    .expect("json");
    let v = &r["data"]["versions_minute"];
    assert_eq!(v["exact"], true, "{r}");
    assert_eq!(v["written"]["values"], 12, "{r}");
    assert!(
        v["documents_written"]["bucket_update"].as_f64() >= Some(1.0),
        "{r}"
    );
}

#[test]
fn import_and_export_store_and_verify_exactly_beside_the_http_path() {
    let r = run("transfer", &["--rounds", "1"]);
    let runs = r["data"]["transfer"].as_array().expect("runs");
    assert_eq!(runs.len(), 5, "{r}");
    assert!(
        runs.iter()
            .all(|x| x["readings_per_s"].as_f64() > Some(0.0)),
        "{r}"
    );
}

#[test]
fn queries_report_latency_per_kind() {
    let r = run("query", &["--queries", "8"]);
    assert_eq!(
        r["data"]["queries"].as_object().map(|o| o.len()),
        Some(4),
        "{r}"
    );
}

#[test]
fn compare_designs_reports_all_three_designs() {
    let r = run("compare-designs", &["--batch", "200"]);
    let designs = r["data"]["designs"].as_array().expect("designs");
    assert_eq!(designs.len(), 3);
    let writes = |i: usize| designs[i]["writes_per_reading"].as_f64().expect("number");
    assert_eq!(writes(0), 1.0, "one write per reading in the naive design");
    assert!(writes(1) < writes(0) && writes(2) <= writes(1), "{r}");
}

#[test]
fn peers_runs_victoria_metrics_and_influxdb_next_to_hourglass() {
    let r = run("peers", &["--idle-seconds", "1"]);
    let peers = r["data"]["peers"].as_array().expect("peers");
    assert_eq!(peers.len(), 5, "{r}");
    assert!(
        peers
            .iter()
            .all(|p| p["readings_per_s"].as_f64().is_some_and(|x| x > 0.0))
    );
    // JSON and line protocol store the same readings.
    let (json, lp) = (&peers[2]["avg_1h_answer"], &peers[3]["avg_1h_answer"]);
    assert!(json[0].as_u64().is_some_and(|n| n > 0), "{r}");
    assert_eq!(json, lp, "{r}");
    assert_eq!(json, &peers[4]["avg_1h_answer"], "journaled: {r}");
    // Each system's CPU until settled counts its CPU until its last answer
    // and what it did after; Hourglass' runs until stored already.
    for p in peers {
        let (answered, settled) = (
            p["cpu_s_per_million"].as_f64(),
            p["settled_cpu_s_per_million"].as_f64(),
        );
        assert!(
            settled.is_some_and(|s| answered.is_some_and(|a| a > 0.0 && s >= a)),
            "{r}"
        );
    }
    assert_eq!(
        peers[2]["settled_cpu_s_per_million"],
        peers[2]["cpu_s_per_million"]
    );
    // Hourglass' CPU inside the MongoDB driver is told apart, and is part of its CPU.
    for p in &peers[2..] {
        let (all, driver) = (
            p["cpu_s_per_million"].as_f64(),
            p["driver_cpu_s_per_million"].as_f64(),
        );
        assert!(
            driver.is_some_and(|d| d > 0.0 && all.is_some_and(|a| d < a)),
            "{r}"
        );
    }
}

#[test]
fn ranges_answer_long_averages_exactly() {
    let args = [
        "ranges",
        "--days",
        "1",
        "--repeats",
        "1",
        "--fleet-sensors",
        "3",
    ];
    let r: serde_json::Value = serde_json::from_str(&loadtest(&args)).expect("json");
    assert_eq!(r["data"]["ranges"]["average_1d"]["exact"], true, "{r}");
    assert_eq!(
        r["data"]["ranges"]["time_weighted_1d"]["exact"], true,
        "{r}"
    );
    // Reported by exception: whole slots, by the hour, reading by reading.
    for limit in ["1d", "1h", "15m"] {
        let key = format!("exception_time_weighted_1d_{limit}");
        assert_eq!(r["data"]["ranges"][&key]["exact"], true, "{key}: {r}");
    }
    // Percentiles from sketches, within their accuracy of the exact ones.
    for key in ["quantiles_1d", "exception_quantiles_1d"] {
        assert_eq!(
            r["data"]["ranges"][key]["within_accuracy"], true,
            "{key}: {r}"
        );
    }
    assert_eq!(
        r["data"]["ranges"]["group average 6h over the fleet"]["exact"], true,
        "{r}"
    );
    for query in ["average_1d", "group_average_6h_over_the_fleet"] {
        let peers = &r["data"]["ranges"]["peers"][query];
        assert_eq!(peers["victoria_metrics"]["agrees"], true, "{query}: {r}");
        assert_eq!(peers["influxdb"]["agrees"], true, "{query}: {r}");
    }
}

#[test]
fn history_measures_write_cost_and_fleet_panels_cold_and_on_refresh() {
    let args = [
        "history",
        "--long-history",
        "500",
        "--panel-sensors",
        "3",
        "--group-sensors",
        "3",
        "--repeats",
        "1",
    ];
    let r: serde_json::Value = serde_json::from_str(&loadtest(&args)).expect("json");
    // The statement's filter examines its one bucket whatever the history.
    assert_eq!(r["data"]["write_cost"]["long_examined"], 1, "{r}");
    // Every panel was answered (the run fails when a refresh differs
    // from its cold answer) and read something.
    let mut panels = r["data"]["history"].as_object().expect("panels").clone();
    // The upkeep's catch-up after the panels' backfill: it rolled up what
    // the backfill wrote, and none was left marked.
    let catch_up = panels.remove("catch_up").expect("the catch-up");
    assert!(
        catch_up["series_hours_rolled_up"].as_f64() > Some(0.0),
        "{r}"
    );
    // The same backfill with a dashboard refreshing over it, measured (at
    // this size its hours may be rolled up before the gauge first counts
    // them, so what it rolled up is not asserted).
    let refreshed = panels
        .remove("catch_up_refreshed")
        .expect("the catch-up with a dashboard");
    assert!(
        refreshed["refreshed"]["seconds_from_first_request"].as_f64() > Some(0.0),
        "{r}"
    );
    assert!(refreshed["panels"]["rounds"].as_f64().is_some(), "{r}");
    assert_eq!(panels.len(), 6, "{r}");
    assert!(
        panels.values().all(|p| p["documents"].as_f64() > Some(0.0)),
        "{r}"
    );
    // Each panel was also timed 5 s after the backfill was stored.
    assert!(
        panels
            .iter()
            .filter(|(k, _)| *k != "group_average")
            .all(|(_, p)| p["after_stored"]["documents"].as_f64() > Some(0.0)),
        "{r}"
    );
}

#[test]
fn promql_answers_like_prometheus_next_to_victoria_metrics() {
    let args = ["promql", "--sensors", "2", "--days", "2", "--repeats", "1"];
    let r: serde_json::Value = serde_json::from_str(&loadtest(&args)).expect("json");
    let rows = r["data"]["promql"].as_object().expect("rows");
    assert_eq!(rows.len(), 4, "{r}");
    assert!(
        rows.values().all(|q| q["same_as_prometheus"] == true),
        "{r}"
    );
}

#[test]
fn verify_finds_a_dataset_that_was_never_sent() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass-loadtest"));
    if let Some(uri) = standin_uri() {
        cmd.env("MONGODB_URI", uri);
    }
    let out = cmd
        .args([
            "--quiet",
            "--no-files",
            "--database",
            "lt_never_written",
            "verify",
            "--sensors",
            "1",
            "--metrics",
            "1",
            "--seconds",
            "60",
            "--start",
            "1700000000",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success(), "missing data must fail verify");
    assert!(String::from_utf8_lossy(&out.stdout).contains("MISMATCH"));
}

#[test]
fn storage_sizes_every_collection_beside_the_per_event_design_and_the_peers() {
    let r: serde_json::Value = serde_json::from_str(&loadtest(&[
        "storage",
        "--sensors",
        "2",
        "--seconds",
        "7200",
        "--intervals",
        "60",
        "--granularities",
        "minute,hour",
    ]))
    .expect("json");
    for g in ["minute", "hour"] {
        let s = &r["data"][format!("storage_60s_{g}")];
        assert_eq!(s["readings"], 240, "{r}");
        let (buckets, rollups) = (
            s["buckets_bson_per_reading"].as_f64().expect("buckets"),
            s["rollups_bson_per_reading"].as_f64().expect("rollups"),
        );
        assert!(
            buckets > 0.0 && rollups > 0.0 && rollups < 0.3 * buckets,
            "{g}: {s}"
        );
        let (bson, snappy, zstd) = (
            s["bson_per_reading"].as_f64().expect("bson"),
            s["snappy_per_reading"].as_f64().expect("snappy"),
            s["zstd_per_reading"].as_f64().expect("zstd"),
        );
        assert!(
            bson >= buckets + rollups && snappy < bson && zstd < bson,
            "{g}: {s}"
        );
    }
    let peers = &r["data"]["storage_60s_peers"];
    assert!(
        peers["per_event_bson_per_reading"].as_f64() > Some(60.0),
        "{r}"
    );
    assert!(
        peers["victoria_metrics_per_reading"].as_f64() > Some(0.0),
        "{r}"
    );
    assert!(peers["influxdb_per_reading"].as_f64() > Some(0.0), "{r}");
}
