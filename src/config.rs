//! The typed settings tree: built-in defaults, then a TOML file, then
//! `HOURGLASS__SECTION__KEY` environment variables, validated at startup.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use crate::auth::AuthSettings;
use crate::domain::Granularity;

pub const ENV_PREFIX: &str = "HOURGLASS__";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_MAX_FUTURE: Duration = Duration::from_secs(5 * 60);
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
pub const DEFAULT_MAX_READINGS_PER_REQUEST: usize = 50_000;
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_PENDING_READINGS: usize = 20_000;
pub const DEFAULT_MAX_BUFFERED_READINGS: usize = 500_000;
pub const DEFAULT_MAX_BUCKETS: usize = 100_000;
pub const DEFAULT_MAX_FLUSH_BUCKETS: usize = 10_000;
pub const DEFAULT_DEAD_LETTER_COLLECTION: &str = "rejected";
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;
pub const DEFAULT_DATABASE: &str = "hourglass";
pub const DEFAULT_COLLECTION: &str = "buckets";
pub const DEFAULT_SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_QUERY_RANGE: Duration = Duration::from_secs(400 * 24 * 3600);
pub const DEFAULT_MAX_POINTS: usize = 10_000;
pub const DEFAULT_MQTT_CLIENT_ID: &str = "hourglass";
pub const DEFAULT_MQTT_TOPIC_PREFIX: &str = "sensors";
pub const DEFAULT_MQTT_KEEP_ALIVE: Duration = Duration::from_secs(30);
pub const DEFAULT_MQTT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
pub const DEFAULT_MQTT_MAX_UNACKED: usize = 1000;
pub const DEFAULT_MQTT_RECONNECT_MIN: Duration = Duration::from_millis(100);
pub const DEFAULT_MQTT_RECONNECT_MAX: Duration = Duration::from_secs(30);
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub http: HttpSettings,
    pub ingest: IngestSettings,
    pub batcher: BatcherSettings,
    pub buckets: BucketSettings,
    pub mongodb: MongoSettings,
    pub query: QuerySettings,
    pub mqtt: MqttSettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
    pub shutdown: ShutdownSettings,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    pub max_body_bytes: usize,
    /// How long a synchronous write waits for its flush before answering 503.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Requests served at once; more get 503 straight away.
    pub max_concurrent_requests: usize,
    /// Longest an API request may take in all, body upload included (503 after).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().unwrap_or_else(|_| unreachable!()),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IngestSettings {
    #[serde(with = "humantime_serde")]
    pub max_future: Duration,
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    pub max_readings_per_request: usize,
}

