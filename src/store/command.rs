//! Cuts bucket updates into `update` commands that fit the server's limits,
//! measured on the encoded bytes of each statement (they are raw BSON already).

use mongodb::bson::{RawDocument, RawDocumentBuf};

use super::document::{Versioning, write_statement};
use super::raw_writer::{Open, Writer, index_key};
use crate::domain::{BucketUpdate, Granularity};

/// Room kept free in every command for the fields the driver adds to it
/// (`$db`, `lsid`, `$clusterTime`, read preference): a few hundred bytes.
pub const DRIVER_MARGIN: usize = 16 * 1024;

/// The server's size limits, from its `hello` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `maxBsonObjectSize`: a command body may be at most this plus 16 KiB.
    pub max_bson_object_size: usize,
    /// `maxMessageSizeBytes`: a whole wire message.
    pub max_message_size: usize,
    /// `maxWriteBatchSize`: statements in one write command.
    pub max_write_batch_size: usize,
}

impl Default for Limits {
    /// MongoDB's limits since 3.6 / 4.0, used until the server says otherwise.
    fn default() -> Self {
        Self {
            max_bson_object_size: 16 * 1024 * 1024,
            max_message_size: 48_000_000,
            max_write_batch_size: 100_000,
        }
    }
}

impl Limits {
    /// The largest command body this service sends.
    pub fn command_budget(&self) -> usize {
        self.max_bson_object_size
            .min(self.max_message_size)
            .saturating_sub(DRIVER_MARGIN)
    }
}

/// One `update` command and the updates (by index) it carries, in order.
#[derive(Debug)]
pub struct Command {
    pub body: RawDocumentBuf,
    pub indexes: Vec<usize>,
}

/// What the builder yields: a command, or an update too large to send at all.
#[derive(Debug)]
pub enum Chunk {
    Command(Command),
    Oversized {
        index: usize,
        bytes: usize,
    },
    /// The command was not encoded (a bug, never seen): its updates cannot
    /// be sent and go to the dead letters with this reason.
    Unencodable {
        indexes: Vec<usize>,
        reason: String,
    },
}

/// Where and how the commands of a write go.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub collection: &'a str,
    pub write_concern: Option<&'a RawDocument>,
    pub granularity: Granularity,
    pub limits: Limits,
    pub versioning: Versioning,
}

/// Builds the commands for a write, one at a time, so a large batch never
/// sits in memory as one buffer. Each command is written once, statements
/// in place, into the buffer the driver sends.
pub struct Commands<'a, I: Iterator<Item = usize>> {
    updates: &'a [&'a BucketUpdate],
    indexes: I,
    target: Target<'a>,
    /// An update written into the previous command that did not fit there.
    carry: Option<usize>,
    /// The capacity the next command starts with: the previous command's
    /// size, or for the first, [`Commands::first_capacity`].
    last_len: usize,
}

impl<'a, I: Iterator<Item = usize>> Commands<'a, I> {
    /// The commands for `updates[i]`, `i` from `indexes`, in that order.
    pub fn new(updates: &'a [&'a BucketUpdate], indexes: I, target: Target<'a>) -> Self {
        Self {
            updates,
            indexes,
            target,
            carry: None,
            last_len: 4096,
        }
    }

    /// The first command's starting capacity, e.g. the statements' estimated
    /// size (bounded by the budget): a buffer that grows by doubling up to a
    /// megabyte copies itself a dozen times.
    pub fn first_capacity(mut self, bytes: usize) -> Self {
        self.last_len = bytes;
        self
    }

    /// The indexes not yet put into a command: for an outage that stops a write.
    pub fn rest(self) -> impl Iterator<Item = usize> {
        self.carry.into_iter().chain(self.indexes)
    }

    /// `{update: <collection>, updates: [` — left open for the statements.
    fn open_envelope(&self, w: &mut Writer) -> (Open, Open) {
        let root = w.root();
        w.string("update", self.target.collection);
        let updates = w.array("updates");
        (root, updates)
    }

    /// `], ordered: false, writeConcern: …}`.
    fn close_envelope(&self, w: &mut Writer, (root, updates): (Open, Open)) {
        w.end(updates);
        w.boolean("ordered", false);
        if let Some(wc) = self.target.write_concern {
            w.raw_document("writeConcern", wc);
        }
        w.end(root);
    }

    /// Bytes the envelope adds after the last statement.
    fn tail_len(&self) -> usize {
        let mut w = Writer::default();
        let open = self.open_envelope(&mut w);
        let head = w.written();
        self.close_envelope(&mut w, open);
        w.written() - head
    }
}

