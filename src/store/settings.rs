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
    /// long, a minute after its first mark at the latest (see `store::late`).
    #[serde(with = "humantime_serde")]
    pub late_rollup_after: Duration,
}

impl Default for BucketSettings {
    fn default() -> Self {
        Self {
            granularity: Granularity::Minute,
            retention: None,
            rollup_after: Duration::from_secs(60),
            late_rollup_after: Duration::from_secs(5),
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
