use hourglass::Settings;
use hourglass::{Scope, TokenSettings, hash_token};
use serde_json::json;

use crate::helpers::*;

pub const DASHBOARD: &str = "dashboard-3f9a1c";
pub const TRUCK: &str = "truck17-77b2e0";
pub const INGESTER: &str = "gateway-0c1d2e";
pub const OPERATOR: &str = "operator-5e6f70";

pub fn secured() -> Settings {
    let mut s = test_settings();
    s.auth.enabled = true;
    s.auth.tokens = vec![
        TokenSettings {
            name: "dashboard".into(),
            sha256: hash_token(DASHBOARD),
            scopes: vec![Scope::Query],
            sensors: None,
        },
        TokenSettings {
            name: "truck-17".into(),
            sha256: hash_token(TRUCK),
            scopes: vec![Scope::Ingest, Scope::Query],
            sensors: Some(vec!["truck-17".into(), "truck-17.*".into()]),
        },
        TokenSettings {
            name: "gateway".into(),
            sha256: hash_token(INGESTER),
            scopes: vec![Scope::Ingest],
            sensors: None,
        },
        TokenSettings {
            name: "operator".into(),
            sha256: hash_token(OPERATOR),
            scopes: vec![Scope::Admin],
            sensors: None,
        },
    ];
    s
}

#[tokio::test]
async fn only_an_admin_token_deletes_and_a_device_token_may_never_be_one() {
    let app = spawn_app_with(secured()).await;
    let t = base_time();
    let r = post(&app, Some(INGESTER), &reading("truck-17", "speed", t, 1.0)).await;
    assert_eq!(r.status(), 200);
    let query = format!(
        "/api/v1/readings?sensor=truck-17&from={}&to={}",
        rfc3339(t - 60),
        rfc3339(t + 60)
    );
    let delete = |token: Option<&'static str>| {
        let mut req = app.client.delete(format!("{}{query}", app.address));
        if let Some(tok) = token {
            req = req.bearer_auth(tok);
        }
        req.send()
    };
    assert_eq!(delete(None).await.expect("sent").status(), 401);
    for token in [DASHBOARD, TRUCK, INGESTER] {
        assert_eq!(
            delete(Some(token)).await.expect("sent").status(),
            403,
            "{token}"
        );
    }
    assert_eq!(
        app.buckets().await.len(),
        1,
        "refused deletes change nothing"
    );
    let r = delete(Some(OPERATOR)).await.expect("sent");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.expect("JSON")["readings"],
        1
    );
    assert!(app.buckets().await.is_empty());
    app.stop().await.expect("stops");

    let mut s = secured();
    s.auth.tokens[1].scopes.push(Scope::Admin);
    let err = s.validate().expect_err("a device token with admin");
    assert!(err.to_string().contains("auth.tokens[1]"), "{err}");
}

async fn post(app: &TestApp, token: Option<&str>, body: &serde_json::Value) -> reqwest::Response {
    let mut req = app
        .client
        .post(format!("{}/api/v1/readings", app.address))
        .json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("sent")
}