impl<I: Iterator<Item = usize>> Iterator for Commands<'_, I> {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        let budget = self.target.limits.command_budget();
        let tail = self.tail_len();
        let mut w = Writer::with_capacity(self.last_len.min(budget) + 1024);
        let open = self.open_envelope(&mut w);
        let mut indexes = Vec::new();
        let mut key = [0; 20];
        while indexes.len() < self.target.limits.max_write_batch_size {
            let Some(i) = self.carry.take().or_else(|| self.indexes.next()) else {
                break;
            };
            let mark = w.written();
            let position = index_key(indexes.len(), &mut key);
            // The element's type byte, its key and the key's NUL.
            let overhead = 2 + position.len();
            write_statement(
                &mut w,
                position,
                self.updates[i],
                self.target.granularity,
                self.target.versioning,
            );
            if w.written() + tail > budget {
                if indexes.is_empty() {
                    // Too large even alone: it can never be sent.
                    return Some(Chunk::Oversized {
                        index: i,
                        bytes: w.written() - mark - overhead,
                    });
                }
                // Written again at the start of the next command.
                w.truncate(mark);
                self.carry = Some(i);
                break;
            }
            indexes.push(i);
        }
        if indexes.is_empty() {
            return None;
        }
        self.close_envelope(&mut w, open);
        self.last_len = w.written();
        Some(match w.finish() {
            Ok(body) => Chunk::Command(Command { body, indexes }),
            Err(e) => Chunk::Unencodable {
                indexes,
                reason: format!("the update command was not encoded: {e}"),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::rawdoc;

    use super::*;
    use crate::domain::{BucketKey, MetricName, SensorId};

    fn update(sensor: usize, values: Vec<(u16, f64)>) -> BucketUpdate {
        BucketUpdate {
            key: BucketKey {
                sensor: SensorId::parse(format!("sensor-{sensor:04}"))
                    .expect("valid")
                    .into_owned(),
                metric: MetricName::default_metric(),
                start: 1_700_000_000 / 3600 * 3600,
            },
            values,
            acks: Vec::new(),
        }
    }

    fn target(granularity: Granularity, limits: Limits) -> Target<'static> {
        Target {
            collection: "b",
            write_concern: None,
            granularity,
            limits,
            versioning: Versioning::PLAIN,
        }
    }

    /// Cuts `updates` and checks every command on its encoded bytes.
    fn cut(updates: &[BucketUpdate], limits: Limits) -> Vec<usize> {
        let refs: Vec<&BucketUpdate> = updates.iter().collect();
        let wc = rawdoc! { "w": "majority", "j": true };
        let mut seen = Vec::new();
        let mut sizes = Vec::new();
        let target = Target {
            collection: "buckets",
            write_concern: Some(&wc),
            granularity: Granularity::Hour,
            limits,
            // The largest statements: every value compared and versioned.
            versioning: Versioning {
                form: crate::store::document::Form::Guarded,
                keep_from: i64::MIN,
            },
        };
        for chunk in Commands::new(&refs, 0..refs.len(), target) {
            let Chunk::Command(c) = chunk else {
                panic!("nothing here is oversized: {chunk:?}")
            };
            let bytes = c.body.as_bytes().len();
            assert!(
                bytes <= limits.command_budget(),
                "a command of {bytes} bytes"
            );
            assert!(bytes + DRIVER_MARGIN <= limits.max_bson_object_size + 16 * 1024);
            assert!(c.indexes.len() <= limits.max_write_batch_size);
            let array = c.body.get_array("updates").expect("an updates array");
            assert_eq!(array.into_iter().count(), c.indexes.len());
            seen.extend(c.indexes);
            sizes.push(bytes);
        }
        assert_eq!(
            seen,
            (0..updates.len()).collect::<Vec<_>>(),
            "each once, in order"
        );
        sizes
    }

    #[test]
    fn the_worst_case_hour_request_is_cut_into_commands_within_the_limits() {
        // 833 sensors × one reading in each of 60 minutes: the 49 980-reading
        // POST that used to become one command of about 21 MiB.
        let updates: Vec<BucketUpdate> = (0..833)
            .map(|s| update(s, (0..60).map(|m| (m * 60 + 7, 1.5)).collect()))
            .collect();
        let sizes = cut(&updates, Limits::default());
        let total: usize = sizes.iter().sum();
        // The figures in the closing note: `cargo test worst_case -- --nocapture`.
        eprintln!(
            "worst-case hour flush: {} commands of {sizes:?} bytes",
            sizes.len()
        );
        assert!(
            total > 16 * 1024 * 1024,
            "the batch really is large: {total}"
        );
        assert!(sizes.len() >= 2, "{sizes:?}");
    }

    #[test]
    fn a_full_hour_of_seconds_for_100_sensors_fits_and_is_cut_exactly() {
        let updates: Vec<BucketUpdate> = (0..100)
            .map(|s| update(s, (0..3600).map(|o| (o, f64::from(o) / 8.0)).collect()))
            .collect();
        cut(&updates, Limits::default());
        // With a small server limit the same batch needs many commands, each within it.
        let small = Limits {
            max_bson_object_size: 1024 * 1024,
            ..Limits::default()
        };
        assert!(cut(&updates, small).len() > 5);
    }

    #[test]
    fn the_write_batch_size_caps_statements_per_command() {
        let updates: Vec<BucketUpdate> = (0..25).map(|s| update(s, vec![(1, 1.0)])).collect();
        let limits = Limits {
            max_write_batch_size: 10,
            ..Limits::default()
        };
        let refs: Vec<&BucketUpdate> = updates.iter().collect();
        let counts: Vec<usize> = Commands::new(&refs, 0..25, target(Granularity::Minute, limits))
            .map(|c| match c {
                Chunk::Command(c) => c.indexes.len(),
                Chunk::Oversized { .. } | Chunk::Unencodable { .. } => 0,
            })
            .collect();
        assert_eq!(counts, vec![10, 10, 5]);
    }

    #[test]
    fn an_update_too_large_to_send_alone_is_reported_and_the_rest_go_on() {
        let updates = [
            update(1, vec![(1, 1.0)]),
            update(2, (0..3600).map(|o| (o, 2.0)).collect()),
            update(3, vec![(1, 3.0)]),
        ];
        let refs: Vec<&BucketUpdate> = updates.iter().collect();
        let limits = Limits {
            max_bson_object_size: DRIVER_MARGIN + 8 * 1024,
            ..Limits::default()
        };
        let chunks: Vec<Chunk> =
            Commands::new(&refs, 0..3, target(Granularity::Hour, limits)).collect();
        assert!(matches!(chunks[0], Chunk::Command(ref c) if c.indexes == vec![0]));
        assert!(matches!(chunks[1], Chunk::Oversized { index: 1, bytes } if bytes > 8 * 1024));
        assert!(matches!(chunks[2], Chunk::Command(ref c) if c.indexes == vec![2]));
    }
}
