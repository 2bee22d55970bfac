//! Reads of buckets and rollups: a level of a query's fetch, an export's
//! buckets, a series' newest value. Each is sent in the shape the server in
//! front of us answers from its indexes (see `shapes`).

use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::{Bson, Document, RawDocumentBuf, doc};

use super::classify::classify_read;
use super::connection::{BATCH_DOCUMENTS, EXPORT_BATCH_DOCUMENTS, MongoStore, unix_now};
use super::shapes;
use crate::domain::{Level, Starts, Values, field_name};
use crate::store::document::{read_bucket, start_date};
use crate::store::rollup::read_rollup;
use crate::store::{BucketStream, Doc, Fetch, Read, StoreError, StoredBucket};

impl MongoStore {
    /// The documents one series' find answers at `level`, and the replies
    /// it took.
    async fn series_documents(
        &self,
        query: impl std::future::IntoFuture<
            Output = mongodb::error::Result<mongodb::raw_batch_cursor::RawBatchCursor>,
        >,
        level: Level,
        sketches: Option<f64>,
    ) -> Result<(Vec<Doc>, usize), StoreError> {
        let mut docs = Vec::new();
        let replies = self
            .each_document(query, false, classify_read, |raw| {
                docs.push(match level {
                    Level::Buckets => Doc::Bucket(read_bucket(raw, self.granularity)?),
                    Level::Rollups(period) => Doc::Rollup(read_rollup(raw, period, sketches)?),
                });
                Ok(())
            })
            .await?;
        Ok((docs, replies))
    }

    /// Whether a time-first read of `fetch` takes few documents beyond
    /// what it asks: the metric's other series (by the registry's count,
    /// kept a minute) times the documents each may have there, at most
    /// [`shapes::TIME_FIRST_SPARE`] per series asked. An unanswered count
    /// says no: the per-series shape is right, only slower.
    async fn time_first_pays(&self, fetch: &Fetch<'_>) -> bool {
        let n = fetch.sensors.len();
        if n < shapes::TIME_FIRST_MIN_SERIES {
            return false;
        }
        let now = std::time::Instant::now();
        let known = self
            .series_counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(fetch.metric)
            .filter(|(at, _)| now.duration_since(*at) < shapes::SERIES_COUNT_TTL)
            .map(|&(_, count)| count);
        let count = match known {
            Some(count) => count,
            None => {
                let Ok(count) = self
                    .sensors
                    .count_documents(doc! { "metrics": fetch.metric })
                    .max_time(Duration::from_secs(2))
                    .await
                else {
                    return false;
                };
                let mut counts = self.series_counts.lock().unwrap_or_else(|e| e.into_inner());
                // Metric names come from the registry: bounded by the fleet's.
                counts.insert(fetch.metric.to_owned(), (now, count));
                count
            }
        };
        let others = count.saturating_sub(n as u64);
        others.saturating_mul(fetch.starts_each as u64)
            <= (n as u64).saturating_mul(shapes::TIME_FIRST_SPARE)
    }

