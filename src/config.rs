//! The settings tree, assembled from the components' own settings types:
//! built-in defaults, then a TOML file, then `HOURGLASS__SECTION__KEY`
//! environment variables, validated at startup with messages naming the key.
//! Each section's type and checks live next to its component; this file only
//! assembles, loads, and checks what spans components.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, invalid};
use crate::{
    api, auth, batcher, cardinality, ingest, journal, query, runtime, shutdown, store, telemetry,
};

pub const ENV_PREFIX: &str = "HOURGLASS__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("invalid configuration: {0}")]
    Invalid(#[from] Invalid),
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub http: api::Settings,
    pub ingest: ingest::Settings,
    pub cardinality: cardinality::Settings,
    pub batcher: batcher::Settings,
    pub journal: journal::Settings,
    pub buckets: store::BucketSettings,
    pub retention: store::RetentionSettings,
    pub mongodb: store::mongo::Settings,
    pub query: query::Settings,
    pub line_protocol: ingest::line_protocol::Settings,
    pub mqtt: ingest::mqtt::Settings,
    pub auth: auth::Settings,
    pub log: telemetry::Settings,
    pub shutdown: shutdown::Settings,
    pub runtime: runtime::Settings,
}

impl Settings {
    /// How long each level is kept, resolved (valid settings: see `validate`).
    pub fn retention(&self) -> store::Retention {
        self.retention
            .resolve(self.buckets.retention, self.buckets.granularity)
            .unwrap_or_default()
    }

    /// Defaults, then `file` if given, then the environment; validated.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::extract(Self::base(file)?.merge(Env::prefixed(ENV_PREFIX).split("__")))
    }

    /// For the clients of a running instance (`import`, `export`,
    /// `delete`): like [`Settings::load`], but `file` is optional and only
    /// what a client uses is checked (no server, broker or journal needed).
    pub fn load_client(file: Option<&Path>) -> Result<Self, ConfigError> {
        let figment = Self::base(file)?.merge(Env::prefixed(ENV_PREFIX).split("__"));
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.http.validate()?;
        settings.ingest.validate()?;
        settings.line_protocol.validate()?;
        settings.runtime.validate()?;
        Ok(settings)
    }

    /// The `[auth]` section alone (defaults, `file`, the environment), for
    /// a reload of the tokens: a fault elsewhere in the file, made for the
    /// next restart, does not hold a revocation back.
    pub fn load_auth(file: &Path) -> Result<crate::auth::Settings, ConfigError> {
        let figment = Self::base(Some(file))?.merge(Env::prefixed(ENV_PREFIX).split("__"));
        Ok(figment.extract_inner("auth").map_err(Box::new)?)
    }

    /// Defaults and `file` alone, ignoring the environment: what the file says.
    pub fn load_file(file: &Path) -> Result<Self, ConfigError> {
        Self::extract(Self::base(Some(file))?)
    }

    fn base(file: Option<&Path>) -> Result<Figment, ConfigError> {
        let figment = Figment::from(Serialized::defaults(Settings::default()));
        match file {
            Some(file) if !file.exists() => {
                Err(invalid("--config", format!("{} does not exist", file.display())).into())
            }
            Some(file) => Ok(figment.merge(Toml::file(file))),
            None => Ok(figment),
        }
    }

    fn extract(figment: Figment) -> Result<Self, ConfigError> {
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Every section's own checks, then those that span sections.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.mongodb.validate()?;
        self.http.validate()?;
        self.ingest.validate()?;
        self.cardinality.validate()?;
        self.line_protocol.validate()?;
        self.batcher.validate()?;
        self.journal.validate()?;
        self.query.validate()?;
        self.shutdown.validate()?;
        self.runtime.validate()?;
        let per_request = self.ingest.max_readings_per_request;
        // One request's readings may each open a bucket and hold a value.
        for (key, bound) in [
            (
                "batcher.max_buffered_readings",
                self.batcher.max_buffered_readings,
            ),
            ("batcher.max_buckets", self.batcher.max_buckets),
        ] {
            if bound < per_request {
                return Err(invalid(
                    key,
                    format!(
                        "({bound}) must be at least ingest.max_readings_per_request ({per_request}), or a full request could never be taken"
                    ),
                )
                .into());
            }
        }
        if self.buckets.late_rollup_after > std::time::Duration::from_secs(60) {
            return Err(invalid(
                "buckets.late_rollup_after",
                "must be at most 1m: a marked hour is rolled up a minute after its first mark at the latest",
            )
            .into());
        }
        if crate::domain::Sketch::new(self.buckets.sketch_accuracy).is_err() {
            return Err(invalid(
                "buckets.sketch_accuracy",
                "must be at least 0.0001 and below 0.5 (0.01: percentiles within 1 %)",
            )
            .into());
        }
        if self.buckets.rollup_after <= self.batcher.hold_grace {
            return Err(invalid(
                "buckets.rollup_after",
                "must be longer than batcher.hold_grace: the held buckets of an hour's last minutes are written that long after it ends",
            )
            .into());
        }
        let retention = self
            .retention
            .resolve(self.buckets.retention, self.buckets.granularity)
            .map_err(|e| invalid(e.key, e.message))?;
        if let Some(kept) = retention.buckets
            && kept < self.ingest.max_age + self.buckets.span()
        {
            let key = if self.buckets.retention.is_some() {
                "buckets.retention"
            } else {
                "retention.buckets"
            };
            return Err(invalid(
                key,
                "must be longer than ingest.max_age plus one bucket, or accepted backfill would be deleted at once",
            )
            .into());
        }
        self.mqtt.validate()?;
        self.auth
            .validate()
            .map_err(|e| invalid("auth", e.to_string()))?;
        self.log.validate()?;
        Ok(())
    }
}

#[cfg(test)]
// figment's Jail API fixes the closure's error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use crate::domain::Granularity;
    use secrecy::SecretString;
    use std::time::Duration;

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
            assert_eq!(
                s.batcher.flush_interval,
                batcher::Settings::default().flush_interval
            );
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
        // Requests being handled never give way at the connection cap:
        // there must be connections beyond them.
        s = Settings::default();
        s.mongodb.uri = SecretString::from("mongodb://x");
        s.mqtt.enabled = false;
        s.http.max_connections = s.http.max_concurrent_requests;
        assert!(
            s.validate()
                .expect_err("no connection beyond the requests")
                .to_string()
                .contains("http.max_connections")
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
        s.mqtt.dead_letter_topic = "sensors/dead".into();
        assert!(
            s.validate()
                .expect_err("a loop")
                .to_string()
                .contains("mqtt.dead_letter_topic")
        );
        s.mqtt.dead_letter_topic = "sensors-dead".into();
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
