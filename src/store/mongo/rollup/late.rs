//! Late markers on MongoDB (see `store::rollup::late`): written by a flush into
//! ended hours, read by queries, rolled up and removed by the upkeep.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::TryStreamExt;
use mongodb::bson::{Bson, Document, RawDocumentBuf, doc, oid::ObjectId};

use super::reads::Written;
use crate::domain::{BucketUpdate, Granularity};
use crate::store::mongo::MongoStore;
use crate::store::mongo::classify::{classify, classify_read};
use crate::store::mongo::connection::unix_now;
use crate::store::raw_writer::{Open, Writer, index_key};
use crate::store::rollup::late::{self, Entry};
use crate::store::rollup::schedule::Job;
use crate::store::{LateMarks, Read, StoreError};

/// Entries the upkeep rolls up in one pass.
pub(in crate::store::mongo) const ENTRIES_PER_PASS: usize = 20_000;
/// Entries rolled up, then cleared, together: a backfill's hours are read
/// from their rollups step by step as the upkeep catches up, not once the
/// whole pass is done. (About a second of the stand-in's work; a real
/// MongoDB takes a fraction of it.)
pub(in crate::store::mongo) const ENTRIES_PER_STEP: usize = 500;
/// A marked hour is rolled up this long after its first mark at the
/// latest, however often it is marked again (a backfill that goes on).
pub(in crate::store::mongo) const LATEST_AFTER: i64 = 60;
/// Bytes of one entry in a statement, above its key: field names, token,
/// minutes and BSON framing (generous).
const ENTRY_BYTES: usize = 64;

/// An `update` command of marker statements, written as they come.
struct MarkCommand {
    writer: Writer,
    root: Open,
    updates: Open,
    statements: usize,
}

impl MarkCommand {
    fn new(collection: &str) -> Self {
        let mut writer = Writer::with_capacity(4096);
        let root = writer.root();
        writer.string("update", collection);
        let updates = writer.array("updates");
        Self {
            writer,
            root,
            updates,
            statements: 0,
        }
    }

    fn push(&mut self, id: i64, entries: &[(String, u64)], token: ObjectId, now: i64) {
        let mut key = [0; 20];
        let index = index_key(self.statements, &mut key);
        late::write_mark_statement(&mut self.writer, index, id, entries, token, now);
        self.statements += 1;
    }

    fn finish(self) -> Result<RawDocumentBuf, mongodb::bson::raw::Error> {
        let Self {
            mut writer,
            root,
            updates,
            ..
        } = self;
        writer.end(updates);
        writer.boolean("ordered", false);
        writer.end(root);
        writer.finish()
    }
}

/// One marker document as read by the upkeep.
struct Marked {
    id: i64,
    /// Its flush token (none in older versions' documents).
    token: Option<Bson>,
    entries: Vec<Entry>,
}

/// What one pass of the upkeep over the markers did.
#[derive(Debug, Default, Clone, Copy)]
pub struct LatePass {
    /// Entries rolled up.
    pub rolled_up: usize,
    /// It stopped at [`ENTRIES_PER_PASS`]: more may be due.
    pub full: bool,
    /// Documents due but left for a flush of this instance under way.
    pub held: usize,
}

/// Epoch seconds as a BSON date.
fn date(t: i64) -> Bson {
    Bson::DateTime(mongodb::bson::DateTime::from_millis(t.saturating_mul(1000)))
}

impl MongoStore {
    /// Marks the ended hours `stored` wrote into, as of `now` (epoch
    /// seconds): after their buckets, before the flush counts as stored.
    /// Answers the round trips it took.
    pub(in crate::store::mongo) async fn mark_late(
        &self,
        stored: &[&BucketUpdate],
        now: i64,
    ) -> Result<usize, StoreError> {
        let marks = late::marks(stored.iter().copied(), now);
        if marks.is_empty() {
            return Ok(0);
        }
        // A lone instance's upkeep polls the markers until a poll comes
        // `late_after` past this: past the marks' own time, and past the
        // end of their write (a slow write is not missed).
        let ordering = std::sync::atomic::Ordering::AcqRel;
        self.last_mark.fetch_max(now, ordering);
        let written = self.write_marks(&marks, now).await;
        self.last_mark.fetch_max(unix_now(), ordering);
        let written = written?;
        // What the query caches of every instance drop (see `changes`).
        let ended: Vec<&BucketUpdate> = stored
            .iter()
            .copied()
            .filter(|u| u.key.start - u.key.start.rem_euclid(3600) + 3600 <= now)
            .collect();
        self.record_hours(&ended).await?;
        Ok(written + 2)
    }

