//! `[buckets]`: the bucket layout and how long buckets are kept.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::Granularity;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BucketSettings {
    pub granularity: Granularity,
    /// Buckets are deleted (TTL index on `start`) this long after they begin;
    /// `None` ("off") keeps them.
    #[serde(with = "retention")]
    pub retention: Option<Duration>,
    /// An hour this instance wrote into while it was open is rolled up this
    /// long after it ends (an hour written after it ended is rolled up at
    /// once): room for the held buckets of its last minutes and for clocks
    /// that differ a little between instances.
    #[serde(with = "humantime_serde")]
    pub rollup_after: Duration,
    /// An hour written after it ended is marked late (queries read its
    /// buckets) and rolled up again once no write has marked it for this
    /// long, a minute after its first mark at the latest (see `store::rollup::late`).
    #[serde(with = "humantime_serde")]
    pub late_rollup_after: Duration,
    /// The relative accuracy of the percentile sketch each rollup slot
    /// keeps (0.01: a percentile within 1 % of the exact one).
    pub sketch_accuracy: f64,
}

impl Default for BucketSettings {
    fn default() -> Self {
        Self {
            granularity: Granularity::Minute,
            retention: None,
            rollup_after: Duration::from_secs(60),
            late_rollup_after: Duration::from_secs(1),
            sketch_accuracy: 0.01,
        }
    }
}

impl BucketSettings {
    /// How long one bucket covers.
    pub fn span(&self) -> Duration {
        Duration::from_secs(self.granularity.seconds().unsigned_abs())
    }
}

/// `"off"` or a duration such as `"90d"`.
pub(crate) mod retention {
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

/// How long one level is kept: as long as the level below it (the default),
/// for ever, or for a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Keep {
    #[default]
    Inherit,
    Off,
    For(Duration),
}

impl Serialize for Keep {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Keep::Inherit => s.serialize_str("inherit"),
            Keep::Off => s.serialize_str("off"),
            Keep::For(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim().to_ascii_lowercase().as_str() {
            "inherit" => Ok(Keep::Inherit),
            "off" => Ok(Keep::Off),
            _ => humantime::parse_duration(&text)
                .map(Keep::For)
                .map_err(|e| {
                    serde::de::Error::custom(format!(
                        "{text:?} is neither \"inherit\", \"off\" nor a duration: {e}"
                    ))
                }),
        }
    }
}

/// `[retention]`: how long each level is kept.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    pub buckets: Keep,
    pub hour: Keep,
    pub day: Keep,
    #[serde(rename = "30d")]
    pub days30: Keep,
}

/// How long each level is kept, resolved (`None`: for ever). A rollup
/// document is deleted its level's retention after its last slot ends, so
/// every slot is kept at least that long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub buckets: Option<Duration>,
    /// Hour documents (minute slots; minute buckets only).
    pub hour: Option<Duration>,
    /// Day documents (hour slots).
    pub day: Option<Duration>,
    /// Thirty-day documents (day slots).
    pub days30: Option<Duration>,
}

/// Why the retention settings do not hold together; names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} {message}")]
pub struct RetentionError {
    pub key: &'static str,
    pub message: String,
}

fn shown(d: Option<Duration>) -> String {
    match d {
        None => "off".to_owned(),
        Some(d) if d.as_secs() % 86_400 == 0 => format!("{}d", d.as_secs() / 86_400),
        Some(d) => humantime::format_duration(d).to_string(),
    }
}

impl RetentionSettings {
    /// Resolves each level (inherit: the level below's), with `legacy`
    /// (`buckets.retention`, the old name of `retention.buckets`), and checks
    /// that no level is kept shorter than the one below it.
    pub fn resolve(
        &self,
        legacy: Option<Duration>,
        granularity: Granularity,
    ) -> Result<Retention, RetentionError> {
        let buckets = match (self.buckets, legacy) {
            (Keep::Inherit | Keep::Off, None) => None,
            (Keep::For(d), None) => Some(d),
            (Keep::Inherit, Some(d)) => Some(d),
            (_, Some(_)) => {
                return Err(RetentionError {
                    key: "retention.buckets",
                    message: "and buckets.retention (its old name) are both set: keep retention.buckets only".into(),
                });
            }
        };
        if granularity == Granularity::Hour && self.hour != Keep::Inherit {
            return Err(RetentionError {
                key: "retention.hour",
                message: "applies to minute buckets only (hour buckets have no hour rollups): leave it out".into(),
            });
        }
        let level = |keep: Keep, below: Option<Duration>, key: &'static str, below_key: &str| {
            let own = match keep {
                Keep::Inherit => return Ok(below),
                Keep::Off => None,
                Keep::For(d) => Some(d),
            };
            match (own, below) {
                (Some(o), None) => Err(RetentionError {
                    key,
                    message: format!(
                        "{} is shorter than {below_key} (off): a level may not be kept shorter than the one below it",
                        shown(Some(o))
                    ),
                }),
                (Some(o), Some(b)) if o < b => Err(RetentionError {
                    key,
                    message: format!(
                        "{} is shorter than {below_key} ({}): a level may not be kept shorter than the one below it",
                        shown(Some(o)),
                        shown(Some(b))
                    ),
                }),
                _ => Ok(own),
            }
        };
        let hour = level(self.hour, buckets, "retention.hour", "retention.buckets")?;
        let (below, below_key) = match granularity {
            Granularity::Minute => (hour, "retention.hour"),
            Granularity::Hour => (buckets, "retention.buckets"),
        };
        let day = level(self.day, below, "retention.day", below_key)?;
        let days30 = level(self.days30, day, "retention.30d", "retention.day")?;
        Ok(Retention {
            buckets,
            hour: (granularity == Granularity::Minute)
                .then_some(hour)
                .flatten(),
            day,
            days30,
        })
    }
}

