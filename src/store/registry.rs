//! The sensor registry: one document per sensor (`_id` the sensor id) with
//! its metrics, labels and the hour of its newest reading. Written when a
//! flush shows a sensor or metric for the first time, or a newer hour; a
//! cache makes that no extra round trip in the steady state.

use std::collections::BTreeMap;

use mongodb::bson::{Bson, Document, doc};

use super::document::start_date;
use super::errors::StoreError;
use crate::domain::{BucketUpdate, Granularity, Labels, MAX_LABELS, MetricName, SensorId};

/// A registered sensor.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SensorInfo {
    pub sensor: String,
    pub metrics: Vec<String>,
    pub labels: Labels,
    /// Epoch seconds of the start of the hour of its newest reading, if any.
    pub last_seen: Option<i64>,
    /// [`super::MongoStore::registrations`] when it was listed.
    #[serde(skip)]
    pub registrations: u64,
}

/// What a listing vouches for: nothing of the sensor at or after `from`
/// was stored when it was listed, and this instance has stored none since
/// while its [`super::MongoStore::registrations`] still reads
/// `registrations` (an hour is registered before its readings are stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quiet {
    pub from: i64,
    pub registrations: u64,
}

impl SensorInfo {
    /// What the listing vouches for, if the sensor has a newest hour.
    pub fn quiet(&self) -> Option<Quiet> {
        self.last_seen.map(|hour| Quiet {
            from: hour.saturating_add(3600),
            registrations: self.registrations,
        })
    }
}

/// Which sensors to list: all conditions must hold.
#[derive(Debug, Clone, Default)]
pub struct SensorQuery<'a> {
    /// Ids after this one (paging).
    pub after: Option<&'a str>,
    /// Ids starting with this.
    pub prefix: &'a str,
    /// Labels that must have these values.
    pub labels: &'a [(String, String)],
    /// Sensors that have this metric.
    pub metric: Option<&'a str>,
    /// Ids up to this one, included (a page's end).
    pub through: Option<&'a str>,
}

/// The filter of a listing. Sensor ids are ASCII below DEL, so `prefix` +
/// DEL bounds the prefix's range on `_id`: the index answers it.
pub fn filter(q: &SensorQuery<'_>) -> Document {
    let mut id = doc! {};
    if !q.prefix.is_empty() {
        id.insert("$gte", q.prefix);
        id.insert("$lt", format!("{}\u{7f}", q.prefix));
    }
    if let Some(after) = q.after
        && after >= q.prefix
    {
        id.insert("$gt", after);
        id.remove("$gte");
    }
    if let Some(through) = q.through {
        id.insert("$lte", through);
    }
    let mut f = doc! {};
    if !id.is_empty() {
        f.insert("_id", id);
    }
    for (name, value) in q.labels {
        f.insert(format!("labels.{name}"), value.as_str());
    }
    if let Some(metric) = q.metric {
        f.insert("metrics", metric);
    }
    f
}

/// Reads a registry document.
pub fn read(d: &Document) -> Result<SensorInfo, StoreError> {
    let bad = |what: &str| StoreError::Unreadable(format!("sensor registry: {what}"));
    let sensor = d
        .get_str("_id")
        .ok()
        .filter(|id| SensorId::parse(*id).is_ok())
        .ok_or_else(|| bad("_id is not a sensor id"))?
        .to_owned();
    let metrics = match d.get_array("metrics") {
        Ok(a) => a
            .iter()
            .filter_map(Bson::as_str)
            .filter(|m| MetricName::parse(*m).is_ok())
            .map(str::to_owned)
            .collect(),
        Err(_) => Vec::new(),
    };
    let labels = match d.get_document("labels") {
        Ok(l) => l
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect::<BTreeMap<_, _>>(),
        Err(_) => BTreeMap::new(),
    };
    let labels = Labels::parse(labels).map_err(|e| bad(&e.to_string()))?;
    let last_seen = d
        .get_datetime("last_seen")
        .ok()
        .map(|t| t.timestamp_millis().div_euclid(1000));
    Ok(SensorInfo {
        sensor,
        metrics,
        labels,
        last_seen,
        registrations: 0,
    })
}

/// The update adding `added` (label names are plain identifiers, so safe as
/// keys) to a sensor's labels, unless the union would pass [`MAX_LABELS`].
pub fn merge_labels(added: Document) -> Vec<Document> {
    let merged =
        doc! { "$mergeObjects": [ { "$ifNull": ["$labels", {}] }, { "$literal": added } ] };
    vec![doc! { "$set": {
        "labels": { "$cond": [
            { "$lte": [ { "$size": { "$objectToArray": merged.clone() } }, MAX_LABELS as i64 ] },
            merged,
            { "$ifNull": ["$labels", {}] },
        ] },
        "metrics": { "$ifNull": ["$metrics", []] },
    } }]
}