    async fn write_marks(&self, marks: &late::Marks, now: i64) -> Result<usize, StoreError> {
        let token = ObjectId::new();
        // Commands within the server's limits by construction: statements
        // counted, bytes estimated from the keys (a body at most half the
        // largest document).
        let max_bytes = self.limits.max_bson_object_size / 2;
        let mut round_trips = 0;
        let mut batch = MarkCommand::new(self.late.name());
        let mut bytes = 0;
        let mut documents = 0_u64;
        for (&id, entries) in marks {
            // A document's entries may be split over statements too.
            for chunk in entries.chunks(4096) {
                let size: usize = chunk.iter().map(|(k, _)| 2 * k.len() + ENTRY_BYTES).sum();
                if batch.statements > 0
                    && (batch.statements >= self.limits.max_write_batch_size
                        || bytes + size > max_bytes)
                {
                    let full = std::mem::replace(&mut batch, MarkCommand::new(self.late.name()));
                    self.send_marks(full).await?;
                    round_trips += 1;
                    bytes = 0;
                }
                batch.push(id, chunk, token, now);
                bytes += size + 128;
                documents += 1;
            }
        }
        if batch.statements > 0 {
            self.send_marks(batch).await?;
            round_trips += 1;
        }
        self.count(|m| m.db_documents("written", "late", "late_marker", documents));
        Ok(round_trips)
    }

    async fn send_marks(&self, command: MarkCommand) -> Result<(), StoreError> {
        let command = command
            .finish()
            .map_err(|e| StoreError::Poison(format!("marking late hours was not encoded: {e}")))?;
        let reply = self.run_raw_write(command, "marking late hours").await?;
        match reply.get_array("writeErrors") {
            // Nothing here can be refused for its contents but a document
            // over the size limit: sent again a bounded number of times.
            Ok(errors) if !errors.is_empty() => Err(StoreError::Unclassed(format!(
                "marking late hours: {}",
                errors[0]
            ))),
            _ => Ok(()),
        }
    }

    /// The bucket starts of each of `sensors` (for `metric`) in `[from, to)`
    /// whose rollup slots are stale until their hour is rolled up again
    /// (`store::rollup::late`), sorted, with the marker documents holding
    /// them; and what reading them cost.
    pub async fn late(
        &self,
        sensors: &[&str],
        metric: &str,
        from: i64,
        to: i64,
        max_time: Duration,
    ) -> Result<(LateMarks, Read), StoreError> {
        let _reading = self.traffic.reading();
        let mut out = vec![Vec::new(); sensors.len()];
        let mut docs = Vec::new();
        let mut read = Read::default();
        if sensors.is_empty() || from >= to {
            return Ok((LateMarks { starts: out, docs }, read));
        }
        let index: std::collections::HashMap<String, usize> = sensors
            .iter()
            .enumerate()
            .map(|(i, s)| (late::key(s, metric), i))
            .collect();
        let mut projection = doc! { "_id": 1 };
        for k in index.keys() {
            projection.insert(format!("e.{k}"), 1);
        }
        let (a, b) = late::id_range(from, to);
        let mut cursor = self
            .late
            .find(doc! { "_id": { "$gte": a, "$lt": b } })
            .projection(projection)
            .max_time(max_time)
            .await
            .map_err(classify_read)?;
        read.round_trips += 1;
        while let Some(d) = cursor.try_next().await.map_err(classify_read)? {
            read.documents += 1;
            let mut ours = false;
            for e in late::entries(&d) {
                if let Some(&i) = index.get(&e.key) {
                    out[i].extend(late::starts(e.hour, e.minutes, self.granularity));
                    ours = true;
                }
            }
            if ours {
                docs.extend(late::doc_id_of(&d));
            }
        }
        for starts in &mut out {
            starts.sort_unstable();
            starts.dedup();
        }
        self.count(|m| m.db_documents("read", "late", "query", read.documents));
        Ok((LateMarks { starts: out, docs }, read))
    }

