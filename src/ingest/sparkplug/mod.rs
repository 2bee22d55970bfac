//! Sparkplug B over the MQTT connection: Hourglass as a host application.
//!
//! - `payload`: topics, protobuf payloads (`srad-types`), datatypes to
//!   numbers, Sparkplug names to Hourglass's;
//! - `birth`: birth certificates, and metrics resolved through them into
//!   readings;
//! - `host`: the pure state machine of births, aliases, `seq`/`bdSeq`,
//!   deaths and rebirth requests, driven by the MQTT processor with the
//!   clock passed in;
//! - `settings`: `[mqtt.sparkplug]`.
//!
//! Messages ride the MQTT ingest's at-least-once path: a message is
//! acknowledged once its readings are journaled, and an unusable one is
//! dead-lettered like any other MQTT message.

mod birth;
pub mod host;
pub mod payload;
mod settings;

pub use host::{BIRTH_PREFIX, Birth, Effects, Host, Rules};
pub use payload::NAMESPACE;
pub use settings::Settings;

impl Settings {
    /// The host's rules for these settings.
    pub fn rules(&self, window: crate::domain::TimeWindow) -> Rules {
        Rules {
            device_sensor: self.device_sensor.clone(),
            node_sensor: self.node_sensor.clone(),
            reorder_timeout_ms: self.reorder_timeout.as_millis() as u64,
            rebirth_cooldown_ms: self.rebirth_cooldown.as_millis() as u64,
            window,
            property_labels: self.property_labels,
            max_edge_nodes: self.max_edge_nodes,
            max_devices_per_node: self.max_devices_per_node,
            max_state_bytes: self.max_state_bytes,
        }
    }
}

/// Where birth certificates are kept across restarts (the service's
/// database; see `startup`).
pub trait BirthBook: Send + Sync {
    /// Keeps `birth`, replacing the node's (or device's) older one; never
    /// waits (a birth not kept costs a rebirth request after a restart).
    fn save(&self, birth: Birth);
    /// Every kept birth.
    fn load(&self) -> futures_util::future::BoxFuture<'_, Result<Vec<Birth>, String>>;
}
