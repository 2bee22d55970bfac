use std::collections::BTreeMap;
use std::sync::Once;
use std::time::Duration;

use futures_util::TryStreamExt;
use hourglass::Application;
use hourglass::Granularity;
use hourglass::Settings;
use mongodb::bson::{Bson, Document, doc};
use secrecy::SecretString;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

static TRACING: Once = Once::new();

/// Logs only when TEST_LOG is set, so passing runs stay quiet.
fn init_tracing() {
    TRACING.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
                .with_test_writer()
                .try_init();
        }
    });
}

/// The server this test process uses. `make test` starts several stand-ins
/// (`MONGODB_URIS`, space-separated) because one is single-threaded and the
/// suite mostly waits on it. nextest numbers the tests running at once
/// (slots); a test of the `heavy` group (`.config/nextest.toml`) takes the
/// server of its slot in that group, any other test that of its slot in the
/// run, so no server gets more than its share of the heavy tests (chosen by
/// process id, three of them once landed on one server and timed out while
/// the other idled). Without nextest the process id spreads them. Without
/// that list, or against a real MongoDB, it is `MONGODB_URI`.
pub fn mongo_uri() -> String {
    static URI: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URI.get_or_init(|| {
        let list = std::env::var("MONGODB_URIS").unwrap_or_default();
        let uris: Vec<&str> = list.split_whitespace().collect();
        if uris.is_empty() {
            std::env::var("MONGODB_URI").expect(
                "MONGODB_URI must point at a MongoDB-compatible server; `make test` starts one and sets it",
            )
        } else {
            uris[standin_slot() % uris.len()].to_owned()
        }
    })
    .clone()
}

/// Which of the stand-ins this test takes (see [`mongo_uri`]).
fn standin_slot() -> usize {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
    };
    let slot = if std::env::var("NEXTEST_TEST_GROUP").as_deref() == Ok("heavy") {
        var("NEXTEST_TEST_GROUP_SLOT")
    } else {
        var("NEXTEST_TEST_GLOBAL_SLOT")
    };
    slot.unwrap_or(std::process::id() as usize)
}

/// Settings for one test: port 0, its own database, a short flush interval.
pub fn test_settings() -> Settings {
    // Before any HTTP client of the test is built (see the function).
    hourglass::install_crypto_provider();
    let mut s = Settings::default();
    s.mongodb.uri = SecretString::from(mongo_uri());
    s.mongodb.database = format!("hg_test_{}", uuid::Uuid::new_v4().simple());
    s.http.listen = "127.0.0.1:0".parse().expect("valid address");
    s.batcher.flush_interval = Duration::from_millis(50);
    // Hours written late are rolled up a second after their last write.
    s.buckets.late_rollup_after = Duration::from_secs(1);
    // The stand-in is slow and CI runs tests side by side: a write may wait
    // well past the shipped 10 s (seen in CI as a 503 after ten retries).
    // The tests of the timeout itself set their own.
    s.http.write_timeout = Duration::from_secs(120);
    s.http.request_timeout = Duration::from_secs(150);
    // Likewise a read: the console's fleet listing answered 503 after the
    // shipped 10 s in CI while the stand-in served other tests' work, and a
    // PromQL range after 60 s while the heavy tests ran. The tests of the
    // query timeout set their own.
    s.query.timeout = Duration::from_secs(120);
    s.mqtt.enabled = false;
    // Most tests check what is stored when the answer comes, which is what
    // the service does with the journal off; the journal tests turn it on.
    s.journal.enabled = false;
    s.journal.dir = journal_dir();
    s
}

/// A fresh directory for one test's journal.
pub fn journal_dir() -> std::path::PathBuf {
    std::env::temp_dir()
        .join("hourglass-tests")
        .join(uuid::Uuid::new_v4().simple().to_string())
}

/// Test settings with the journal on, as shipped.
pub fn journal_settings() -> Settings {
    let mut s = test_settings();
    s.journal.enabled = true;
    s
}

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub db: mongodb::Database,
    pub settings: Settings,
    pub mqtt: Option<std::sync::Arc<hourglass::MqttStats>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(test_settings()).await
}

