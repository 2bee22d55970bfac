//! The cardinality guard: at most so many new series (sensor and metric
//! pairs) an hour, instance-wide and per token, so a device that mints a
//! fresh sensor id with every reading cannot grow the registry, the buckets
//! and every fleet query without bound (VictoriaMetrics'
//! `-storage.maxHourlySeries`, InfluxDB's `max-series-per-database`).
//!
//! A pure core: the caller passes the time and the series a request holds
//! that the registry's cache does not know; the guard keeps the series it
//! has seen (seeded from the registry at start) and the counts of the
//! current clock hour. Until the seed is in, every series is let in and
//! learnt, uncounted: a restart must not make a fleet's series look new.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

use serde::{Deserialize, Serialize};

use crate::settings::Invalid;

/// `[cardinality]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// New series accepted per clock hour by this instance; 0: no bound.
    pub max_new_series_per_hour: usize,
    /// New series accepted per clock hour from one token (with `auth`
    /// enabled); 0: no bound.
    pub max_new_series_per_hour_per_token: usize,
    /// Series the guard remembers (as 8-byte hashes): past it, it can no
    /// longer tell new series from known ones and stops bounding them,
    /// saying so, rather than grow.
    pub max_known_series: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            // Generous: a fleet of 100 000 sensors coming up in one hour.
            max_new_series_per_hour: 100_000,
            max_new_series_per_hour_per_token: 20_000,
            max_known_series: 10_000_000,
        }
    }
}

impl Settings {
    pub fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }
}

/// A request refused for its new series.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{new} new series would pass {setting} ({limit} this hour, {used} used); nothing was taken. Existing series are still accepted; new ones again from the next hour"
)]
pub struct Refused {
    pub new: usize,
    pub limit: usize,
    pub used: usize,
    pub setting: &'static str,
    /// Seconds until the hour ends and new series are taken again.
    pub retry_after_s: u64,
}

const HOUR_MS: i64 = 3_600_000;

/// The metric a registry entry alone counts under: a sensor whose labels
/// are written before it has readings is one series to the guard.
pub const SENSOR_ENTRY: &str = "";

#[derive(Debug)]
pub struct Guard {
    settings: Settings,
    /// The known series as hashes keyed per process (a client cannot aim
    /// for a collision; an accidental one lets a new series in uncounted).
    known: hashbrown::HashSet<u64>,
    keys: std::collections::hash_map::RandomState,
    /// `known` reached `max_known_series`: new series are no longer told
    /// from known ones, so none is counted.
    full: bool,
    /// Until the registry's series are in, nothing is counted.
    seeded: bool,
    hour: i64,
    used: usize,
    by_token: HashMap<Box<str>, usize>,
}