/// Metrics per statement: keeps every statement small.
const METRICS_PER_STATEMENT: usize = 1000;

/// What a flush has to tell the registry, given what it was told before:
/// `(sensor, metric, hour of the newest reading)` not yet known.
pub fn news<'a>(
    updates: impl IntoIterator<Item = &'a BucketUpdate>,
    granularity: Granularity,
    known: impl Fn(&str, &str) -> Option<i64>,
) -> BTreeMap<(&'a str, &'a str), i64> {
    let mut out: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for u in updates {
        let Some(&(last, _)) = u.values.last() else {
            continue;
        };
        let ts = u.key.start + i64::from(last).min(granularity.seconds() - 1);
        let hour = ts - ts.rem_euclid(3600);
        let key = (u.key.sensor.as_str(), u.key.metric.as_str());
        if known(key.0, key.1).is_some_and(|h| h >= hour) {
            continue;
        }
        let e = out.entry(key).or_insert(hour);
        *e = (*e).max(hour);
    }
    out
}

/// Upsert statements for [`news`]: metrics added to the set, the newest hour
/// kept, labels left alone.
pub fn statements(news: &BTreeMap<(&str, &str), i64>) -> Vec<Document> {
    let mut by_sensor: BTreeMap<&str, (Vec<&str>, i64)> = BTreeMap::new();
    for (&(sensor, metric), &hour) in news {
        let e = by_sensor.entry(sensor).or_insert((Vec::new(), i64::MIN));
        e.0.push(metric);
        e.1 = e.1.max(hour);
    }
    let mut out = Vec::new();
    for (sensor, (metrics, hour)) in by_sensor {
        for chunk in metrics.chunks(METRICS_PER_STATEMENT) {
            out.push(doc! {
                "q": { "_id": sensor },
                "u": {
                    "$addToSet": { "metrics": { "$each": chunk.to_vec() } },
                    "$max": { "last_seen": start_date(hour) },
                    "$setOnInsert": { "labels": {} },
                },
                "upsert": true,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{BucketKey, MetricName, SensorId};

    fn update(sensor: &str, metric: &str, start: i64, last: u16) -> BucketUpdate {
        BucketUpdate {
            key: BucketKey {
                sensor: SensorId::parse(sensor.to_owned())
                    .expect("valid")
                    .into_owned(),
                metric: MetricName::parse(metric.to_owned())
                    .expect("valid")
                    .into_owned(),
                start,
            },
            values: vec![(0, 1.0), (last, 2.0)],
            acks: Vec::new(),
        }
    }

    #[test]
    fn only_new_series_and_newer_hours_are_news() {
        let updates = [
            update("a", "t", 3600 * 5, 59),
            update("a", "h", 3600 * 5, 0),
            update("b", "t", 3600 * 7 - 60, 59),
        ];
        let known = |s: &str, m: &str| (s == "a" && m == "t").then_some(3600 * 5);
        let news = news(&updates, Granularity::Minute, known);
        assert_eq!(
            news.into_iter().collect::<Vec<_>>(),
            vec![(("a", "h"), 3600 * 5), (("b", "t"), 3600 * 6)]
        );
        let known = |_: &str, _: &str| Some(i64::MAX);
        assert!(super::news(&updates, Granularity::Minute, known).is_empty());
    }

    #[test]
    fn statements_upsert_one_sensor_each() {
        let news = BTreeMap::from([(("a", "t"), 3600), (("a", "h"), 7200), (("b", "t"), 0)]);
        let s = statements(&news);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].get_document("q").expect("q"), &doc! { "_id": "a" });
        let u = s[0].get_document("u").expect("u");
        assert_eq!(
            u.get_document("$max").expect("max"),
            &doc! { "last_seen": start_date(7200) }
        );
    }

    #[test]
    fn listing_filters_use_the_id_range() {
        let labels = vec![("site".to_owned(), "x".to_owned())];
        let f = filter(&SensorQuery {
            after: Some("ab-7"),
            prefix: "ab",
            labels: &labels,
            metric: Some("t"),
            through: None,
        });
        assert_eq!(
            f,
            doc! { "_id": { "$lt": "ab\u{7f}", "$gt": "ab-7" }, "labels.site": "x", "metrics": "t" }
        );
        assert_eq!(filter(&SensorQuery::default()), doc! {});
    }
}