async fn get(app: &TestApp, token: Option<&str>, path: &str) -> reqwest::Response {
    let mut req = app.client.get(format!("{}{path}", app.address));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.expect("sent")
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401_and_store_nothing() {
    let app = spawn_app_with(secured()).await;
    let body = reading("truck-17", "speed", base_time(), 1.0);
    let r = post(&app, None, &body).await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    assert_eq!(post(&app, Some("not-a-token"), &body).await.status(), 401);
    let r = app
        .client
        .post(format!("{}/api/v1/readings", app.address))
        .basic_auth("user", Some(TRUCK))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), 401, "only bearer tokens");
    let q = format!(
        "/api/v1/sensors/truck-17/average?from={}&to={}",
        rfc3339(base_time()),
        rfc3339(base_time() + 60)
    );
    assert_eq!(get(&app, None, &q).await.status(), 401);
    assert_eq!(
        get(&app, None, "/health/live").await.status(),
        200,
        "probes need no token"
    );
    assert_eq!(
        get(&app, None, "/metrics").await.status(),
        200,
        "scrapers need no token"
    );
    assert!(app.buckets().await.is_empty());
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn tokens_are_limited_to_their_scopes() {
    let app = spawn_app_with(secured()).await;
    let t = base_time();
    let q = format!(
        "/api/v1/sensors/any-sensor/average?from={}&to={}",
        rfc3339(t),
        rfc3339(t + 60)
    );
    assert_eq!(
        post(&app, Some(DASHBOARD), &reading("any-sensor", "m", t, 1.0))
            .await
            .status(),
        403,
        "query-only token"
    );
    assert_eq!(get(&app, Some(DASHBOARD), &q).await.status(), 200);
    assert_eq!(
        post(&app, Some(INGESTER), &reading("any-sensor", "m", t, 1.0))
            .await
            .status(),
        200
    );
    assert_eq!(
        get(&app, Some(INGESTER), &q).await.status(),
        403,
        "ingest-only token"
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_device_token_writes_and_reads_only_its_own_sensors() {
    let app = spawn_app_with(secured()).await;
    let t = base_time();
    let own = json!([
        reading("truck-17", "speed", t, 50.0),
        reading("truck-17.engine", "rpm", t, 900.0)
    ]);
    assert_eq!(post(&app, Some(TRUCK), &own).await.status(), 200);
    let mixed = json!([
        reading("truck-17", "speed", t + 1, 51.0),
        reading("truck-18", "speed", t + 1, 1.0)
    ]);
    let r = post(&app, Some(TRUCK), &mixed).await;
    assert_eq!(r.status(), 403);
    let body: serde_json::Value = r.json().await.expect("json");
    assert!(
        body["error"].as_str().expect("error").contains("truck-18"),
        "{body}"
    );
    let stored = all_values(&app.buckets().await, hourglass::Granularity::Minute);
    assert_eq!(stored.len(), 2, "nothing of the refused request is stored");
    let range = format!("from={}&to={}", rfc3339(t), rfc3339(t + 60));
    assert_eq!(
        get(
            &app,
            Some(TRUCK),
            &format!("/api/v1/sensors/truck-17/average?metric=speed&{range}")
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        get(
            &app,
            Some(TRUCK),
            &format!("/api/v1/sensors/truck-170/average?{range}")
        )
        .await
        .status(),
        403
    );
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn tokens_never_reach_the_logs() {
    let settings = secured();
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("hourglass.log");
    let toml = logs.path().join("auth.toml");
    let mut text = String::from("[auth]\nenabled = true\n");
    for t in &settings.auth.tokens {
        let scopes: Vec<String> = t
            .scopes
            .iter()
            .map(|s| format!("{:?}", format!("{s:?}").to_lowercase()))
            .collect();
        text += &format!(
            "[[auth.tokens]]\nname = {:?}\nsha256 = {:?}\nscopes = [{}]\n",
            t.name,
            t.sha256,
            scopes.join(", ")
        );
    }
    std::fs::write(&toml, text).expect("write config");
    // The binary with a config file that holds the token hashes.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"));
    let file = std::fs::File::create(&log).expect("log");
    use secrecy::ExposeSecret;
    let mut child = cmd
        .args(["--config".as_ref(), toml.as_os_str()])
        .env(
            "HOURGLASS__MONGODB__URI",
            settings.mongodb.uri.expose_secret(),
        )
        .env("HOURGLASS__MONGODB__DATABASE", &settings.mongodb.database)
        .env("HOURGLASS__HTTP__LISTEN", "127.0.0.1:0")
        .env("HOURGLASS__MQTT__ENABLED", "false")
        .env("HOURGLASS__JOURNAL__DIR", journal_dir())
        .env("HOURGLASS__LOG__FORMAT", "json")
        .env("HOURGLASS__LOG__LEVEL", "debug")
        .env_remove("RUST_LOG")
        .stdout(file.try_clone().expect("clone"))
        .stderr(file)
        .spawn()
        .expect("starts");
    let address = binary_address(&log).await;
    let http = crate::helpers::http_client();
    for token in [TRUCK, DASHBOARD, "wrong-token-5150"] {
        let _ = http
            .post(format!("{address}/api/v1/readings"))
            .bearer_auth(token)
            .json(&reading("truck-17", "m", base_time(), 1.0))
            .send()
            .await
            .expect("sent");
    }
    assert!(terminate(&mut child).success());
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("Answered an HTTP request."),
        "debug request lines were written"
    );
    for secret in [TRUCK, DASHBOARD, "wrong-token-5150"] {
        assert!(!text.contains(secret), "a token reached the log");
    }
}

#[test]
fn hash_token_prints_the_hash_of_standard_input() {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"s3cret\n")
        .expect("write");
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        hash_token("s3cret")
    );
}

/// `auth.tokens_file` with one query token named `name`.
fn tokens_file(path: &std::path::Path, name: &str, token: &str) {
    let text = format!(
        "[[tokens]]\nname = {name:?}\nsha256 = {:?}\nscopes = [\"query\"]\n",
        hash_token(token)
    );
    // Written whole, then renamed: the service never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("written");
    std::fs::rename(&tmp, path).expect("renamed");
}

/// Whether `token` gets past authentication (401 and 403 are refusals; a
/// 503 of a storage slowed by the machine's load is not one).
async fn admitted(address: &str, token: &str) -> bool {
    !matches!(status_with(address, token).await, 401 | 403)
}

async fn status_with(address: &str, token: &str) -> u16 {
    http_client()
        .get(format!("{address}/api/v1/sensors"))
        .bearer_auth(token)
        .send()
        .await
        .expect("answered")
        .status()
        .as_u16()
}

/// Tokens rotate on the running binary: a changed tokens file is put in
/// force (the old token refused from then on), a faulty one is not applied,
/// and SIGHUP re-reads the configuration file's own tokens.
#[tokio::test]
async fn tokens_rotate_without_a_restart_and_a_faulty_set_is_not_applied() {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("tokens.toml");
    tokens_file(&file, "dashboard", "first-secret");
    let config = dir.path().join("hourglass.toml");
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml"),
    )
    .expect("the shipped configuration");
    std::fs::write(&config, &shipped).expect("written");
    let log = dir.path().join("hourglass.log");
    let file_text = file.display().to_string();
    let mut child = spawn_binary_with_config(
        &config,
        &test_settings(),
        &[
            ("HOURGLASS__AUTH__ENABLED", "true"),
            ("HOURGLASS__AUTH__TOKENS_FILE", &file_text),
        ],
        &log,
    );
    let address = binary_address(&log).await;
    assert!(admitted(&address, "first-secret").await);

    tokens_file(&file, "dashboard", "second-secret");
    eventually(
        std::time::Duration::from_secs(30),
        "the new token is in force",
        || async { admitted(&address, "second-secret").await },
    )
    .await;
    assert_eq!(
        status_with(&address, "first-secret").await,
        401,
        "the old one refused"
    );

    std::fs::write(
        &file,
        "[[tokens]]\nname = \"dashboard\"\nsha256 = \"not hex\"\nscopes = [\"query\"]\n",
    )
    .expect("written");
    eventually(
        std::time::Duration::from_secs(30),
        "the faulty set is refused",
        || async {
            metric(
                &address,
                "hourglass_auth_reloads_total{outcome=\"refused\"}",
            )
            .await
                >= 1.0
        },
    )
    .await;
    assert!(
        admitted(&address, "second-secret").await,
        "the set in force stays"
    );
    tokens_file(&file, "dashboard", "second-secret");

    // SIGHUP: the configuration file's own tokens, re-read.
    std::fs::write(
        &config,
        format!(
            "{shipped}\n[[auth.tokens]]\nname = \"operator\"\nsha256 = {:?}\nscopes = [\"query\"]\n",
            hash_token("third-secret")
        ),
    )
    .expect("written");
    assert_eq!(status_with(&address, "third-secret").await, 401);
    let pid = child.id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .expect("kill")
            .success()
    );
    eventually(
        std::time::Duration::from_secs(30),
        "the configuration's token is in force",
        || async { admitted(&address, "third-secret").await },
    )
    .await;
    assert!(admitted(&address, "second-secret").await);
    assert!(terminate(&mut child).success(), "SIGHUP did not stop it");
}