pub async fn spawn_app_with(settings: Settings) -> TestApp {
    init_tracing();
    settings.validate().expect("valid test settings");
    let app = Application::build(settings.clone())
        .await
        .expect("the application builds");
    let address = format!("http://{}", app.address());
    let mqtt = app.mqtt_stats();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    // The settings' server, which is not always MONGODB_URI's (fault tests run
    // private ones).
    let client = {
        use secrecy::ExposeSecret;
        mongo_client(settings.mongodb.uri.expose_secret()).await
    };
    TestApp {
        address,
        client: http_client(),
        db: client.database(&settings.mongodb.database),
        settings,
        mqtt,
        stop: Some(stop),
        task: Some(task),
    }
}

impl TestApp {
    pub async fn post_readings(&self, body: &Value) -> reqwest::Response {
        self.post_raw(
            "application/json",
            serde_json::to_vec(body).expect("json"),
            "",
        )
        .await
    }

    /// Posts readings as a client that follows the contract would: a 503
    /// ("retrying is safe") is sent again, a few times, so a test whose
    /// subject is not the write path does not fail when the stand-in is
    /// slowed by the tests beside it (seen in CI: a write unconfirmed after
    /// 120 s). Answers the last response.
    pub async fn post_readings_retrying(&self, body: &Value) -> reqwest::Response {
        let mut attempts = 0;
        loop {
            let r = self.post_readings(body).await;
            attempts += 1;
            if r.status() != 503 || attempts == 5 {
                return r;
            }
            // As the answer's Retry-After asks.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    pub async fn post_raw(
        &self,
        content_type: &str,
        body: Vec<u8>,
        query: &str,
    ) -> reqwest::Response {
        self.client
            .post(format!("{}/api/v1/readings{query}", self.address))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("the request is sent")
    }

    pub async fn get(&self, path_and_query: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path_and_query}", self.address))
            .send()
            .await
            .expect("the request is sent")
    }