    /// Removes the parts of the rolled-up `entries` that no flush marked
    /// again since they were read: one statement per document, removing
    /// its parts only if none was marked again; if some document was, one
    /// statement per part (each removing its part only if it was not).
    /// Answers the documents changed.
    async fn clear_late(&self, entries: &[&Entry]) -> Result<u64, StoreError> {
        let per_command = self.limits.max_write_batch_size.clamp(1, 10_000);
        let mut by_doc: std::collections::BTreeMap<i64, Vec<&Entry>> = Default::default();
        for e in entries {
            by_doc.entry(e.id).or_default().push(e);
        }
        let statements: Vec<Document> = by_doc
            .values()
            .map(|es| late::clear_all_statement(es))
            .collect();
        let (mut matched, mut changed) = (0, 0);
        for chunk in statements.chunks(per_command) {
            let (n, modified) = self.send_clears(chunk.to_vec()).await?;
            matched += n;
            changed += modified;
        }
        if matched < statements.len() as u64 {
            let parts: Vec<Document> = entries
                .iter()
                .flat_map(|e| late::clear_statements(e))
                .collect();
            for chunk in parts.chunks(per_command) {
                let (_, modified) = self.send_clears(chunk.to_vec()).await?;
                changed += modified;
            }
        }
        Ok(changed)
    }

    /// Answers the statements matched and the documents changed.
    async fn send_clears(&self, statements: Vec<Document>) -> Result<(u64, u64), StoreError> {
        let command = doc! {
            "update": self.late.name(),
            "updates": statements,
            "ordered": false,
        };
        let reply = self.run_write(command, "clearing late markers").await?;
        let count = |f: &str| reply.get_i32(f).map_or(0, |n| n.max(0) as u64);
        Ok((count("n"), count("nModified")))
    }

    /// Rolls up the hours marked late that are due as of `now`: those
    /// queries asked for (see `priority`), without waiting for a quiet;
    /// then those with no mark for `quiet` seconds (`None`: only the next
    /// one), or a first mark a minute ago, newest first (dashboards look at
    /// the recent past). In steps of about
    /// [`ENTRIES_PER_STEP`] entries, each step's markers removed as soon as
    /// its rollups are written. Rolls up at most [`ENTRIES_PER_PASS`]
    /// entries; with `quiet` zero and nothing written meanwhile, every
    /// marker goes.
    pub async fn roll_up_late(&self, now: i64, quiet: Option<i64>) -> Result<LatePass, StoreError> {
        let overdue = now.saturating_sub(LATEST_AFTER);
        let latest = doc! { "first": { "$lte": date(overdue) } };
        let filter = match quiet {
            Some(quiet) => doc! { "$or": [{ "at": { "$lte": date(now - quiet) } }, latest] },
            None => latest,
        };
        let mut pass = LatePass::default();
        let mut docs: Vec<Marked> = Vec::new();
        let mut entries = 0;
        // The documents queries asked for first, then the rest, newest first.
        let wanted: Vec<i64> = self
            .priority
            .wanted(tokio::time::Instant::now())
            .into_iter()
            .collect();
        if !wanted.is_empty() {
            let asked = doc! { "_id": { "$in": wanted } };
            self.collect_due(asked, overdue, &mut docs, &mut entries, &mut pass)
                .await?;
        }
        if !pass.full {
            self.collect_due(filter, overdue, &mut docs, &mut entries, &mut pass)
                .await?;
        }
        let mut rest: std::collections::VecDeque<Marked> = docs.into();
        while !rest.is_empty() {
            // Asks that came during the pass go before the next step.
            let wanted = self.priority.wanted(tokio::time::Instant::now());
            if !wanted.is_empty() {
                let (asked, other): (Vec<Marked>, Vec<Marked>) =
                    rest.into_iter().partition(|d| wanted.contains(&d.id));
                rest = asked.into_iter().chain(other).collect();
            }
            let mut n = 1;
            let mut size = rest[0].entries.len();
            while n < rest.len() && size + rest[n].entries.len() <= ENTRIES_PER_STEP {
                size += rest[n].entries.len();
                n += 1;
            }
            let step: Vec<Marked> = rest.drain(..n).collect();
            let began = std::time::Instant::now();
            let ids = step.iter().map(|d| d.id).collect();
            let expected = self.pace.rolling_up(size as u64);
            let (under_way, asked) = self
                .priority
                .step(ids, expected, tokio::time::Instant::now());
            self.roll_up_step(&step, now).await?;
            under_way.done();
            tracing::debug!(
                entries = size,
                asked,
                elapsed_ms = began.elapsed().as_millis() as u64,
                "Rolled up a step of the hours marked late."
            );
            pass.rolled_up += size;
            // The gauge follows each step: panels over the hours just
            // rolled up read their rollups already.
            if !rest.is_empty() {
                self.recount_late().await;
            }
        }
        Ok(pass)
    }