    /// [`MongoStore::fetch`]: one level's documents of a fetch.
    pub(super) async fn read_level<F: FnMut(usize, Doc) + Send>(
        &self,
        fetch: Fetch<'_>,
        mut each: F,
    ) -> Result<Read, StoreError> {
        // Long: one find per level: its filter, projection and cursor, each branch a few lines, built in the order the command is.
        let mut read = Read::default();
        if fetch.sensors.is_empty() {
            return Ok(read);
        }
        let index: std::collections::HashMap<&str, usize> = fetch
            .sensors
            .iter()
            .enumerate()
            .map(|(i, s)| (*s, i))
            .collect();
        let sensor = match fetch.sensors {
            [one] => Bson::String((*one).to_owned()),
            many => Bson::Document(doc! { "$in": many.to_vec() }),
        };
        let (collection, kind) = match fetch.level {
            Level::Buckets => (&self.buckets, "buckets"),
            Level::Rollups(_) => (&self.rollups, "rollups"),
        };
        let mut projection = doc! { "_id": 0, "sensor": 1, "start": 1, "schema_version": 1 };
        match fetch.level {
            Level::Rollups(_) => {
                projection.insert("s", 1);
                projection.insert("w", 1);
                projection.insert("complete", 1);
            }
            Level::Buckets => {
                for f in ["count", "sum", "min", "max"] {
                    projection.insert(f, 1);
                }
                if fetch.minutes {
                    projection.insert("m", 1);
                }
                match &fetch.values {
                    Values::None => {}
                    Values::All => {
                        projection.insert("v", 1);
                    }
                    Values::Minutes(minutes) => {
                        for &minute in minutes {
                            projection.insert(format!("v.{}", field_name(minute)), 1);
                        }
                    }
                }
                // Versions, where a bucket still keeps them, decide between
                // its values and this instance's unstored ones.
                if fetch.values != Values::None {
                    projection.insert("a", 1);
                }
            }
        }
        let mut per_series =
            self.read_shape == shapes::ReadShape::PerSeries && fetch.sensors.len() > 1;
        // Most of a metric's series at once: one find by metric and time.
        let time_first = per_series && self.time_first_pays(&fetch).await;
        per_series &= !time_first;
        let shape = if time_first {
            "time_first"
        } else if per_series {
            "per_series"
        } else {
            "in_list"
        };
        self.count(|m| m.store_level_reads.with_label_values(&[shape]).inc());
        for starts in &fetch.starts {
            let start = match starts {
                Starts::Range(from, to) => {
                    doc! { "$gte": start_date(*from), "$lt": start_date(*to) }
                }
                Starts::Only(starts) => {
                    doc! { "$in": starts.iter().map(|&s| Bson::DateTime(start_date(s))).collect::<Vec<_>>() }
                }
            };
            let filter_of = |sensor: Option<Bson>| {
                let mut filter = Document::new();
                if let Some(sensor) = sensor {
                    filter.insert("sensor", sensor);
                }
                filter.insert("metric", fetch.metric);
                if let Level::Rollups(period) = fetch.level {
                    filter.insert("period", period.name());
                }
                filter.insert("start", start.clone());
                filter
            };
            if per_series {
                // A find of one series each, a few at once, handed on in
                // sensor order: what a server that scans for `$in` answers
                // from its index (see `shapes`).
                use futures_util::StreamExt;
                let mut queries = Vec::with_capacity(fetch.sensors.len());
                for s in fetch.sensors {
                    queries.push(
                        self.series_documents(
                            collection
                                .find(filter_of(Some(Bson::String((*s).to_owned()))))
                                .projection(projection.clone())
                                .sort(doc! { "start": 1 })
                                .max_time(fetch.max_time)
                                .batch_size(BATCH_DOCUMENTS)
                                .batch(),
                            fetch.level,
                            fetch.sketches.then_some(self.sketch_accuracy),
                        ),
                    );
                }
                let mut finds =
                    futures_util::stream::iter(queries).buffered(shapes::CONCURRENT_FINDS);
                let mut i = 0;
                while let Some(found) = finds.next().await {
                    let (docs, replies) = found?;
                    read.round_trips += replies as u64;
                    read.documents += docs.len() as u64;
                    for d in docs {
                        each(i, d);
                    }
                    i += 1;
                }
                continue;
            }
            // Time first: every series of the metric in the range, in
            // start order; those not asked are skipped below.
            let (filter, sort) = if time_first {
                (filter_of(None), doc! { "start": 1 })
            } else {
                (
                    filter_of(Some(sensor.clone())),
                    doc! { "sensor": 1, "start": 1 },
                )
            };
            let query = collection
                .find(filter)
                .projection(projection.clone())
                .sort(sort)
                .max_time(fetch.max_time)
                .batch_size(BATCH_DOCUMENTS)
                .batch();
            let mut documents = 0;
            let replies = self
                .each_document(query, false, classify_read, |raw| {
                    documents += 1;
                    if let Some(&i) = raw.get_str("sensor").ok().and_then(|s| index.get(s)) {
                        each(
                            i,
                            match fetch.level {
                                Level::Buckets => Doc::Bucket(read_bucket(raw, self.granularity)?),
                                Level::Rollups(period) => Doc::Rollup(read_rollup(
                                    raw,
                                    period,
                                    fetch.sketches.then_some(self.sketch_accuracy),
                                )?),
                            },
                        );
                    }
                    Ok(())
                })
                .await?;
            read.round_trips += replies as u64;
            read.documents += documents;
        }
        self.count(|m| {
            m.db_documents("read", kind, "query", read.documents);
        });
        Ok(read)
    }