    /// The sum of the metric series whose lines start with `line_start`.
    pub async fn metric(&self, line_start: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.expect("metrics");
        text.lines()
            .filter(|l| l.starts_with(line_start))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// A 200's JSON body. A 503 (a query over its timeout or a storage
    /// hiccup on a loaded machine: "retry later") is asked again twice, as
    /// a client would; anything else fails with the body.
    pub async fn get_json(&self, path_and_query: &str) -> Value {
        let mut tries = 0;
        loop {
            let r = self.get(path_and_query).await;
            let status = r.status();
            if status == 200 {
                return r.json().await.expect("a JSON body");
            }
            let body = r.text().await.unwrap_or_default();
            tries += 1;
            if status != 503 || tries == 3 {
                panic!("GET {path_and_query}: {status} {body}");
            }
            eprintln!("GET {path_and_query}: {status} {body}; asking again");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Every bucket document, sorted by (sensor, metric, start), without `_id`
    /// and the write counter `n` (which counts retries; rollups use it).
    pub async fn buckets(&self) -> Vec<Document> {
        let mut docs = self
            .documents(
                &self.settings.mongodb.collection,
                doc! { "sensor": 1, "metric": 1, "start": 1 },
            )
            .await;
        for d in &mut docs {
            d.remove("n");
        }
        docs
    }

    /// The buckets, or `None` if storage does not answer.
    pub async fn buckets_or_none(&self) -> Option<Vec<Document>> {
        let options = mongodb::options::FindOptions::builder()
            .max_time(Duration::from_millis(500))
            .build();
        let found = tokio::time::timeout(
            Duration::from_secs(3),
            self.db
                .collection::<Document>(&self.settings.mongodb.collection)
                .find(doc! {})
                .with_options(options),
        )
        .await;
        match found {
            Ok(Ok(cursor)) => {
                use futures_util::TryStreamExt;
                cursor.try_collect().await.ok()
            }
            _ => None,
        }
    }

    /// Every document of `collection` in this app's database, without `_id`.
    pub async fn documents(&self, collection: &str, sort: Document) -> Vec<Document> {
        self.db
            .collection::<Document>(collection)
            .find(doc! {})
            .projection(doc! { "_id": 0 })
            .sort(sort)
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("documents")
    }

    /// Waits until every hour marked late is rolled up again (the upkeep
    /// removes a marker once it has): its rollup slots are then current.
    pub async fn late_rolled_up(&self) {
        let late = self
            .db
            .collection::<Document>(&self.settings.mongodb.late_collection);
        // Generous: the stand-in is slow, and slower still beside the
        // browser tests on two cores.
        for _ in 0..1800 {
            if late.count_documents(doc! {}).await.expect("count") == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("hours marked late were not rolled up within three minutes");
    }

    /// Stops the service gracefully and returns how it ended.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.expect("the service task joins"),
            None => Ok(()),
        }
    }
}

/// Waits for `check` to hold, polling; panics with `what` after `limit`.
/// A failure bound, not a timing assertion: the slow path only makes it wait.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // A check that never returns (a stand-in that took a command and
        // went quiet) fails too, instead of hanging the test until CI's
        // limit: it gets what is left, and at least a minute.
        let left = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(CHECK_AT_LEAST);
        match tokio::time::timeout(left, check()).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => panic!("gave up waiting: {what} (a check did not return within {left:?})"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The least time one check of [`eventually`] gets, however little of the
/// limit is left: a slow answer is not a hang.
const CHECK_AT_LEAST: Duration = Duration::from_secs(60);

/// An HTTP client whose requests fail after five minutes: every request the
/// tests send is bounded by the service's own timeouts (150 s at most), so
/// one still unanswered then is a wedged service, a failure, not a hang.
pub fn http_client() -> reqwest::Client {
    hourglass::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .expect("an HTTP client")
}

/// Waits for `child` to exit, at most `limit`; `None` if it did not.
pub fn wait_at_most(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => return None,
        }
    }
}

/// A free loopback port (for servers the tests start themselves).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until something listens on `port`.
pub async fn listening(port: u16, what: &str) {
    eventually(Duration::from_secs(60), what, || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
}

/// Waits until the app's MQTT ingestor holds its subscription.
pub async fn subscribed(app: &TestApp) {
    let stats = app.mqtt.clone().expect("MQTT is enabled");
    eventually(Duration::from_secs(90), "the service subscribed", || {
        let stats = stats.clone();
        async move { stats.subscribed.load(std::sync::atomic::Ordering::Acquire) }
    })
    .await;
}

/// All stored values as `{(sensor, metric, ts) → value}`.
pub fn all_values(docs: &[Document], g: Granularity) -> BTreeMap<(String, String, i64), f64> {
    docs.iter()
        .flat_map(|d| {
            let sensor = d.get_str("sensor").expect("sensor").to_owned();
            let metric = d.get_str("metric").expect("metric").to_owned();
            let start = d.get_datetime("start").expect("start").timestamp_millis() / 1000;
            stored_values(d, g)
                .into_iter()
                .map(move |(o, v)| ((sensor.clone(), metric.clone(), start + o), v))
        })
        .collect()
}

/// Every document of `collection`, by a plain scan.
pub async fn all_documents(collection: &mongodb::Collection<Document>) -> Vec<Document> {
    collection
        .find(doc! {})
        .await
        .expect("a scan")
        .try_collect()
        .await
        .expect("the scan's documents")
}

/// A time well inside the accepted window, aligned to an hour: 2 days ago.
pub fn base_time() -> i64 {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let t = now - 2 * 86_400;
    t - t.rem_euclid(3600)
}

pub fn rfc3339(ts: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ts)
        .expect("valid")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formats")
}

pub fn reading(sensor: &str, metric: &str, ts: i64, value: f64) -> Value {
    serde_json::json!({ "sensor": sensor, "metric": metric, "ts": rfc3339(ts), "value": value })
}

fn number(d: &Document, key: &str) -> f64 {
    match d.get(key) {
        Some(Bson::Double(x)) => *x,
        Some(Bson::Int32(x)) => f64::from(*x),
        Some(Bson::Int64(x)) => *x as f64,
        other => panic!("{key} is {other:?} in {d}"),
    }
}

/// `{second offset in bucket → value}` of a bucket document.
pub fn stored_values(d: &Document, g: Granularity) -> BTreeMap<i64, f64> {
    let v = d.get_document("v").expect("v");
    let mut out = BTreeMap::new();
    match g {
        Granularity::Minute => {
            for (k, _) in v {
                out.insert(k.parse::<i64>().expect("second"), number(v, k));
            }
        }
        Granularity::Hour => {
            for (m, secs) in v {
                let secs = secs.as_document().expect("minute document");
                for (s, _) in secs {
                    let off =
                        m.parse::<i64>().expect("minute") * 60 + s.parse::<i64>().expect("second");
                    out.insert(off, number(secs, s));
                }
            }
        }
    }
    out
}

fn check_aggregates(d: &Document, values: impl Iterator<Item = f64> + Clone, what: &str) {
    let count = values.clone().count();
    assert_eq!(number(d, "count") as usize, count, "{what}: count in {d}");
    let sum: f64 = values.clone().sum();
    assert_eq!(number(d, "sum"), sum, "{what}: sum in {d}");
    let min = values.clone().fold(f64::INFINITY, f64::min);
    let max = values.fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(number(d, "min"), min, "{what}: min in {d}");
    assert_eq!(number(d, "max"), max, "{what}: max in {d}");
}

/// The bucket invariants: aggregates equal those of the stored values, in the
/// bucket and in every per-minute entry; one bucket per (sensor, metric, start).
pub fn assert_invariants(docs: &[Document], g: Granularity) {
    let mut keys = std::collections::HashSet::new();
    for d in docs {
        let key = (
            d.get_str("sensor").expect("sensor").to_owned(),
            d.get_str("metric").expect("metric").to_owned(),
            d.get_datetime("start").expect("start").timestamp_millis(),
        );
        assert_eq!(
            key.2.rem_euclid(g.seconds() * 1000),
            0,
            "aligned start in {d}"
        );
        assert!(keys.insert(key), "one bucket per key: {d}");
        assert_eq!(
            d.get("schema_version"),
            None,
            "named by the metadata only: {d}"
        );
        let values = stored_values(d, g);
        check_aggregates(d, values.values().copied(), "bucket");
        if g == Granularity::Hour {
            let m = d.get_document("m").expect("m");
            let minutes: std::collections::BTreeSet<i64> = values.keys().map(|o| o / 60).collect();
            assert_eq!(
                m.len(),
                minutes.len(),
                "one m entry per minute with values in {d}"
            );
            for minute in minutes {
                let of_minute: Vec<f64> = values
                    .range(minute * 60..minute * 60 + 60)
                    .map(|(_, v)| *v)
                    .collect();
                let key = minute.to_string();
                if let [only] = of_minute[..] {
                    assert_eq!(
                        m.get_f64(&key).map(f64::to_bits),
                        Ok(only.to_bits()),
                        "a minute of one reading is stored as its value in {d}"
                    );
                } else {
                    let entry = m.get_document(&key).expect("m entry");
                    check_aggregates(entry, of_minute.into_iter(), &format!("m.{minute}"));
                }
            }
        }
    }
}

/// Brute-force aggregates of the readings `{(sensor, ts) → value}` of one sensor in `[from, to)`.
pub fn expected(
    data: &BTreeMap<i64, f64>,
    from: i64,
    to: i64,
) -> (u64, f64, Option<f64>, Option<f64>) {
    let vals: Vec<f64> = data.range(from..to).map(|(_, v)| *v).collect();
    let count = vals.len() as u64;
    let sum: f64 = vals.iter().sum();
    let min = vals.iter().copied().reduce(f64::min);
    let max = vals.iter().copied().reduce(f64::max);
    (count, sum, min, max)
}

pub fn settings_with(g: Granularity) -> Settings {
    let mut s = test_settings();
    s.buckets.granularity = g;
    s
}

/// The real binary, configured through the environment as an operator would:
/// the settings' database and broker, port 0, JSON logs into `log`.
pub fn spawn_binary(
    settings: &Settings,
    extra: &[(&str, &str)],
    log: &std::path::Path,
) -> std::process::Child {
    spawn_binary_within(None, settings, extra, log)
}

/// [`spawn_binary`] with `config` as its configuration file.
pub fn spawn_binary_with_config(
    config: &std::path::Path,
    settings: &Settings,
    extra: &[(&str, &str)],
    log: &std::path::Path,
) -> std::process::Child {
    spawn_binary_from(config, None, settings, extra, log)
}

/// [`spawn_binary`] with its address space capped at `mib` (`prlimit --as`):
/// an allocation past it fails, and the process with it.
pub fn spawn_binary_capped(
    mib: u64,
    settings: &Settings,
    extra: &[(&str, &str)],
    log: &std::path::Path,
) -> std::process::Child {
    spawn_binary_within(Some(mib), settings, extra, log)
}

fn spawn_binary_within(
    cap_mib: Option<u64>,
    settings: &Settings,
    extra: &[(&str, &str)],
    log: &std::path::Path,
) -> std::process::Child {
    let config = std::path::Path::new("config/default.toml");
    spawn_binary_from(config, cap_mib, settings, extra, log)
}

fn spawn_binary_from(
    config: &std::path::Path,
    cap_mib: Option<u64>,
    settings: &Settings,
    extra: &[(&str, &str)],
    log: &std::path::Path,
) -> std::process::Child {
    use secrecy::ExposeSecret;
    use std::process::{Command, Stdio};
    let file = std::fs::File::create(log).expect("a log file");
    let mut cmd = match cap_mib {
        None => Command::new(env!("CARGO_BIN_EXE_hourglass")),
        Some(mib) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--as={}", mib << 20))
                .arg("--")
                .arg(env!("CARGO_BIN_EXE_hourglass"));
            c
        }
    };
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--config")
        .arg(config)
        .env(
            "HOURGLASS__MONGODB__URI",
            settings.mongodb.uri.expose_secret(),
        )
        .env("HOURGLASS__MONGODB__DATABASE", &settings.mongodb.database)
        .env("HOURGLASS__HTTP__LISTEN", "127.0.0.1:0")
        .env(
            "HOURGLASS__MQTT__ENABLED",
            settings.mqtt.enabled.to_string(),
        )
        .env("HOURGLASS__MQTT__URL", &settings.mqtt.url)
        .env("HOURGLASS__MQTT__CLIENT_ID", &settings.mqtt.client_id)
        .env("HOURGLASS__MQTT__RECONNECT_MAX", "1s")
        .env(
            "HOURGLASS__JOURNAL__ENABLED",
            settings.journal.enabled.to_string(),
        )
        .env("HOURGLASS__JOURNAL__DIR", &settings.journal.dir)
        .env("HOURGLASS__LOG__FORMAT", "json")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("clone"))
        .stderr(file);
    for (key, value) in extra {
        cmd.env(key, value);
    }
    cmd.spawn().expect("the hourglass binary starts")
}

