//! The Sparkplug host application as a pure state machine: births and
//! aliases, sequence numbers, deaths and rebirth requests. Time (`now_ms`)
//! and I/O are the caller's; every decision is here, property-tested
//! against a model.

use std::collections::{BTreeMap, HashMap};

use srad_types::payload::Payload;

pub use super::birth::{BIRTH_PREFIX, Birth, Out, Skipped};
use super::birth::{Refusal, Table, bd_seq_of, definitions, labels, readings};
use super::payload::{Kind, Topic, sensor_part};
use crate::domain::{SensorId, TimeWindow};

/// How the host maps and paces (from [`super::Settings`]).
#[derive(Debug, Clone)]
pub struct Rules {
    /// Sensor id of a device's metrics: `{group}`, `{edge_node}`, `{device}`.
    pub device_sensor: String,
    /// Sensor id of an edge node's own metrics: `{group}`, `{edge_node}`.
    pub node_sensor: String,
    /// How long a sequence gap may stay open before a rebirth is asked for.
    pub reorder_timeout_ms: u64,
    /// At most one rebirth request per edge node within this time.
    pub rebirth_cooldown_ms: u64,
    pub window: TimeWindow,
    /// Births' `Properties/<name>` strings become labels.
    pub property_labels: bool,
    /// Edge nodes with state; a birth from one more is refused.
    pub max_edge_nodes: usize,
    pub max_devices_per_node: usize,
    /// Bytes of births kept for every node and device together.
    pub max_state_bytes: usize,
}

/// What one message (or a tick) asks of the caller.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Effects {
    pub readings: Vec<Out>,
    /// The message cannot be used: dead-letter it with this reason. None of
    /// its readings are in `readings`.
    pub dead_letter: Option<String>,
    /// Publish `Node Control/Rebirth` to these `(group, edge node)`s.
    pub rebirth: Vec<(String, String)>,
    /// Sensors whose Sparkplug state changed: `(sensor, online)`.
    pub presence: Vec<(String, bool)>,
    /// Labels to merge into the registry: `(sensor, labels)`.
    pub labels: Vec<(String, Vec<(String, String)>)>,
    /// Births to persist.
    pub births: Vec<Birth>,
    pub skipped: Skipped,
    /// A death whose `bdSeq` is not the current birth's (a late Will).
    pub stale_death: bool,
    /// Rebirth requests not sent because of the cooldown.
    pub rebirths_held: u64,
}

#[derive(Debug, Default)]
struct Device {
    online: bool,
    table: Option<Table>,
    /// What its table (and its id) count in [`Host::state_bytes`].
    bytes: usize,
}

#[derive(Debug, Default)]
struct Node {
    online: bool,
    bd_seq: Option<u64>,
    table: Option<Table>,
    /// The next `seq` expected; `None` until a birth (or after a restore).
    next_seq: Option<u8>,
    /// Sequence numbers skipped over, and when the wait for them ends.
    missing: Seqs,
    gap_deadline: Option<u64>,
    devices: BTreeMap<String, Device>,
    /// What its table (and its ids) count in [`Host::state_bytes`].
    bytes: usize,
}

/// A set of sequence numbers (0-255): what a gap can hold, whatever
/// messages come, in 32 bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Seqs([u64; 4]);

impl Seqs {
    fn insert(&mut self, s: u8) {
        self.0[usize::from(s >> 6)] |= 1 << (s & 63);
    }

    /// Takes `s` out; whether it was in.
    fn remove(&mut self, s: u8) -> bool {
        let (word, bit) = (usize::from(s >> 6), 1u64 << (s & 63));
        let was = self.0[word] & bit != 0;
        self.0[word] &= !bit;
        was
    }

    fn clear(&mut self) {
        self.0 = [0; 4];
    }

    fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }
}

/// Whose a sensor is: the node (and device) whose births map to it.
type Owner = (String, String, Option<String>);

/// The host's view of every edge node.
#[derive(Debug)]
pub struct Host {
    rules: Rules,
    /// Nodes born (online or dead since), at most `max_edge_nodes`.
    nodes: HashMap<(String, String), Node>,
    /// When each node was last asked to rebirth, born or not: at most
    /// `max_edge_nodes` entries, expired ones dropped to make room, so
    /// nodes that never send a birth cannot take the born ones' room.
    asked: HashMap<(String, String), u64>,
    /// The sensor each born node and device writes, and whose it is: two
    /// topics mapped to one sensor id (`a.b` the node, or node `a`'s device
    /// `b`; one node name in two groups) would write each other's readings,
    /// so the second birth is refused.
    owners: HashMap<String, Owner>,
    /// Bytes of the births kept ([`Rules::max_state_bytes`]).
    state_bytes: usize,
}

