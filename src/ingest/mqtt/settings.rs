//! `[mqtt]`: the broker, the session, the topics.

use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use crate::settings::{Invalid, check_file, invalid, invalid_at, serialize_opt_secret};

/// Slack over the payload limit for the topic and packet header, both ways.
pub(super) const PACKET_OVERHEAD: usize = 64 * 1024;
pub const DEFAULT_CLIENT_ID: &str = "hourglass";
pub const DEFAULT_TOPIC_PREFIX: &str = "sensors";
pub const DEFAULT_LINE_PROTOCOL_TOPIC: &str = "telegraf/#";
/// Where unusable messages are republished unless configured otherwise
/// (the example ACL, `config/mosquitto.acl`, lets Hourglass write it).
pub const DEFAULT_DEAD_LETTER_TOPIC: &str = "hourglass/dead-letters";
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
pub const DEFAULT_MAX_DEAD_LETTER_BYTES: usize = 64 * 1024;
pub const DEFAULT_MAX_UNACKED: usize = 1000;
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;
pub const DEFAULT_RECONNECT_MIN: Duration = Duration::from_millis(100);
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(30);

/// The MQTT version to connect with. Read from text or a number, since
/// `HOURGLASS__MQTT__PROTOCOL=5` arrives as a number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum Protocol {
    /// MQTT 5, falling back to 3.1.1 with a broker that does not speak it.
    #[default]
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "5")]
    V5,
    #[serde(rename = "3.1.1")]
    V311,
}

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Text(String),
            Number(f64),
            Other(serde::de::IgnoredAny),
        }
        match Given::deserialize(d)? {
            Given::Text(t) if t == "auto" => Ok(Protocol::Auto),
            Given::Text(t) if t == "5" => Ok(Protocol::V5),
            Given::Number(5.0) => Ok(Protocol::V5),
            Given::Text(t) if t == "3.1.1" => Ok(Protocol::V311),
            _ => Err(serde::de::Error::custom(
                "must be \"auto\", \"5\" or \"3.1.1\"",
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub enabled: bool,
    /// `mqtt://host:port`, or `mqtts://host:port` for TLS; empty means not configured.
    pub url: String,
    /// `auto` (MQTT 5, or 3.1.1 with a broker that does not speak 5), `5`
    /// or `3.1.1`.
    pub protocol: Protocol,
    pub username: Option<String>,
    /// Never printed.
    #[serde(serialize_with = "serialize_opt_secret")]
    pub password: Option<SecretString>,
    pub tls: TlsSettings,
    /// Stable across restarts: the broker keeps this client's session.
    pub client_id: String,
    pub topic_prefix: String,
    /// Subscribe through `$share/{group}/…` so instances split one stream.
    pub shared_group: Option<String>,
    /// A topic filter whose messages are InfluxDB line protocol (Telegraf's
    /// `outputs.mqtt`); empty subscribes to none.
    pub line_protocol_topic: String,
    /// Unusable messages are republished here with the reason; empty: none
    /// (not while Sparkplug is enabled).
    pub dead_letter_topic: String,
    /// Ingest retained messages too. Off: a retained message is a reading
    /// already delivered once, and would be stored again at every subscribe.
    pub ingest_retained: bool,
    #[serde(with = "humantime_serde")]
    pub keep_alive: Duration,
    pub max_payload_bytes: usize,
    /// A dead letter's largest body: a larger one keeps the payload's start,
    /// its length and SHA-256. Below the broker's packet limit, so a letter
    /// can never be refused (a refused publish drops the connection, and the
    /// session would send it again at every reconnect).
    pub max_dead_letter_bytes: usize,
    /// The broker's in-flight window for this client: MQTT 5's Receive
    /// Maximum (3.1.1: the broker's own setting, Mosquitto's
    /// `max_inflight_messages`); with half of it waiting, flush at once.
    pub max_unacked: usize,
    /// Bytes of received messages waiting to be decoded: past it a QoS 0
    /// message is dropped and counted, a QoS 1 one waits (the broker's
    /// window holds the rest). A quarter of it again for dead letters
    /// waiting to be published.
    pub max_queued_bytes: usize,
    /// Labels from messages (line-protocol tags, Sparkplug births'
    /// ids, properties and state) go to the registry. MQTT has no tokens:
    /// the broker's ACLs decide who may publish them; off, none do.
    pub labels_from_messages: bool,
    #[serde(with = "humantime_serde")]
    pub reconnect_min: Duration,
    #[serde(with = "humantime_serde")]
    pub reconnect_max: Duration,
    pub sparkplug: crate::ingest::sparkplug::Settings,
    /// Topic and payload routes for firmware of its own (`[[mqtt.routes]]`),
    /// in order: the first whose topic matches takes a message; one none
    /// matches goes to `topic_prefix` and line protocol as before.
    pub routes: Vec<crate::ingest::routes::RouteSettings>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            enabled: true,
            url: String::new(),
            protocol: Protocol::Auto,
            username: None,
            password: None,
            tls: TlsSettings::default(),
            client_id: DEFAULT_CLIENT_ID.to_owned(),
            topic_prefix: DEFAULT_TOPIC_PREFIX.to_owned(),
            shared_group: None,
            line_protocol_topic: DEFAULT_LINE_PROTOCOL_TOPIC.to_owned(),
            dead_letter_topic: DEFAULT_DEAD_LETTER_TOPIC.to_owned(),
            ingest_retained: false,
            keep_alive: DEFAULT_KEEP_ALIVE,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_dead_letter_bytes: DEFAULT_MAX_DEAD_LETTER_BYTES,
            max_unacked: DEFAULT_MAX_UNACKED,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            labels_from_messages: true,
            reconnect_min: DEFAULT_RECONNECT_MIN,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            routes: Vec::new(),
            sparkplug: crate::ingest::sparkplug::Settings::default(),
        }
    }
}