    /// Reads the marker documents `filter` finds, newest first, into `docs`
    /// (leaving those already there and those held for a write of this
    /// instance), until `entries` reaches [`ENTRIES_PER_PASS`].
    async fn collect_due(
        &self,
        filter: Document,
        overdue: i64,
        docs: &mut Vec<Marked>,
        entries: &mut usize,
        pass: &mut LatePass,
    ) -> Result<(), StoreError> {
        let mut cursor = self
            .driver(self.late.find(filter).sort(doc! { "_id": -1 }))
            .await
            .map_err(classify)?;
        let taken: std::collections::HashSet<i64> = docs.iter().map(|m| m.id).collect();
        let mut read = 0;
        while let Some(d) = self.driver(cursor.try_next()).await.map_err(classify)? {
            read += 1;
            let Some(id) = late::doc_id_of(&d) else {
                continue;
            };
            if taken.contains(&id) {
                continue;
            }
            // A flush of this instance under way into the hour, or a bucket
            // of it still held, marks it again when written: rolled up
            // after that, unless its minute is up.
            let due_anyway = d
                .get_datetime("first")
                .is_ok_and(|f| f.timestamp_millis() <= overdue.saturating_mul(1000));
            let hour = late::hour_of(id);
            if !due_anyway && (self.in_flight.writes(hour) || self.owes(hour)) {
                pass.held += 1;
                continue;
            }
            let marked = Marked {
                id,
                token: d.get("t").cloned(),
                entries: late::entries(&d),
            };
            *entries += marked.entries.len();
            docs.push(marked);
            if *entries >= ENTRIES_PER_PASS {
                pass.full = true;
                break;
            }
        }
        drop(cursor);
        self.count(|m| m.db_documents("read", "late", "rollup_upkeep", read));
        Ok(())
    }

    /// Rolls up the entries of `docs`, then removes what no flush marked
    /// again since they were read.
    async fn roll_up_step(&self, docs: &[Marked], now: i64) -> Result<(), StoreError> {
        let entries: Vec<&Entry> = docs.iter().flat_map(|d| &d.entries).collect();
        if !entries.is_empty() {
            let mut written = Written::new();
            let mut jobs: Vec<Job> = Vec::with_capacity(entries.len());
            for e in &entries {
                jobs.push(Job {
                    sensor: e.sensor.clone(),
                    metric: e.metric.clone(),
                    hour: e.hour,
                });
                if self.granularity == Granularity::Minute {
                    *written
                        .entry(((e.sensor.clone(), e.metric.clone()), e.hour))
                        .or_default() |= e.minutes;
                }
            }
            jobs.sort_unstable();
            jobs.dedup();
            // The open hours this instance remembers among them are read
            // now: not rolled up again once due (see `Upkeep::rolled_up`).
            let mark = self.upkeep().mark();
            let at = unix_now();
            let began = std::time::Instant::now();
            self.roll_up_counted(&jobs, now, Some(&written), true)
                .await?;
            self.pace.rolled_up(jobs.len() as u64, began.elapsed());
            tracing::debug!(
                jobs = jobs.len(),
                elapsed_ms = began.elapsed().as_millis() as u64,
                "Rolled up the series-hours of a step."
            );
            let mut upkeep = self.upkeep();
            upkeep.rolled_up(&jobs, mark, at);
            let pending = upkeep.pending();
            drop(upkeep);
            self.count(|m| m.rollup_pending.set(pending as i64));
        }
        // Documents no flush marked since they were read go whole: every
        // entry of theirs is rolled up.
        let unmarked: Vec<Document> = docs
            .iter()
            .filter_map(|d| {
                let t = d.token.clone()?;
                Some(doc! { "q": { "_id": d.id, "t": t }, "limit": 1 })
            })
            .collect();
        let mut deleted = 0;
        for chunk in unmarked.chunks(self.limits.max_write_batch_size.clamp(1, 10_000)) {
            let command = doc! {
                "delete": self.late.name(),
                "deletes": chunk.to_vec(),
                "ordered": false,
            };
            self.traffic.give_way().await;
            let reply = self
                .run_write(command, "deleting rolled-up late markers")
                .await?;
            deleted += reply.get_i32("n").map_or(0, |n| n.max(0) as u64);
        }
        self.count(|m| m.db_documents("written", "late", "rollup_upkeep", deleted));
        if deleted < docs.len() as u64 {
            let ids: Vec<i64> = docs.iter().map(|d| d.id).collect();
            self.clear_marked_again(&ids, &entries, now).await?;
        }
        Ok(())
    }