/// What one more node or device costs besides its table.
const ENTRY_BYTES: usize = 256;

/// What a birth's table holds: each definition's name twice (by name and
/// in its definition), its mapped metric name, and the maps' slots.
fn table_bytes(metrics: &[(Option<u64>, String, u32)], ids: usize) -> usize {
    metrics
        .iter()
        .map(|(_, name, _)| name.len().saturating_mul(3).saturating_add(128))
        .fold(ids.saturating_add(ENTRY_BYTES), usize::saturating_add)
}

/// Takes a node's online devices offline, telling the registry.
fn devices_offline(node: &mut Node, template: &str, topic: &Topic<'_>, fx: &mut Effects) {
    for (d, dev) in &mut node.devices {
        if dev.online {
            dev.online = false;
            fx.presence
                .push((substitute(template, topic.group, topic.node, d), false));
        }
    }
}

fn substitute(template: &str, group: &str, node: &str, device: &str) -> String {
    template
        .replace("{group}", &sensor_part(group))
        .replace("{edge_node}", &sensor_part(node))
        .replace("{device}", &sensor_part(device))
}

impl Host {
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            nodes: HashMap::new(),
            asked: HashMap::new(),
            owners: HashMap::new(),
            state_bytes: 0,
        }
    }

    /// Why `owner`'s births may not write `sensor`, if another's do.
    fn claimed(&self, sensor: &str, owner: &Owner) -> Option<String> {
        let (g, n, d) = self.owners.get(sensor).filter(|o| *o != owner)?;
        let whose = match d {
            Some(d) => format!("device {g}/{n}/{d}"),
            None => format!("edge node {g}/{n}"),
        };
        Some(format!(
            "the sensor id {sensor:?} is {whose}'s: the mapping (mqtt.sparkplug.node_sensor, device_sensor) gives both the same id"
        ))
    }

    /// Makes room for one more node by forgetting a dead one, if any.
    fn evict_dead(&mut self) -> bool {
        let Some(key) = self
            .nodes
            .iter()
            .find(|(_, n)| !n.online)
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        if let Some(node) = self.nodes.remove(&key) {
            let freed = node
                .devices
                .values()
                .map(|d| d.bytes)
                .fold(node.bytes, usize::saturating_add);
            self.state_bytes = self.state_bytes.saturating_sub(freed);
            self.owners
                .retain(|_, (g, n, _)| *g != key.0 || *n != key.1);
        }
        true
    }

    /// The sensor id of a node's (or a device's) metrics.
    pub fn sensor(&self, group: &str, node: &str, device: Option<&str>) -> String {
        match device {
            Some(d) => substitute(&self.rules.device_sensor, group, node, d),
            None => substitute(&self.rules.node_sensor, group, node, ""),
        }
    }

    /// Bytes of births the host keeps.
    pub fn state_bytes(&self) -> usize {
        self.state_bytes
    }

    /// Why a birth of `bytes` replacing one of `had` may not be kept, if it
    /// may not.
    fn over_state(&self, had: usize, bytes: usize) -> Option<String> {
        let after = self.state_bytes.saturating_sub(had).saturating_add(bytes);
        (after > self.rules.max_state_bytes).then(|| {
            format!(
                "the host keeps {} bytes of births at most (mqtt.sparkplug.max_state_bytes); this one needs {bytes}",
                self.rules.max_state_bytes
            )
        })
    }

    /// Takes back births persisted before a restart: aliases resolve at
    /// once, and the next `seq` seen starts the count. Births past the
    /// host's bounds, or with ids no topic could carry, are left out (their
    /// nodes are asked to rebirth when their data comes).
    pub fn restore(&mut self, births: impl IntoIterator<Item = Birth>) {
        for b in births {
            let ids = [
                Some(b.group.as_str()),
                Some(b.node.as_str()),
                b.device.as_deref(),
            ];
            if ids.iter().flatten().any(|id| !super::payload::valid_id(id))
                || SensorId::parse(self.sensor(&b.group, &b.node, b.device.as_deref())).is_err()
            {
                continue;
            }
            let key = (b.group.clone(), b.node.clone());
            if !self.room_for(&key) {
                continue;
            }
            let sensor = self.sensor(&b.group, &b.node, b.device.as_deref());
            let owner = (b.group.clone(), b.node.clone(), b.device.clone());
            if self.claimed(&sensor, &owner).is_some() {
                continue;
            }
            let bytes = table_bytes(&b.metrics, b.group.len() + b.node.len());
            let had = self.nodes.get(&key).map_or(0, |n| match &b.device {
                None => n.bytes,
                Some(d) => n.devices.get(d).map_or(0, |d| d.bytes),
            });
            if self.over_state(had, bytes).is_some() {
                continue;
            }
            let max_devices = self.rules.max_devices_per_node;
            let node = self.nodes.entry(key).or_default();
            match b.device {
                None => {
                    node.bd_seq = b.bd_seq;
                    node.table = Some(Table::of(&b.metrics));
                    node.online = true;
                    node.bytes = bytes;
                }
                Some(d) => {
                    if !node.devices.contains_key(&d) && node.devices.len() >= max_devices {
                        continue;
                    }
                    let dev = node.devices.entry(d).or_default();
                    dev.table = Some(Table::of(&b.metrics));
                    dev.online = true;
                    dev.bytes = bytes;
                }
            }
            self.state_bytes = self.state_bytes.saturating_sub(had).saturating_add(bytes);
            self.owners.insert(sensor, owner);
        }
    }

    /// Handles one message received at `now_ms`.
    pub fn handle(&mut self, topic: &Topic<'_>, payload: &Payload, now_ms: u64) -> Effects {
        // Long: the host's state machine: one arm per message kind, as the specification lists them.
        let mut fx = Effects::default();
        if matches!(topic.kind, Kind::NCmd | Kind::DCmd) {
            return fx;
        }
        // The sensor the message would write: a topic that maps to no valid
        // sensor id gets no state, no labels and no birth kept.
        let sensor = self.sensor(topic.group, topic.node, topic.device);
        if SensorId::parse(sensor.as_str()).is_err() {
            fx.dead_letter = Some(format!(
                "the sensor id {sensor:?} mapped from the topic is not a valid sensor id"
            ));
            return fx;
        }
        let key = (topic.group.to_owned(), topic.node.to_owned());
        match topic.kind {
            Kind::NCmd | Kind::DCmd => return fx,
            Kind::NDeath => {
                self.death(&key, topic, payload, &mut fx);
                return fx;
            }
            Kind::NBirth if !self.room_for(&key) && !self.evict_dead() => {
                fx.dead_letter = Some(format!(
                    "NBIRTH from edge node {}/{}: the host already keeps {} edge nodes (mqtt.sparkplug.max_edge_nodes)",
                    topic.group, topic.node, self.rules.max_edge_nodes
                ));
                return fx;
            }
            Kind::NBirth => {
                let owner = (key.0.clone(), key.1.clone(), None);
                if let Some(reason) = self.claimed(&sensor, &owner) {
                    fx.dead_letter = Some(format!(
                        "NBIRTH from edge node {}/{}: {reason}",
                        topic.group, topic.node
                    ));
                    return fx;
                }
                let bytes = table_bytes(&definitions(payload), key.0.len() + key.1.len());
                let had = self.nodes.get(&key).map_or(0, |n| n.bytes);
                if let Some(reason) = self.over_state(had, bytes) {
                    fx.dead_letter = Some(format!(
                        "NBIRTH from edge node {}/{}: {reason}",
                        topic.group, topic.node
                    ));
                    return fx;
                }
                self.state_bytes = self.state_bytes.saturating_sub(had).saturating_add(bytes);
                self.node_birth(&key, topic, payload, &mut fx);
                if let Some(node) = self.nodes.get_mut(&key) {
                    node.bytes = bytes;
                }
                self.owners.insert(sensor.clone(), owner);
            }
            _ => {}
        }
        if topic.kind != Kind::NBirth {
            // A node never born gets no state here (only, room permitting,
            // a rebirth request's cooldown).
            let node = self.nodes.get_mut(&key);
            let Some(node) = node.filter(|n| n.online && n.table.is_some()) else {
                fx.dead_letter = Some(format!(
                    "{:?} from edge node {}/{} before its NBIRTH",
                    topic.kind, topic.group, topic.node
                ));
                self.ask_rebirth(&key, now_ms, &mut fx);
                return fx;
            };
            Self::sequence(node, payload.seq, now_ms, self.rules.reorder_timeout_ms);
        }
        match topic.kind {
            Kind::DBirth => {
                let device = topic.device.unwrap_or_default().to_owned();
                let metrics = definitions(payload);
                let sensor = self.sensor(topic.group, topic.node, Some(&device));
                let owner = (key.0.clone(), key.1.clone(), Some(device.clone()));
                if let Some(reason) = self.claimed(&sensor, &owner) {
                    fx.dead_letter = Some(format!(
                        "DBIRTH from device {}/{}/{device}: {reason}",
                        topic.group, topic.node
                    ));
                    return fx;
                }
                let node = self.nodes.entry(key.clone()).or_default();
                if !node.devices.contains_key(&device)
                    && node.devices.len() >= self.rules.max_devices_per_node
                {
                    fx.dead_letter = Some(format!(
                        "DBIRTH from device {}/{}/{device}: its edge node already has {} devices (mqtt.sparkplug.max_devices_per_node)",
                        topic.group, topic.node, self.rules.max_devices_per_node
                    ));
                    return fx;
                }
                let bytes = table_bytes(&metrics, device.len());
                let had = node.devices.get(&device).map_or(0, |d| d.bytes);
                let after = self.state_bytes.saturating_sub(had).saturating_add(bytes);
                if after > self.rules.max_state_bytes {
                    fx.dead_letter = Some(format!(
                        "DBIRTH from device {}/{}/{device}: the host keeps {} bytes of births at most (mqtt.sparkplug.max_state_bytes)",
                        topic.group, topic.node, self.rules.max_state_bytes
                    ));
                    return fx;
                }
                self.state_bytes = after;
                self.owners.insert(sensor.clone(), owner);
                let dev = node.devices.entry(device.clone()).or_default();
                dev.table = Some(Table::of(&metrics));
                dev.bytes = bytes;
                if !dev.online {
                    fx.presence.push((sensor.clone(), true));
                }
                dev.online = true;
                fx.labels
                    .push((sensor, labels(topic, payload, self.rules.property_labels)));
                fx.births.push(Birth {
                    group: topic.group.to_owned(),
                    node: topic.node.to_owned(),
                    device: Some(device),
                    bd_seq: None,
                    metrics,
                });
            }
            Kind::DDeath => {
                let sensor = self.sensor(topic.group, topic.node, topic.device);
                let node = self.nodes.entry(key.clone()).or_default();
                if let Some(dev) = node.devices.get_mut(topic.device.unwrap_or_default())
                    && dev.online
                {
                    dev.online = false;
                    fx.presence.push((sensor, false));
                }
                return fx;
            }
            _ => {}
        }
        // Readings: births carry current values too.
        let sensor = self.sensor(topic.group, topic.node, topic.device);
        let node = self.nodes.entry(key.clone()).or_default();
        let table = match topic.device {
            None => node.table.as_ref(),
            Some(d) => match node.devices.get(d) {
                Some(dev) if dev.online => dev.table.as_ref(),
                _ => None,
            },
        };
        let Some(table) = table else {
            fx.dead_letter = Some(format!(
                "{:?} from device {}/{}/{} before its DBIRTH",
                topic.kind,
                topic.group,
                topic.node,
                topic.device.unwrap_or_default()
            ));
            self.ask_rebirth(&key, now_ms, &mut fx);
            return fx;
        };
        match readings(
            table,
            &sensor,
            payload,
            now_ms,
            &self.rules.window,
            &mut fx.skipped,
        ) {
            Ok(out) => fx.readings = out,
            Err(Refusal::UnknownAlias(reason)) => {
                fx.dead_letter = Some(reason);
                fx.skipped = Skipped::default();
                self.ask_rebirth(&key, now_ms, &mut fx);
            }
            Err(Refusal::Invalid(reason)) => {
                fx.dead_letter = Some(reason);
                fx.skipped = Skipped::default();
            }
        }
        fx
    }

    fn node_birth(
        &mut self,
        key: &(String, String),
        topic: &Topic<'_>,
        payload: &Payload,
        fx: &mut Effects,
    ) {
        let sensor = self.sensor(topic.group, topic.node, None);
        let metrics = definitions(payload);
        let node = self.nodes.entry(key.clone()).or_default();
        // A new birth ends the devices' lives: they are born again after it.
        devices_offline(node, &self.rules.device_sensor, topic, fx);
        if !node.online {
            fx.presence.push((sensor.clone(), true));
        }
        node.online = true;
        node.bd_seq = bd_seq_of(payload);
        node.table = Some(Table::of(&metrics));
        node.next_seq = payload.seq.map(|s| (s as u8).wrapping_add(1));
        node.missing.clear();
        node.gap_deadline = None;
        fx.labels
            .push((sensor, labels(topic, payload, self.rules.property_labels)));
        fx.births.push(Birth {
            group: topic.group.to_owned(),
            node: topic.node.to_owned(),
            device: None,
            bd_seq: node.bd_seq,
            metrics,
        });
    }

    fn death(
        &mut self,
        key: &(String, String),
        topic: &Topic<'_>,
        payload: &Payload,
        fx: &mut Effects,
    ) {
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        // A Will from an older session arriving after the next birth.
        let bd = bd_seq_of(payload);
        if node.bd_seq.is_some() && bd.is_some() && bd != node.bd_seq {
            fx.stale_death = true;
            return;
        }
        if node.online {
            fx.presence.push((
                substitute(&self.rules.node_sensor, topic.group, topic.node, ""),
                false,
            ));
        }
        node.online = false;
        node.next_seq = None;
        node.missing.clear();
        node.gap_deadline = None;
        devices_offline(node, &self.rules.device_sensor, topic, fx);
    }

    /// Counts `seq`: a number skipped opens a gap that the late message may
    /// close before the reorder timeout.
    fn sequence(node: &mut Node, seq: Option<u64>, now_ms: u64, timeout: u64) {
        let Some(seq) = seq.map(|s| s as u8) else {
            return;
        };
        let Some(next) = node.next_seq else {
            node.next_seq = Some(seq.wrapping_add(1));
            return;
        };
        if seq == next {
            node.next_seq = Some(seq.wrapping_add(1));
        } else if node.missing.remove(seq) {
        } else {
            let ahead = seq.wrapping_sub(next);
            if ahead >= 128 {
                // Behind: a message seen before, delivered again (QoS 1
                // after a reconnect). Its readings are stored again, which
                // last-write-wins makes harmless; no gap.
                return;
            }
            // Ahead: everything between is missing for now.
            for k in 0..ahead {
                node.missing.insert(next.wrapping_add(k));
            }
            node.next_seq = Some(seq.wrapping_add(1));
            if node.gap_deadline.is_none() {
                node.gap_deadline = Some(now_ms + timeout);
            }
        }
        if node.missing.is_empty() {
            node.gap_deadline = None;
        }
    }

    /// Whether `key` has state or there is room for it.
    fn room_for(&self, key: &(String, String)) -> bool {
        self.nodes.len() < self.rules.max_edge_nodes || self.nodes.contains_key(key)
    }

    fn ask_rebirth(&mut self, key: &(String, String), now_ms: u64, fx: &mut Effects) {
        if !self.room_for(key) && self.nodes.values().all(|n| n.online) {
            // Its birth could not be taken: asking would only bring a birth
            // to refuse, again at every cooldown.
            fx.rebirths_held += 1;
            return;
        }
        let cooldown = self.rules.rebirth_cooldown_ms;
        if let Some(&t) = self.asked.get(key)
            && now_ms < t.saturating_add(cooldown)
        {
            fx.rebirths_held += 1;
            return;
        }
        if !self.asked.contains_key(key) && self.asked.len() >= self.rules.max_edge_nodes {
            self.asked
                .retain(|_, t| now_ms < t.saturating_add(cooldown));
            if self.asked.len() >= self.rules.max_edge_nodes {
                // No room to remember a cooldown: asking at every message
                // could flood the plant, so this node is not asked now.
                fx.rebirths_held += 1;
                return;
            }
        }
        self.asked.insert(key.clone(), now_ms);
        fx.rebirth.push(key.clone());
    }

    /// Gaps whose time is up ask for a rebirth (the birth resets the count).
    pub fn tick(&mut self, now_ms: u64) -> Effects {
        let mut fx = Effects::default();
        let due: Vec<(String, String)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.gap_deadline.is_some_and(|d| now_ms >= d))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            if let Some(node) = self.nodes.get_mut(&key) {
                node.missing.clear();
                node.gap_deadline = None;
                node.next_seq = None;
            }
            self.ask_rebirth(&key, now_ms, &mut fx);
        }
        fx
    }

    /// The earliest gap deadline, for the caller's timer.
    pub fn next_deadline(&self) -> Option<u64> {
        self.nodes.values().filter_map(|n| n.gap_deadline).min()
    }
}

#[cfg(test)]
mod tests;