/// The value of an unlabelled metric in the `/metrics` text of the service
/// at `address` (a binary's, or an app's).
pub async fn metric(address: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{address}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

/// The `http://host:port` a binary started with [`spawn_binary`] listens on.
pub async fn binary_address(log: &std::path::Path) -> String {
    let mut address = None;
    // Its start reads the storage server (indexes, the read shapes): under
    // CI's load, with the stand-in busy with other tests, that once took
    // over a minute.
    eventually(
        Duration::from_secs(180),
        "the binary logs its address",
        || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            address = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find_map(|v| v["address"].as_str().map(str::to_owned));
            let found = address.is_some();
            async move { found }
        },
    )
    .await;
    format!("http://{}", address.expect("found"))
}

/// Sends one request per `i` in `0..requests` to `url`, with the body
/// `body(i, &mut readings)` builds, and keeps the readings of every request
/// answered 200. SIGKILLs `child` (the service behind `url`) as soon as
/// `at_least` readings are acknowledged, before the next request, and
/// returns what was acknowledged: the kill point is the test's, not a race.
pub async fn kill_mid_stream(
    url: String,
    child: &mut std::process::Child,
    requests: i64,
    at_least: usize,
    body: impl Fn(i64, &mut BTreeMap<(String, String, i64), f64>) -> Value,
) -> BTreeMap<(String, String, i64), f64> {
    let client = crate::helpers::http_client();
    let mut acked = BTreeMap::new();
    for i in 0..requests {
        let mut m = BTreeMap::new();
        let b = body(i, &mut m);
        let r = client.post(&url).json(&b).send().await.expect("sent");
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        acked.extend(m);
        if acked.len() >= at_least {
            break;
        }
    }
    assert!(acked.len() >= at_least, "the stream reached {at_least}");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    acked
}