    /// Sets `hourglass_rollup_late_hours` to [`Self::count_late`].
    pub(in crate::store::mongo) async fn recount_late(&self) {
        match self.count_late().await {
            Ok(n) => {
                self.pace.set_late(n);
                self.count(|m| m.rollup_late.set(i64::try_from(n).unwrap_or(i64::MAX)));
            }
            Err(e) => tracing::warn!(error = %e,
                "Counting the hours marked late failed; hourglass_rollup_late_hours keeps its last value."),
        }
    }

    /// Series-hours marked late, over every instance: the hours whose reads
    /// go to their buckets until the upkeep rolls them up.
    pub(in crate::store::mongo) async fn count_late(&self) -> Result<u64, StoreError> {
        let pipeline = [
            doc! { "$project": { "n": { "$size": { "$objectToArray": { "$ifNull": ["$e", {}] } } } } },
            doc! { "$group": { "_id": Bson::Null, "n": { "$sum": "$n" } } },
        ];
        let mut cursor = self
            .driver(self.late.aggregate(pipeline))
            .await
            .map_err(classify)?;
        let mut n = 0;
        while let Some(d) = self.driver(cursor.try_next()).await.map_err(classify)? {
            n += match d.get("n") {
                Some(Bson::Int32(x)) => u64::try_from(*x).unwrap_or(0),
                Some(Bson::Int64(x)) => u64::try_from(*x).unwrap_or(0),
                Some(Bson::Double(x)) if *x >= 0.0 => *x as u64,
                _ => 0,
            };
        }
        Ok(n)
    }

    /// After a pass: of the documents read that are left (marked again, or
    /// of an older version), removes the parts rolled up, the documents left
    /// without entries, and restarts the others' minute of grace.
    async fn clear_marked_again(
        &self,
        ids: &[i64],
        entries: &[&Entry],
        now: i64,
    ) -> Result<(), StoreError> {
        let mut left: BTreeSet<i64> = BTreeSet::new();
        for chunk in ids.chunks(10_000) {
            let mut cursor = self
                .driver(
                    self.late
                        .find(doc! { "_id": { "$in": chunk.to_vec() } })
                        .projection(doc! { "_id": 1 }),
                )
                .await
                .map_err(classify)?;
            while let Some(d) = self.driver(cursor.try_next()).await.map_err(classify)? {
                left.extend(late::doc_id_of(&d));
            }
        }
        self.count(|m| m.db_documents("read", "late", "rollup_upkeep", left.len() as u64));
        let entries: Vec<&Entry> = entries
            .iter()
            .copied()
            .filter(|e| left.contains(&e.id))
            .collect();
        let cleared = self.clear_late(&entries).await?;
        self.count(|m| m.db_documents("written", "late", "rollup_upkeep", cleared));
        let ids: Vec<i64> = left.into_iter().collect();
        for chunk in ids.chunks(10_000) {
            // Documents left without entries (of older versions: this
            // version's go by their token) go; one marked again meanwhile
            // keeps its entries, and its minute of grace starts again (a
            // backfill that goes on is rolled up once a minute, not at
            // every pass).
            let command = doc! {
                "delete": self.late.name(),
                "deletes": [{ "q": { "_id": { "$in": chunk.to_vec() }, "e": {} }, "limit": 0 }],
            };
            let reply = self
                .run_write(command, "deleting emptied late markers")
                .await?;
            let deleted = reply.get_i32("n").map_or(0, |n| n.max(0) as u64);
            self.count(|m| m.db_documents("written", "late", "rollup_upkeep", deleted));
            let command = doc! {
                "update": self.late.name(),
                "updates": [{
                    "q": { "_id": { "$in": chunk.to_vec() } },
                    "u": { "$set": { "first": date(now) } },
                    "multi": true,
                }],
            };
            let reply = self
                .run_write(command, "restarting late markers' grace")
                .await?;
            let restarted = reply.get_i32("nModified").map_or(0, |n| n.max(0) as u64);
            self.count(|m| m.db_documents("written", "late", "rollup_upkeep", restarted));
        }
        Ok(())
    }
}