    /// Streams the stored buckets of `sensors` (of `metric`, or of every
    /// metric) that hold seconds of `[from, to)`, sorted by sensor, metric
    /// and start, through one cursor: memory stays constant however many
    /// there are. Without a time limit: an export may take long.
    pub async fn stored(
        &self,
        sensors: &[String],
        metric: Option<&str>,
        from: i64,
        to: i64,
    ) -> Result<BucketStream, StoreError> {
        use futures_util::StreamExt;
        let first = from - from.rem_euclid(self.granularity.seconds());
        let filter_of = |sensor: Bson| {
            let mut filter = doc! { "sensor": sensor };
            if let Some(metric) = metric {
                filter.insert("metric", metric);
            }
            filter.insert(
                "start",
                doc! { "$gte": start_date(first), "$lt": start_date(to) },
            );
            filter
        };
        let buckets = self.buckets.clone_with_type::<RawDocumentBuf>();
        let cursor: futures_util::stream::BoxStream<
            'static,
            mongodb::error::Result<RawDocumentBuf>,
        > = match sensors {
            [one] => export_cursor(buckets, filter_of(Bson::String(one.clone())))
                .await
                .map_err(classify_read)?
                .boxed(),
            many if self.read_shape == shapes::ReadShape::PerSeries => {
                // One cursor after another, a sensor each (see `shapes`).
                let filters: Vec<Document> = many
                    .iter()
                    .map(|s| filter_of(Bson::String(s.clone())))
                    .collect();
                futures_util::stream::iter(filters)
                    .then(move |f| {
                        let buckets = buckets.clone();
                        async move {
                            match export_cursor(buckets, f).await {
                                Ok(c) => c.boxed(),
                                Err(e) => futures_util::stream::once(async move { Err(e) }).boxed(),
                            }
                        }
                    })
                    .flatten()
                    .boxed()
            }
            many => export_cursor(
                buckets,
                filter_of(Bson::Document(doc! { "$in": many.to_vec() })),
            )
            .await
            .map_err(classify_read)?
            .boxed(),
        };
        let granularity = self.granularity;
        let metrics = self.metrics.clone();
        Ok(cursor
            .map(move |doc| {
                let doc = doc.map_err(classify_read)?;
                if let Some(m) = &metrics {
                    m.db_documents("read", "buckets", "export", 1);
                }
                let text = |key: &str| {
                    doc.get_str(key)
                        .map(str::to_owned)
                        .map_err(|e| StoreError::Unreadable(format!("a bucket's {key}: {e}")))
                };
                Ok(StoredBucket {
                    sensor: text("sensor")?,
                    metric: text("metric")?,
                    bucket: read_bucket(&doc, granularity)?,
                })
            })
            .boxed())
    }

    /// The newest stored reading of a series, found from its newest bucket:
    /// `(ts, value, version)`, the version (acknowledgement, epoch ms) if
    /// the value still keeps one. `since`: a time the newest bucket likely
    /// starts at or after (the registry's `last_seen`), looked at first.
    pub async fn latest(
        &self,
        sensor: &str,
        metric: &str,
        since: Option<i64>,
        max_time: Duration,
    ) -> Result<Option<(i64, f64, Option<i64>)>, StoreError> {
        let _reading = self.traffic.reading();
        // The newest bucket within windows reaching further back: a range on
        // `start` is bounded by the unique index on every server, where a
        // sort over the whole series is not on one that scans a key prefix
        // (see `shapes`). A sensor long silent costs a few finds more, unless
        // the caller knows where its newest bucket starts (a delete may have
        // removed it: the windows follow).
        let now = unix_now();
        let mut newest = None;
        let hinted = since.map(|s| now.saturating_sub(s).max(0));
        for back in
            hinted
                .into_iter()
                .chain([2 * 3600, 2 * 86_400, 32 * 86_400, 400 * 86_400, i64::MAX])
        {
            let mut filter = doc! { "sensor": sensor, "metric": metric };
            if back != i64::MAX {
                filter.insert("start", doc! { "$gte": start_date(now - back) });
            }
            newest = self
                .buckets
                .clone_with_type::<RawDocumentBuf>()
                .find_one(filter)
                .projection(doc! { "_id": 0, "start": 1, "schema_version": 1, "count": 1, "sum": 1, "min": 1, "max": 1, "v": 1, "a": 1 })
                .sort(doc! { "start": -1 })
                .max_time(max_time)
                .await
                .map_err(classify_read)?;
            if newest.is_some() {
                break;
            }
        }
        let Some(doc) = newest else {
            return Ok(None);
        };
        let read = read_bucket(&doc, self.granularity)?;
        Ok(read.values.last().map(|&(offset, value)| {
            let version = read
                .versions
                .binary_search_by_key(&offset, |&(o, _)| o)
                .ok()
                .map(|i| read.versions[i].1);
            (read.start + i64::from(offset), value, version)
        }))
    }
}

/// The buckets `filter` selects, for an export: its columns, in series order.
async fn export_cursor(
    buckets: Collection<RawDocumentBuf>,
    filter: Document,
) -> mongodb::error::Result<mongodb::Cursor<RawDocumentBuf>> {
    buckets
        .find(filter)
        .projection(
            doc! { "_id": 0, "sensor": 1, "metric": 1, "start": 1, "schema_version": 1,
            "count": 1, "sum": 1, "min": 1, "max": 1, "v": 1 },
        )
        .sort(doc! { "sensor": 1, "metric": 1, "start": 1 })
        .batch_size(EXPORT_BATCH_DOCUMENTS)
        .await
}
