//! Identities are validated once, by type, and every write is authorised,
//! labels included: a device token's refused lines relabel nothing and
//! create nothing; a label write that creates a registry entry passes the
//! new-series guard; a Sparkplug birth whose ids no sensor id or label can
//! hold gets no state; and a registry document that does not decode costs
//! only itself, never a listing.

use std::time::Duration;

use mongodb::bson::doc;
use serde_json::{Value, json};

use crate::auth::{TRUCK, secured};
use crate::broker::{Broker, Publisher};
use crate::helpers::*;
use crate::mqtt::mqtt_settings;

async fn write_lp(app: &TestApp, token: &str, body: &str) -> (u16, String) {
    let r = app
        .client
        .post(format!("{}/api/v2/write?bucket=b&precision=s", app.address))
        .bearer_auth(token)
        .body(body.to_owned())
        .send()
        .await
        .expect("an answer");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

async fn registry(app: &TestApp) -> Vec<Value> {
    let mut r = app
        .client
        .get(format!("{}/api/v1/sensors?limit=1000", app.address));
    if app.settings.auth.enabled {
        r = r.bearer_auth(crate::auth::DASHBOARD);
    }
    let v: Value = r.send().await.expect("sent").json().await.expect("JSON");
    v["sensors"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_device_tokens_refused_lines_relabel_nothing_and_create_no_sensor() {
    let app = spawn_app_with(secured()).await;
    let t = base_time();
    // Another token's sensor exists with its own labels.
    let r = app
        .client
        .post(format!("{}/api/v1/readings", app.address))
        .bearer_auth(crate::auth::INGESTER)
        .json(&reading("truck-18", "temp", t, 1.0))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    // The body: both lines refused (epoch 1 is outside the window).
    let (status, body) = write_lp(
        &app,
        TRUCK,
        "temp,sensor=truck-18,site=hacked value=1 1\ntemp,sensor=not-mine-42,owner=truck17 value=1 1",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // Relatives: a line of only string fields for a stranger (taken, no
    // reading), and a valid line for a stranger (403, refused whole).
    let (status, body) = write_lp(&app, TRUCK, "note,sensor=not-mine-43,site=x text=\"a\"").await;
    assert!(status == 204 || status == 400, "{status} {body}");
    let (status, body) = write_lp(
        &app,
        TRUCK,
        &format!("temp,sensor=truck-18,site=hacked value=2 {t}\ntemp,sensor=truck-17,site=mine value=3 {t}"),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // Its own sensor's labels are its to write.
    let (status, body) = write_lp(
        &app,
        TRUCK,
        &format!("temp,sensor=truck-17,site=depot value=4 {t}"),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    eventually(
        Duration::from_secs(60),
        "truck-17's label is recorded",
        || async {
            registry(&app)
                .await
                .iter()
                .any(|s| s["sensor"] == "truck-17" && s["labels"]["site"] == "depot")
        },
    )
    .await;
    let sensors = registry(&app).await;
    let ids: Vec<&str> = sensors
        .iter()
        .filter_map(|s| s["sensor"].as_str())
        .collect();
    assert!(
        !ids.iter().any(|i| i.starts_with("not-mine")),
        "no sensor was created by a refused line: {ids:?}"
    );
    let other = sensors
        .iter()
        .find(|s| s["sensor"] == "truck-18")
        .expect("truck-18 listed");
    assert!(
        other["labels"].get("site").is_none(),
        "truck-18 was relabelled: {other}"
    );
    let docs = app.documents("sensors", doc! { "_id": 1 }).await;
    assert!(
        docs.iter().all(|d| d
            .get_document("labels")
            .map_or(true, |l| !l.contains_key("owner"))),
        "{docs:?}"
    );
}

#[tokio::test]
async fn a_label_write_that_creates_a_registry_entry_passes_the_new_series_guard() {
    let mut settings = test_settings();
    settings.cardinality.max_new_series_per_hour = 20;
    let app = spawn_app_with(settings).await;
    eventually(Duration::from_secs(60), "the guard is seeded", || async {
        app.metric("hourglass_new_series_guard_seeded").await == 1.0
    })
    .await;
    let mut taken = 0;
    let mut refused = 0;
    for i in 0..40 {
        let r = app
            .client
            .put(format!("{}/api/v1/sensors/fresh-{i}/labels", app.address))
            .json(&json!({ "site": "x" }))
            .send()
            .await
            .expect("sent");
        match r.status().as_u16() {
            204 => taken += 1,
            429 => {
                refused += 1;
                let body = r.text().await.unwrap_or_default();
                assert!(
                    body.contains("cardinality.max_new_series_per_hour"),
                    "{body}"
                );
            }
            other => panic!("{other}: {}", r.text().await.unwrap_or_default()),
        }
    }
    assert_eq!((taken, refused), (20, 20));
    assert_eq!(registry(&app).await.len(), 20);
    assert_eq!(app.metric("hourglass_new_series_total").await, 20.0);
    // Relabelling a sensor that exists is not new.
    let r = app
        .client
        .put(format!("{}/api/v1/sensors/fresh-0/labels", app.address))
        .json(&json!({ "site": "y" }))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
}

#[tokio::test]
async fn a_registry_document_that_does_not_decode_costs_only_itself() {
    let app = spawn_app().await;
    let t = base_time();
    let r = app.post_readings(&reading("good-1", "temp", t, 1.0)).await;
    assert_eq!(r.status(), 200);
    eventually(Duration::from_secs(60), "good-1 is listed", || async {
        registry(&app).await.len() == 1
    })
    .await;
    // Written past every check (an older version, a hand edit).
    app.db
        .collection::<mongodb::bson::Document>("sensors")
        .insert_many([
            doc! { "_id": "G".repeat(200), "metrics": ["temp"], "labels": { "group": "G".repeat(200) } },
            doc! { "_id": "bad-labels", "metrics": ["temp"], "labels": { "__x": 1, "ok": "y".repeat(300) } },
            doc! { "_id": 7, "metrics": "temp" },
        ])
        .await
        .expect("planted");
    for path in [
        "/api/v1/sensors",
        "/api/v1/sensors?silent=true",
        "/prometheus/api/v1/series?match[]=temp",
        "/prometheus/api/v1/labels",
        "/prometheus/api/v1/query?query=count(temp)",
    ] {
        let r = app.get(path).await;
        assert_eq!(
            r.status(),
            200,
            "{path}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    let listed = registry(&app).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(app.metric("hourglass_unreadable_documents_total").await >= 3.0);
    let r = app
        .get(&format!(
            "/api/v1/series?sensor=*&metric=temp&from={}&to={}&step=1h",
            rfc3339(t - 60),
            rfc3339(t + 60)
        ))
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
}

#[tokio::test]
async fn a_sparkplug_birth_with_ids_no_sensor_can_hold_gets_no_state_and_breaks_nothing() {
    let broker = Broker::start().await;
    let mut settings = mqtt_settings(&broker);
    settings.mqtt.sparkplug.enabled = true;
    let app = spawn_app_with(settings.clone()).await;
    subscribed(&app).await;
    let mut watcher =
        Publisher::connect_subscribed(&broker, "watcher", Some("hourglass/dead-letters")).await;
    let mut letters = watcher.messages();
    let mut edge = Publisher::connect(&broker, "edge").await;
    let long = "G".repeat(200);
    // The issue's: an empty payload, a 200-byte group. And relatives: ids
    // that map to a sensor id past 128 bytes, an id past 128 bytes.
    for topic in [
        format!("spBv1.0/{long}/NBIRTH/n1"),
        format!("spBv1.0/g/DBIRTH/{}/{}", "n".repeat(100), "d".repeat(100)),
        format!("spBv1.0/g/NBIRTH/{}", "n".repeat(129)),
    ] {
        edge.publish(&topic, Vec::new()).await;
        let letter = tokio::time::timeout(Duration::from_secs(60), letters.recv())
            .await
            .expect("a dead letter in time")
            .expect("the watcher runs");
        assert_eq!(letter.0, "hourglass/dead-letters");
    }
    edge.flushed().await;
    for path in [
        "/api/v1/sensors",
        "/prometheus/api/v1/series?match[]={__name__=~\".+\"}",
        "/api/v1/export?from=2026-01-01T00:00:00Z&to=2026-12-01T00:00:00Z",
    ] {
        let r = app.get(path).await;
        assert_eq!(
            r.status(),
            200,
            "{path}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    assert!(registry(&app).await.is_empty(), "no registry entry");
    let births = app.documents("metadata", doc! { "_id": 1 }).await;
    assert!(
        births.iter().all(|d| !d
            .get_str("_id")
            .unwrap_or_default()
            .starts_with("sparkplug/")),
        "no birth kept: {births:?}"
    );
    // After a restart the guard is seeded as ever.
    app.stop().await.expect("stops");
    let app = spawn_app_with(settings).await;
    eventually(
        Duration::from_secs(60),
        "the guard is seeded after a restart",
        || async { app.metric("hourglass_new_series_guard_seeded").await == 1.0 },
    )
    .await;
}