impl Retention {
    /// The finest resolution kept at `t` (epoch seconds) as of `now`: 1 (a
    /// second: buckets), 60 (hour documents' minute slots), 3600 (day
    /// documents' hour slots) or 86 400 (thirty-day documents' day slots);
    /// `None` once every level is gone.
    pub fn resolution_at(&self, t: i64, now: i64, granularity: Granularity) -> Option<i64> {
        // A level's document goes its retention after its last slot ends
        // (buckets: after they begin, so one bucket's span is allowed for).
        let kept = |r: Option<Duration>, margin: i64| {
            r.is_none_or(|d| t >= now - i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4) + margin)
        };
        if kept(self.buckets, granularity.seconds()) {
            return Some(1);
        }
        if granularity == Granularity::Minute && kept(self.hour, 0) {
            return Some(60);
        }
        if kept(self.day, 0) {
            return Some(3600);
        }
        if kept(self.days30, 0) {
            return Some(86_400);
        }
        None
    }

    /// Since when every level is gone: nothing is kept before it.
    pub fn oldest_kept(&self, now: i64) -> Option<i64> {
        self.days30
            .map(|d| now - i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn levels_inherit_the_level_below_and_may_not_be_kept_shorter() {
        let s = RetentionSettings {
            buckets: Keep::For(30 * DAY),
            hour: Keep::Inherit,
            day: Keep::For(730 * DAY),
            days30: Keep::Off,
        };
        let r = s.resolve(None, Granularity::Minute).expect("valid");
        assert_eq!(r.buckets, Some(30 * DAY));
        assert_eq!(r.hour, Some(30 * DAY));
        assert_eq!(r.day, Some(730 * DAY));
        assert_eq!(r.days30, None);
        let short = RetentionSettings {
            day: Keep::For(7 * DAY),
            ..s.clone()
        };
        let e = short
            .resolve(None, Granularity::Minute)
            .expect_err("too short");
        assert_eq!(e.key, "retention.day");
        assert!(
            e.message
                .contains("7d is shorter than retention.hour (30d)"),
            "{e}"
        );
        let off_below = RetentionSettings {
            buckets: Keep::Off,
            hour: Keep::For(DAY),
            ..RetentionSettings::default()
        };
        assert_eq!(
            off_below
                .resolve(None, Granularity::Minute)
                .expect_err("off below")
                .key,
            "retention.hour"
        );
        // The old key still works alone, not beside the new one.
        let r = RetentionSettings::default()
            .resolve(Some(90 * DAY), Granularity::Minute)
            .expect("legacy");
        assert_eq!((r.buckets, r.days30), (Some(90 * DAY), Some(90 * DAY)));
        assert!(s.resolve(Some(DAY), Granularity::Minute).is_err());
        assert_eq!(
            s.resolve(None, Granularity::Hour).map(|r| r.hour),
            Ok(None),
            "hour buckets have no hour documents"
        );
        let hour = RetentionSettings {
            hour: Keep::For(DAY),
            ..RetentionSettings::default()
        };
        assert_eq!(
            hour.resolve(None, Granularity::Hour).expect_err("hour").key,
            "retention.hour"
        );
    }

    #[test]
    fn the_finest_resolution_kept_grows_coarser_with_age() {
        let r = Retention {
            buckets: Some(30 * DAY),
            hour: Some(60 * DAY),
            day: Some(730 * DAY),
            days30: None,
        };
        let now = 1_000 * 86_400;
        let at = |days_ago: i64| r.resolution_at(now - days_ago * 86_400, now, Granularity::Minute);
        assert_eq!(at(29), Some(1));
        assert_eq!(at(31), Some(60));
        assert_eq!(at(100), Some(3600));
        assert_eq!(at(900), Some(86_400));
        assert_eq!(r.oldest_kept(now), None);
        let gone = Retention {
            days30: Some(800 * DAY),
            ..r
        };
        assert_eq!(
            gone.resolution_at(now - 900 * 86_400, now, Granularity::Minute),
            None
        );
        assert_eq!(
            Retention::default().resolution_at(0, now, Granularity::Minute),
            Some(1)
        );
    }

    #[test]
    fn keeps_read_inherit_off_and_durations() {
        #[derive(Deserialize)]
        struct T {
            k: Keep,
        }
        let k = |s: &str| serde_norway::from_str::<T>(&format!("k: {s}")).map(|t| t.k);
        assert_eq!(k("inherit").ok(), Some(Keep::Inherit));
        assert_eq!(k("off").ok(), Some(Keep::Off));
        assert_eq!(
            k("2y").ok(),
            Some(Keep::For(Duration::from_secs(63_115_200)))
        );
        assert!(k("soon").is_err());
    }
}