impl Default for IngestSettings {
    fn default() -> Self {
        Self {
            max_future: DEFAULT_MAX_FUTURE,
            max_age: DEFAULT_MAX_AGE,
            max_readings_per_request: DEFAULT_MAX_READINGS_PER_REQUEST,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatcherSettings {
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    pub max_pending_readings: usize,
    pub max_buffered_readings: usize,
    /// Distinct buckets (sensor, metric, minute or hour) held at once.
    pub max_buckets: usize,
    /// Buckets one flush writes at most; more go out in the next flush at once.
    pub max_flush_buckets: usize,
}

impl Default for BatcherSettings {
    fn default() -> Self {
        Self {
            flush_interval: DEFAULT_FLUSH_INTERVAL,
            max_pending_readings: DEFAULT_MAX_PENDING_READINGS,
            max_buffered_readings: DEFAULT_MAX_BUFFERED_READINGS,
            max_buckets: DEFAULT_MAX_BUCKETS,
            max_flush_buckets: DEFAULT_MAX_FLUSH_BUCKETS,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BucketSettings {
    pub granularity: Granularity,
    /// Buckets are deleted (TTL index on `start`) this long after they begin;
    /// `None` ("off") keeps them.
    #[serde(with = "retention")]
    pub retention: Option<Duration>,
}

impl Default for BucketSettings {
    fn default() -> Self {
        Self {
            granularity: Granularity::Minute,
            retention: None,
        }
    }
}

impl BucketSettings {
    fn granularity_span(&self) -> Duration {
        Duration::from_secs(self.granularity.seconds().unsigned_abs())
    }
}

/// `"off"` or a duration such as `"90d"`.
mod retention {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de};

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_str("off"),
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim().eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        humantime::parse_duration(&text).map(Some).map_err(|e| {
            de::Error::custom(format!("{text:?} is neither \"off\" nor a duration: {e}"))
        })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MongoSettings {
    /// May hold credentials: never printed.
    #[serde(serialize_with = "serialize_secret")]
    pub uri: SecretString,
    pub database: String,
    pub collection: String,
    /// Readings storage can never apply (a bucket of the wrong shape) go here.
    pub dead_letter_collection: String,
    #[serde(with = "humantime_serde")]
    pub server_selection_timeout: Duration,
    pub tls: MongoTlsSettings,
}

/// TLS to MongoDB (the URI's `tls=true&tlsCAFile=…` options work too).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MongoTlsSettings {
    pub enabled: bool,
    /// PEM file of the certificate authorities to trust; system roots if unset.
    pub ca_file: Option<PathBuf>,
    /// PEM file holding the client certificate and its key, for mutual TLS.
    pub cert_key_file: Option<PathBuf>,
    /// Never in production: accepts any server certificate.
    pub allow_invalid_certificates: bool,
}

/// TLS to the MQTT broker, used with an `mqtts://` URL.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttTlsSettings {
    /// PEM file of the certificate authorities to trust (required for mqtts://).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS (both or neither).
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

fn check_file(key: &'static str, path: Option<&PathBuf>) -> Result<(), ConfigError> {
    match path {
        Some(p) if !p.is_file() => Err(invalid(
            key,
            format!("{} is not a readable file", p.display()),
        )),
        _ => Ok(()),
    }
}

fn serialize_opt_secret<S: serde::Serializer>(
    s: &Option<SecretString>,
    ser: S,
) -> Result<S::Ok, S::Error> {
    match s {
        Some(s) => serialize_secret(s, ser),
        None => ser.serialize_none(),
    }
}

fn serialize_secret<S: serde::Serializer>(s: &SecretString, ser: S) -> Result<S::Ok, S::Error> {
    use secrecy::ExposeSecret;
    // Only used to seed figment with defaults; the value is never logged.
    ser.serialize_str(s.expose_secret())
}

impl Default for MongoSettings {
    fn default() -> Self {
        Self {
            uri: SecretString::from(""),
            database: DEFAULT_DATABASE.to_owned(),
            collection: DEFAULT_COLLECTION.to_owned(),
            dead_letter_collection: DEFAULT_DEAD_LETTER_COLLECTION.to_owned(),
            server_selection_timeout: DEFAULT_SERVER_SELECTION_TIMEOUT,
            tls: MongoTlsSettings::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuerySettings {
    #[serde(with = "humantime_serde")]
    pub max_range: Duration,
    pub max_points: usize,
}

impl Default for QuerySettings {
    fn default() -> Self {
        Self {
            max_range: DEFAULT_MAX_QUERY_RANGE,
            max_points: DEFAULT_MAX_POINTS,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttSettings {
    pub enabled: bool,
    /// `mqtt://host:port`, or `mqtts://host:port` for TLS; empty means not configured.
    pub url: String,
    pub username: Option<String>,
    /// Never printed.
    #[serde(serialize_with = "serialize_opt_secret")]
    pub password: Option<SecretString>,
    pub tls: MqttTlsSettings,
    /// Stable across restarts: the broker keeps this client's session.
    pub client_id: String,
    pub topic_prefix: String,
    /// Subscribe through `$share/{group}/…` so instances split one stream.
    pub shared_group: Option<String>,
    /// Unusable messages are republished here with the reason, when set.
    pub dead_letter_topic: Option<String>,
    /// Ingest retained messages too. Off: a retained message is a reading
    /// already delivered once, and would be stored again at every subscribe.
    pub ingest_retained: bool,
    #[serde(with = "humantime_serde")]
    pub keep_alive: Duration,
    pub max_payload_bytes: usize,
    /// The broker's in-flight window for this client (Mosquitto's
    /// `max_inflight_messages`): with half of it waiting, flush at once.
    pub max_unacked: usize,
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
}

impl Default for MqttSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            url: String::new(),
            username: None,
            password: None,
            tls: MqttTlsSettings::default(),
            client_id: DEFAULT_MQTT_CLIENT_ID.to_owned(),
            topic_prefix: DEFAULT_MQTT_TOPIC_PREFIX.to_owned(),
            shared_group: None,
            dead_letter_topic: None,
            ingest_retained: false,
            keep_alive: DEFAULT_MQTT_KEEP_ALIVE,
            max_payload_bytes: DEFAULT_MQTT_MAX_PAYLOAD_BYTES,
            max_unacked: DEFAULT_MQTT_MAX_UNACKED,
            reconnect_min: DEFAULT_MQTT_RECONNECT_MIN,
            reconnect_max: DEFAULT_MQTT_RECONNECT_MAX,
        }
    }
}

impl MqttSettings {
    /// Whether `url` asks for TLS (`mqtts://`).
    pub fn uses_tls(&self) -> bool {
        self.url.starts_with("mqtts://")
    }

    /// `(host, port)` of `url`.
    pub fn host_port(&self) -> Result<(String, u16), ConfigError> {
        let rest = self
            .url
            .strip_prefix("mqtt://")
            .or_else(|| self.url.strip_prefix("mqtts://"))
            .ok_or_else(|| {
                invalid(
                    "mqtt.url",
                    "must look like mqtt://host:port or mqtts://host:port",
                )
            })?;
        let (host, port) = rest
            .trim_end_matches('/')
            .rsplit_once(':')
            .ok_or_else(|| invalid("mqtt.url", "must name a port: mqtt://host:port"))?;
        let port = port
            .parse::<u16>()
            .map_err(|_| invalid("mqtt.url", format!("{port:?} is not a port")))?;
        if host.is_empty() {
            return Err(invalid("mqtt.url", "must name a host"));
        }
        Ok((host.trim_matches(['[', ']']).to_owned(), port))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if self.url.is_empty() {
            return Err(invalid(
                "mqtt.url",
                "is not set: set it, or mqtt.enabled = false (`make run` starts a local broker and sets it for you)",
            ));
        }
        self.host_port()?;
        if self.uses_tls() && self.tls.ca_file.is_none() {
            return Err(invalid(
                "mqtt.tls.ca_file",
                "is required for an mqtts:// URL",
            ));
        }
        check_file("mqtt.tls.ca_file", self.tls.ca_file.as_ref())?;
        check_file(
            "mqtt.tls.client_cert_file",
            self.tls.client_cert_file.as_ref(),
        )?;
        check_file(
            "mqtt.tls.client_key_file",
            self.tls.client_key_file.as_ref(),
        )?;
        if self.tls.client_cert_file.is_some() != self.tls.client_key_file.is_some() {
            return Err(invalid(
                "mqtt.tls.client_key_file",
                "and mqtt.tls.client_cert_file go together",
            ));
        }
        if self.password.is_some() && self.username.is_none() {
            return Err(invalid("mqtt.password", "needs mqtt.username"));
        }
        let topic_ok = |t: &str| {
            !t.is_empty()
                && !t.starts_with('$')
                && !t.contains(['+', '#', '\0'])
                && !t.ends_with('/')
        };
        if !topic_ok(&self.topic_prefix) {
            return Err(invalid(
                "mqtt.topic_prefix",
                "must be a topic without wildcards, $ or a trailing /",
            ));
        }
        if self
            .dead_letter_topic
            .as_deref()
            .is_some_and(|t| !topic_ok(t))
        {
            return Err(invalid(
                "mqtt.dead_letter_topic",
                "must be a topic without wildcards, $ or a trailing /",
            ));
        }
        // The subscription is {prefix}/#, which also matches {prefix} itself.
        if let Some(topic) = self.dead_letter_topic.as_deref()
            && (topic == self.topic_prefix || topic.starts_with(&format!("{}/", self.topic_prefix)))
        {
            return Err(invalid(
                "mqtt.dead_letter_topic",
                format!(
                    "{topic:?} lies under mqtt.topic_prefix ({:?}): dead letters would be consumed again, for ever",
                    self.topic_prefix
                ),
            ));
        }
        if self
            .shared_group
            .as_deref()
            .is_some_and(|g| g.is_empty() || g.contains(['/', '+', '#']))
        {
            return Err(invalid(
                "mqtt.shared_group",
                "must be a non-empty name without / + #",
            ));
        }
        if self.client_id.is_empty() || self.client_id.len() > 128 {
            return Err(invalid("mqtt.client_id", "must be 1 to 128 characters"));
        }
        if self.max_payload_bytes == 0 || self.max_unacked == 0 {
            return Err(invalid(
                "mqtt.max_payload_bytes / mqtt.max_unacked",
                "must be at least 1",
            ));
        }
        if self.reconnect_min.is_zero() || self.reconnect_min > self.reconnect_max {
            return Err(invalid(
                "mqtt.reconnect_min",
                "must be above zero and at most mqtt.reconnect_max",
            ));
        }
        if self.keep_alive < Duration::from_secs(1) {
            return Err(invalid("mqtt.keep_alive", "must be at least 1s"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Pretty,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
    /// A tracing filter (`info`, `hourglass=debug,info`); `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Pretty,
            level: "info".to_owned(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownSettings {
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

impl Settings {
    /// Defaults, then `file` if given, then the environment; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::extract(Self::base(file)?.merge(Env::prefixed(ENV_PREFIX).split("__")))
    }

    /// Defaults and `file` alone, ignoring the environment: what the file says.
    pub fn load_file(file: &Path) -> Result<Self, ConfigError> {
        Self::extract(Self::base(Some(file))?)
    }

    fn base(file: Option<&Path>) -> Result<Figment, ConfigError> {
        let figment = Figment::from(Serialized::defaults(Settings::default()));
        match file {
            Some(file) if !file.exists() => Err(invalid(
                "--config",
                format!("{} does not exist", file.display()),
            )),
            Some(file) => Ok(figment.merge(Toml::file(file))),
            None => Ok(figment),
        }
    }

    fn extract(figment: Figment) -> Result<Self, ConfigError> {
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        use secrecy::ExposeSecret;
        if self.mongodb.uri.expose_secret().trim().is_empty() {
            return Err(invalid(
                "mongodb.uri",
                "is not set: set it in the config file or HOURGLASS__MONGODB__URI (`make run` starts a local server and sets it for you)",
            ));
        }
        if !self.mongodb.uri.expose_secret().starts_with("mongodb://")
            && !self
                .mongodb
                .uri
                .expose_secret()
                .starts_with("mongodb+srv://")
        {
            return Err(invalid(
                "mongodb.uri",
                "must start with mongodb:// or mongodb+srv://",
            ));
        }
        for (key, name) in [
            ("mongodb.database", &self.mongodb.database),
            ("mongodb.collection", &self.mongodb.collection),
            (
                "mongodb.dead_letter_collection",
                &self.mongodb.dead_letter_collection,
            ),
        ] {
            if name.is_empty() || name.contains(['$', '.', '\0', '/', ' ']) {
                return Err(invalid(key, "must be non-empty without $ . / space or NUL"));
            }
        }
        let positive = [
            ("http.max_body_bytes", self.http.max_body_bytes),
            (
                "ingest.max_readings_per_request",
                self.ingest.max_readings_per_request,
            ),
            (
                "batcher.max_pending_readings",
                self.batcher.max_pending_readings,
            ),
            (
                "batcher.max_buffered_readings",
                self.batcher.max_buffered_readings,
            ),
            ("query.max_points", self.query.max_points),
            ("batcher.max_buckets", self.batcher.max_buckets),
            ("batcher.max_flush_buckets", self.batcher.max_flush_buckets),
            (
                "http.max_concurrent_requests",
                self.http.max_concurrent_requests,
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        for (key, value) in [
            ("http.write_timeout", self.http.write_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("batcher.flush_interval", self.batcher.flush_interval),
            ("query.max_range", self.query.max_range),
            ("shutdown.timeout", self.shutdown.timeout),
        ] {
            if value.is_zero() {
                return Err(invalid(key, "must be longer than zero"));
            }
        }
        if self.mongodb.tls.enabled {
            check_file("mongodb.tls.ca_file", self.mongodb.tls.ca_file.as_ref())?;
            check_file(
                "mongodb.tls.cert_key_file",
                self.mongodb.tls.cert_key_file.as_ref(),
            )?;
        }
        if self.batcher.max_buffered_readings < self.ingest.max_readings_per_request {
            return Err(invalid(
                "batcher.max_buffered_readings",
                format!(
                    "({}) must be at least ingest.max_readings_per_request ({}), or a full request could never be taken",
                    self.batcher.max_buffered_readings, self.ingest.max_readings_per_request
                ),
            ));
        }
        if self.mongodb.dead_letter_collection == self.mongodb.collection {
            return Err(invalid(
                "mongodb.dead_letter_collection",
                "must differ from mongodb.collection",
            ));
        }
        if self.http.request_timeout <= self.http.write_timeout {
            return Err(invalid(
                "http.request_timeout",
                "must be longer than http.write_timeout, or synchronous writes could never answer",
            ));
        }
        // One request's readings may each open a bucket of their own.
        if self.batcher.max_buckets < self.ingest.max_readings_per_request {
            return Err(invalid(
                "batcher.max_buckets",
                format!(
                    "({}) must be at least ingest.max_readings_per_request ({}), or a full request could never be taken",
                    self.batcher.max_buckets, self.ingest.max_readings_per_request
                ),
            ));
        }
        if self.batcher.max_pending_readings > self.batcher.max_buffered_readings {
            return Err(invalid(
                "batcher.max_pending_readings",
                "must not exceed batcher.max_buffered_readings",
            ));
        }
        if let Some(retention) = self.buckets.retention
            && retention < self.ingest.max_age + self.buckets.granularity_span()
        {
            return Err(invalid(
                "buckets.retention",
                "must be longer than ingest.max_age plus one bucket, or accepted backfill would be deleted at once",
            ));
        }
        self.mqtt.validate()?;
        self.auth
            .validate()
            .map_err(|e| invalid("auth", e.to_string()))?;
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid("log.level", e.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
// figment's Jail API fixes the closure's error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_default_file_loads_once_a_uri_is_given() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HOURGLASS__MONGODB__URI", "mongodb://127.0.0.1:1");
            jail.set_env("HOURGLASS__BUCKETS__GRANULARITY", "hour");
            jail.set_env("HOURGLASS__HTTP__LISTEN", "127.0.0.1:0");
            jail.set_env("HOURGLASS__MQTT__URL", "mqtt://[::1]:1883");
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml");
            let s = Settings::load(Some(&path)).map_err(|e| e.to_string())?;
            assert_eq!(s.buckets.granularity, Granularity::Hour);
            assert_eq!(s.http.listen.port(), 0);
            assert_eq!(s.batcher.flush_interval, DEFAULT_FLUSH_INTERVAL);
            assert_eq!(
                s.mqtt.host_port().map_err(|e| e.to_string())?,
                ("::1".to_owned(), 1883)
            );
            Ok(())
        });
    }

    #[test]
    fn an_unknown_key_stops_startup_naming_the_key() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "[batcher]\nflush_intervall = \"1s\"\n")?;
            jail.set_env("HOURGLASS__MONGODB__URI", "mongodb://127.0.0.1:1");
            let err = Settings::load(Some(Path::new("bad.toml"))).expect_err("unknown key");
            let msg = err.to_string();
            assert!(msg.contains("flush_intervall"), "{msg}");
            Ok(())
        });
    }

    #[test]
    fn an_invalid_value_from_the_environment_names_the_key() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HOURGLASS__MONGODB__URI", "mongodb://127.0.0.1:1");
            jail.set_env("HOURGLASS__BUCKETS__GRANULARITY", "fortnight");
            let msg = Settings::load(None).expect_err("bad value").to_string();
            assert!(msg.to_lowercase().contains("buckets.granularity"), "{msg}");
            Ok(())
        });
    }

    #[test]
    fn a_missing_uri_is_explained() {
        let msg = Settings::default()
            .validate()
            .expect_err("no uri")
            .to_string();
        assert!(msg.contains("mongodb.uri"), "{msg}");
    }

    #[test]
    fn inconsistent_limits_are_refused() {
        let mut s = Settings::default();
        s.mongodb.uri = SecretString::from("mongodb://x");
        s.mqtt.url = "mqtt://127.0.0.1:1883".into();
        assert!(s.validate().is_ok());
        s.batcher.max_buffered_readings = 10;
        let msg = s.validate().expect_err("too small").to_string();
        assert!(msg.contains("batcher.max_buffered_readings"), "{msg}");
        s = Settings::default();
        s.mongodb.uri = SecretString::from("mongodb://x");
        s.mqtt.enabled = false;
        s.batcher.flush_interval = Duration::ZERO;
        assert!(
            s.validate()
                .expect_err("zero")
                .to_string()
                .contains("batcher.flush_interval")
        );
    }

    #[test]
    fn retention_is_off_or_a_duration_longer_than_the_backfill_window() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("HOURGLASS__MONGODB__URI", "mongodb://127.0.0.1:1");
            jail.set_env("HOURGLASS__MQTT__ENABLED", "false");
            jail.set_env("HOURGLASS__BUCKETS__RETENTION", "90d");
            let s = Settings::load(None).map_err(|e| e.to_string())?;
            assert_eq!(s.buckets.retention, Some(Duration::from_secs(90 * 86400)));
            jail.set_env("HOURGLASS__BUCKETS__RETENTION", "off");
            assert_eq!(
                Settings::load(None)
                    .map_err(|e| e.to_string())?
                    .buckets
                    .retention,
                None
            );
            jail.set_env("HOURGLASS__BUCKETS__RETENTION", "7d");
            let msg = Settings::load(None)
                .expect_err("shorter than max_age")
                .to_string();
            assert!(msg.contains("buckets.retention"), "{msg}");
            jail.set_env("HOURGLASS__BUCKETS__RETENTION", "sometimes");
            let msg = Settings::load(None)
                .expect_err("not a duration")
                .to_string();
            assert!(msg.to_lowercase().contains("retention"), "{msg}");
            Ok(())
        });
    }

    #[test]
    fn mqtt_settings_are_checked_only_when_enabled() {
        let mut s = Settings::default();
        s.mongodb.uri = SecretString::from("mongodb://x");
        assert!(
            s.validate()
                .expect_err("no url")
                .to_string()
                .contains("mqtt.url")
        );
        s.mqtt.enabled = false;
        assert!(s.validate().is_ok());
        s.mqtt.enabled = true;
        for (url, ok) in [
            ("mqtt://h:1883", true),
            ("tcp://h:1", false),
            ("mqtt://h", false),
            ("mqtt://:1", false),
            ("mqtt://h:99999", false),
        ] {
            s.mqtt.url = url.into();
            assert_eq!(s.validate().is_ok(), ok, "{url}");
        }
        s.mqtt.url = "mqtt://h:1883".into();
        s.mqtt.topic_prefix = "sensors/#".into();
        assert!(
            s.validate()
                .expect_err("wildcard")
                .to_string()
                .contains("mqtt.topic_prefix")
        );
        s.mqtt.topic_prefix = "sensors".into();
        s.mqtt.dead_letter_topic = Some("sensors/dead".into());
        assert!(
            s.validate()
                .expect_err("a loop")
                .to_string()
                .contains("mqtt.dead_letter_topic")
        );
        s.mqtt.dead_letter_topic = Some("sensors-dead".into());
        assert!(s.validate().is_ok());
        s.mqtt.shared_group = Some("a/b".into());
        assert!(
            s.validate()
                .expect_err("slash")
                .to_string()
                .contains("mqtt.shared_group")
        );
    }

    #[test]
    fn tls_settings_parse_and_name_missing_files() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("ca.pem", "-----BEGIN CERTIFICATE-----\n")?;
            jail.create_file("client.pem", "cert+key")?;
            jail.create_file(
                "tls.toml",
                r#"
                [mongodb]
                uri = "mongodb://db.example:27017"
                [mongodb.tls]
                enabled = true
                ca_file = "ca.pem"
                cert_key_file = "client.pem"
                [mqtt]
                url = "mqtts://broker.example:8883"
                username = "hourglass"
                password = "pw"
                [mqtt.tls]
                ca_file = "ca.pem"
                client_cert_file = "client.pem"
                client_key_file = "client.pem"
                "#,
            )?;
            let s = Settings::load_file(Path::new("tls.toml")).map_err(|e| e.to_string())?;
            assert!(s.mongodb.tls.enabled);
            assert_eq!(s.mongodb.tls.ca_file.as_deref(), Some(Path::new("ca.pem")));
            assert!(s.mqtt.uses_tls());
            assert_eq!(
                s.mqtt.host_port().map_err(|e| e.to_string())?,
                ("broker.example".to_owned(), 8883)
            );
            assert!(
                !format!("{s:?}").contains("\"pw\""),
                "the MQTT password is not printed"
            );

            jail.create_file("missing.toml", "[mongodb]\nuri = \"mongodb://x\"\n[mongodb.tls]\nenabled = true\nca_file = \"nope.pem\"\n[mqtt]\nenabled = false\n")?;
            let msg = Settings::load_file(Path::new("missing.toml"))
                .expect_err("missing file")
                .to_string();
            assert!(
                msg.contains("mongodb.tls.ca_file") && msg.contains("nope.pem"),
                "{msg}"
            );

            jail.create_file(
                "noca.toml",
                "[mongodb]\nuri = \"mongodb://x\"\n[mqtt]\nurl = \"mqtts://b:8883\"\n",
            )?;
            let msg = Settings::load_file(Path::new("noca.toml"))
                .expect_err("no CA")
                .to_string();
            assert!(msg.contains("mqtt.tls.ca_file"), "{msg}");
            Ok(())
        });
    }

    /// `section.key` paths of a JSON object, nested sections included.
    fn key_paths(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
        if let serde_json::Value::Object(map) = v {
            for (k, child) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if child.is_object() {
                    key_paths(&path, child, out);
                } else {
                    out.push(path);
                }
            }
        }
    }

    #[test]
    fn the_default_file_documents_every_setting() {
        let mut wanted = Vec::new();
        key_paths(
            "",
            &serde_json::to_value(Settings::default()).expect("serializes"),
            &mut wanted,
        );
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml"),
        )
        .expect("config/default.toml");
        // Keys as written, set or commented out, under their [section].
        let mut documented = std::collections::HashSet::new();
        let mut section = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.trim_matches(['[', ']']).to_owned();
                continue;
            }
            let line = line.trim_start_matches('#').trim();
            if let Some((key, _)) = line.split_once(" = ")
                && !key.contains(' ')
            {
                documented.insert(format!("{section}.{key}"));
            }
        }
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|k| !documented.contains(*k) && !k.starts_with("auth.tokens"))
            .collect();
        assert!(
            missing.is_empty(),
            "config/default.toml does not document {missing:?}"
        );
    }

    #[test]
    fn the_uri_never_shows_in_debug_output() {
        let mut s = Settings::default();
        s.mongodb.uri = SecretString::from("mongodb://user:hunter2@db");
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
