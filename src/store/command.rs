//! Cuts bucket updates into `update` commands that fit the server's limits,
//! measured on the encoded bytes of each statement (they are raw BSON already).

use mongodb::bson::{RawArrayBuf, RawDocument, RawDocumentBuf, rawdoc};

use super::document::update_statement;
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
    Oversized { index: usize, bytes: usize },
}

/// Where and how the commands of a write go.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub collection: &'a str,
    pub write_concern: Option<&'a RawDocument>,
    pub granularity: Granularity,
    pub limits: Limits,
}

/// Builds the commands for a write, one at a time, so a large batch never
/// sits in memory as one buffer.
pub struct Commands<'a, I: Iterator<Item = usize>> {
    updates: &'a [&'a BucketUpdate],
    indexes: I,
    target: Target<'a>,
    /// A statement built for the previous command that did not fit there.
    carry: Option<(usize, RawDocumentBuf)>,
}

impl<'a, I: Iterator<Item = usize>> Commands<'a, I> {
    /// The commands for `updates[i]`, `i` from `indexes`, in that order.
    pub fn new(updates: &'a [&'a BucketUpdate], indexes: I, target: Target<'a>) -> Self {
        Self {
            updates,
            indexes,
            target,
            carry: None,
        }
    }

    /// The indexes not yet put into a command: for an outage that stops a write.
    pub fn rest(self) -> impl Iterator<Item = usize> {
        self.carry.map(|(i, _)| i).into_iter().chain(self.indexes)
    }

    fn envelope(&self, statements: RawArrayBuf) -> RawDocumentBuf {
        let mut body = rawdoc! {
            "update": self.target.collection,
            "updates": statements,
            "ordered": false,
        };
        if let Some(wc) = self.target.write_concern {
            body.append_ref("writeConcern", wc);
        }
        body
    }

    fn next_statement(&mut self) -> Option<(usize, RawDocumentBuf)> {
        if let Some(carried) = self.carry.take() {
            return Some(carried);
        }
        let i = self.indexes.next()?;
        Some((
            i,
            update_statement(self.updates[i], self.target.granularity),
        ))
    }
}

/// Bytes an array element adds besides its value: type, decimal key, NUL.
fn element_overhead(position: usize) -> usize {
    let mut digits = 1;
    let mut n = position;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    2 + digits
}

impl<I: Iterator<Item = usize>> Iterator for Commands<'_, I> {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        let budget = self.target.limits.command_budget();
        let empty = self.envelope(RawArrayBuf::new()).as_bytes().len();
        let mut statements = RawArrayBuf::new();
        let mut bytes = empty;
        let mut indexes = Vec::new();
        while indexes.len() < self.target.limits.max_write_batch_size {
            let Some((i, statement)) = self.next_statement() else {
                break;
            };
            let cost = element_overhead(indexes.len()) + statement.as_bytes().len();
            if bytes + cost > budget {
                if indexes.is_empty() {
                    // Too large even alone: it can never be sent.
                    return Some(Chunk::Oversized {
                        index: i,
                        bytes: statement.as_bytes().len(),
                    });
                }
                self.carry = Some((i, statement));
                break;
            }
            bytes += cost;
            statements.push(statement);
            indexes.push(i);
        }
        if indexes.is_empty() {
            return None;
        }
        Some(Chunk::Command(Command {
            body: self.envelope(statements),
            indexes,
        }))
    }
}

#[cfg(test)]
mod tests {
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
        }
    }

    fn target(granularity: Granularity, limits: Limits) -> Target<'static> {
        Target {
            collection: "b",
            write_concern: None,
            granularity,
            limits,
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
                Chunk::Oversized { .. } => 0,
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

    #[test]
    fn element_overhead_counts_the_decimal_key() {
        assert_eq!(element_overhead(0), 3);
        assert_eq!(element_overhead(9), 3);
        assert_eq!(element_overhead(10), 4);
        assert_eq!(element_overhead(99_999), 7);
    }
}