impl Guard {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            known: hashbrown::HashSet::new(),
            keys: std::collections::hash_map::RandomState::new(),
            full: false,
            seeded: false,
            hour: i64::MIN,
            used: 0,
            by_token: HashMap::new(),
        }
    }

    /// Whether the guard bounds anything.
    pub fn enabled(&self) -> bool {
        self.settings.max_new_series_per_hour > 0
            || self.settings.max_new_series_per_hour_per_token > 0
    }

    fn hash(&self, sensor: &str, metric: &str) -> u64 {
        self.keys.hash_one((sensor, metric))
    }

    /// Remembers a series, unless the set is at its bound.
    fn learn(&mut self, sensor: &str, metric: &str) {
        let h = self.hash(sensor, metric);
        if self.known.len() >= self.settings.max_known_series && !self.known.contains(&h) {
            self.full = true;
            return;
        }
        self.known.insert(h);
    }

    /// Whether the guard stopped bounding new series at `max_known_series`.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// Learns series that exist (from the registry).
    pub fn know<'a>(&mut self, series: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (s, m) in series {
            self.learn(s, m);
        }
    }

    /// The registry's series are all in: from now on new ones count.
    pub fn seeded(&mut self) {
        self.seeded = true;
    }

    /// Takes a request's `candidates` (series the caller does not know to
    /// exist; duplicates allowed) at `now_ms` from `token`, or refuses it
    /// whole. Returns how many were new.
    pub fn admit(
        &mut self,
        now_ms: i64,
        token: Option<&str>,
        candidates: &[(String, String)],
    ) -> Result<usize, Refused> {
        let mut fresh: HashSet<(&str, &str)> = HashSet::new();
        for (s, m) in candidates {
            if !self.known.contains(&self.hash(s, m)) {
                fresh.insert((s, m));
            }
        }
        if fresh.is_empty() || self.full {
            return Ok(0);
        }
        let hour = now_ms.div_euclid(HOUR_MS);
        if hour != self.hour {
            self.hour = hour;
            self.used = 0;
            self.by_token.clear();
        }
        let new = fresh.len();
        if self.seeded {
            let retry_after_s = u64::try_from((hour + 1) * HOUR_MS - now_ms)
                .unwrap_or(0)
                .div_ceil(1000);
            let over = |limit: usize, used: usize, setting| {
                (limit > 0 && used + new > limit).then_some(Refused {
                    new,
                    limit,
                    used,
                    setting,
                    retry_after_s,
                })
            };
            let per_token = token.map_or(0, |t| self.by_token.get(t).copied().unwrap_or(0));
            if let Some(refused) = over(
                self.settings.max_new_series_per_hour,
                self.used,
                "cardinality.max_new_series_per_hour",
            )
            .or_else(|| {
                token.and_then(|_| {
                    over(
                        self.settings.max_new_series_per_hour_per_token,
                        per_token,
                        "cardinality.max_new_series_per_hour_per_token",
                    )
                })
            }) {
                return Err(refused);
            }
            self.used += new;
            if let Some(t) = token {
                *self.by_token.entry(t.into()).or_default() += new;
            }
        }
        for (s, m) in fresh {
            self.learn(s, m);
        }
        Ok(new)
    }
}

/// The guard as the intake shares it, with its counters.
#[derive(Debug)]
pub struct Shared {
    guard: std::sync::Mutex<Guard>,
    /// `hourglass_new_series_total`, `hourglass_new_series_refused_total`.
    pub taken: prometheus::IntCounter,
    pub refused: prometheus::IntCounter,
    /// `hourglass_new_series_guard_seeded`: 1 once new series count.
    pub ready: prometheus::IntGauge,
}

impl Shared {
    pub fn new(
        settings: Settings,
        taken: prometheus::IntCounter,
        refused: prometheus::IntCounter,
        ready: prometheus::IntGauge,
    ) -> Self {
        Self {
            guard: std::sync::Mutex::new(Guard::new(settings)),
            taken,
            refused,
            ready,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Guard> {
        self.guard.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn enabled(&self) -> bool {
        self.lock().enabled()
    }

    pub fn know<'a>(&self, series: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut guard = self.lock();
        guard.know(series);
        if guard.is_full() {
            self.ready.set(0);
        }
    }

    pub fn seeded(&self) {
        let mut guard = self.lock();
        guard.seeded();
        if guard.is_full() {
            tracing::warn!(
                "The registry holds more series than cardinality.max_known_series; new series are not bounded. Raise the setting to bound them."
            );
        } else {
            self.ready.set(1);
        }
    }

    /// [`Guard::admit`] now, counted.
    pub fn admit(
        &self,
        token: Option<&str>,
        candidates: &[(String, String)],
    ) -> Result<(), Refused> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut guard = self.lock();
        let was_full = guard.is_full();
        let admitted = guard.admit(now_ms, token, candidates);
        if guard.is_full() && !was_full {
            self.ready.set(0);
            tracing::warn!(
                "The cardinality guard remembers cardinality.max_known_series series; past it, new series are no longer bounded. Raise the setting to bound them again."
            );
        }
        drop(guard);
        match admitted {
            Ok(new) => {
                self.taken.inc_by(new as u64);
                Ok(())
            }
            Err(refused) => {
                self.refused.inc_by(refused.new as u64);
                Err(refused)
            }
        }
    }
}

#[cfg(test)]
mod tests;