/// TLS to the MQTT broker, used with an `mqtts://` URL.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// PEM file of the certificate authorities to trust (required for mqtts://).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for mutual TLS (both or neither).
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

impl Settings {
    /// Whether `url` asks for TLS (`mqtts://`).
    pub fn uses_tls(&self) -> bool {
        self.url.starts_with("mqtts://")
    }

    /// `(host, port)` of `url`.
    pub fn host_port(&self) -> Result<(String, u16), Invalid> {
        let url = url::Url::parse(&self.url)
            .map_err(|e| invalid("mqtt.url", format!("{:?} is not a URL: {e}", self.url)))?;
        if !matches!(url.scheme(), "mqtt" | "mqtts") {
            return Err(invalid(
                "mqtt.url",
                "must look like mqtt://host:port or mqtts://host:port",
            ));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| invalid("mqtt.url", "must name a host"))?;
        let port = url
            .port()
            .ok_or_else(|| invalid("mqtt.url", "must name a port: mqtt://host:port"))?;
        Ok((host.trim_matches(['[', ']']).to_owned(), port))
    }

    /// The line-protocol topic filter, if any.
    pub fn line_protocol(&self) -> Option<&str> {
        Some(self.line_protocol_topic.as_str()).filter(|t| !t.is_empty())
    }

    /// Bytes of dead letters that may wait to be published.
    pub fn dead_letter_backlog(&self) -> usize {
        (self.max_queued_bytes / 4).max(self.max_dead_letter_bytes.saturating_mul(2))
    }

    /// Where unusable messages are republished, if anywhere.
    pub fn dead_letters(&self) -> Option<&str> {
        Some(self.dead_letter_topic.as_str()).filter(|t| !t.is_empty())
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        // Long: one check per setting, each naming its key.
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
        self.sparkplug.validate()?;
        let routes = crate::ingest::routes::compile(&self.routes)
            .map_err(|e| invalid_at(format!("mqtt.routes[{}].{}", e.index, e.key), e.reason))?;
        if let Some(letters) = self.dead_letters()
            && let Some(route) = routes
                .iter()
                .find(|r| rumqttc::matches(letters, &r.pattern.filter()))
        {
            return Err(invalid_at(
                format!("mqtt.routes[{}].topic", route.index),
                format!(
                    "route {:?} subscribes to the dead letters' topic {letters:?}: each letter would be consumed again, for ever",
                    route.name
                ),
            ));
        }
        if self.sparkplug.enabled && self.dead_letters().is_none() {
            return Err(invalid(
                "mqtt.dead_letter_topic",
                "may not be empty while mqtt.sparkplug is enabled: unusable Sparkplug messages (data before a birth, unknown aliases) are republished there, never dropped",
            ));
        }
        if self.sparkplug.enabled
            && (self.topic_prefix == crate::ingest::sparkplug::NAMESPACE
                || self.topic_prefix.starts_with("spBv1.0/"))
        {
            return Err(invalid(
                "mqtt.topic_prefix",
                "may not lie under spBv1.0/ while mqtt.sparkplug is enabled",
            ));
        }
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
        if self.dead_letters().is_some_and(|t| !topic_ok(t)) {
            return Err(invalid(
                "mqtt.dead_letter_topic",
                "must be a topic without wildcards, $ or a trailing /",
            ));
        }
        // The subscription is {prefix}/#, which also matches {prefix} itself.
        if let Some(topic) = self.dead_letters()
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
        if let Some(filter) = self.line_protocol() {
            if filter.starts_with('$') || !rumqttc::valid_filter(filter) {
                return Err(invalid(
                    "mqtt.line_protocol_topic",
                    "must be a valid topic filter (+ and # as whole levels, no leading $)",
                ));
            }
            // A message matching both subscriptions would be delivered twice.
            let probe = format!("{}/probe/probe", self.topic_prefix);
            if rumqttc::matches(&probe, filter)
                || filter.starts_with(&format!("{}/", self.topic_prefix))
            {
                return Err(invalid(
                    "mqtt.line_protocol_topic",
                    format!(
                        "{filter:?} overlaps mqtt.topic_prefix ({:?})",
                        self.topic_prefix
                    ),
                ));
            }
            if let Some(topic) = self.dead_letters()
                && rumqttc::matches(topic, filter)
            {
                return Err(invalid(
                    "mqtt.dead_letter_topic",
                    format!(
                        "{topic:?} matches mqtt.line_protocol_topic: dead letters would be consumed again, for ever"
                    ),
                ));
            }
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
        // A letter and its topic must fit the packet the client may send.
        let packet = self.max_payload_bytes.saturating_add(PACKET_OVERHEAD);
        let letter = self
            .max_dead_letter_bytes
            .saturating_add(self.dead_letter_topic.len())
            .saturating_add(16);
        if self.max_dead_letter_bytes < 1024 || letter > packet {
            return Err(invalid(
                "mqtt.max_dead_letter_bytes",
                "must be at least 1024, and with mqtt.dead_letter_topic fit the packet limit (mqtt.max_payload_bytes + 64 KiB)",
            ));
        }
        if self.max_queued_bytes < 64 * 1024 {
            return Err(invalid("mqtt.max_queued_bytes", "must be at least 65536"));
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