/// Sends SIGTERM and waits for the process to exit.
pub fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    // The service's stop is bounded by its deadline (seconds): two minutes
    // without an exit is a stop that hangs, a failure.
    match wait_at_most(child, Duration::from_secs(120)) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not exit within 120 s of SIGTERM");
        }
    }
}

/// A proxy in front of a service that lets the first `open` POSTs through
/// and holds the answer to every later one for as long as it lives (the
/// request itself still reaches the service). A client behind it stops at
/// a point the test chooses, however fast the machine is.
pub struct Gate {
    pub address: String,
    /// POSTs whose answer is held.
    pub held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn gate(upstream: &str, open: usize) -> Gate {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, Method, StatusCode, Uri};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let posts = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let upstream = upstream.to_owned();
    let client = crate::helpers::http_client();
    let handler = {
        let held = held.clone();
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (posts, held, client) = (posts.clone(), held.clone(), client.clone());
            let url = format!("{upstream}{uri}");
            async move {
                let gated = method == Method::POST && posts.fetch_add(1, Ordering::SeqCst) >= open;
                let mut request = client.request(method, url).body(body);
                for (name, value) in &headers {
                    if name != "host" && name != "content-length" {
                        request = request.header(name, value);
                    }
                }
                let answer = request.send().await;
                if gated {
                    held.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
                match answer {
                    Ok(r) => {
                        let status = StatusCode::from_u16(r.status().as_u16())
                            .unwrap_or(StatusCode::BAD_GATEWAY);
                        (status, r.bytes().await.unwrap_or_default())
                    }
                    Err(_) => (StatusCode::BAD_GATEWAY, Bytes::new()),
                }
            }
        }
    };
    let router = axum::Router::new().fallback(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = format!("http://{}", listener.local_addr().expect("an address"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Gate {
        address,
        held,
        task,
    }
}

/// Keeps `input` as a seed of the fuzz target `target` when
/// `HOURGLASS_FUZZ_SEEDS` names a directory (`make test` sets it, and its
/// fuzzing starts from what the tests sent).
pub fn fuzz_seed(target: &str, input: &str) {
    let Some(dir) = std::env::var_os("HOURGLASS_FUZZ_SEEDS") else {
        return;
    };
    let dir = std::path::Path::new(&dir).join(target);
    // FNV-1a: one file per distinct input.
    let hash = input.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(format!("{hash:016x}")), input);
    }
}

/// A deterministic generator (SplitMix64): the same data every run.
pub struct Gen(pub u64);

impl Gen {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `xs`, for the words a generator strings together.
    pub fn word(&mut self, xs: &[&'static str]) -> &'static str {
        xs[self.below(xs.len() as u64) as usize]
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// A client for a test's own reads and commands. The stand-in closes a
/// connection idle for 300 s, and a pooled connection closed underneath
/// fails its next command: a test that waits minutes between its own
/// commands (the conformance suite under load) would fail on that, so idle
/// connections are dropped first, as the service's are.
pub async fn mongo_client(uri: &str) -> mongodb::Client {
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .expect("a MongoDB URI");
    options.max_idle_time = Some(Duration::from_secs(60));
    mongodb::Client::with_options(options).expect("a MongoDB client")
}
