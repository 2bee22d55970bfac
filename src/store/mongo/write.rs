//! Writing a flush: commands cut to the server's limits, per-statement
//! outcomes, poison commands split until the bad statement stands alone, and
//! upsert races re-sent.

use mongodb::bson::{Bson, Document};

use super::classify::unconfirmed;
use super::connection::MongoStore;
use crate::batcher::{Outcome, Written};
use crate::domain::BucketUpdate;
use crate::store::command::{Chunk, Commands, Target};
use crate::store::document::{Form, Versioning, estimated_len};
use crate::store::errors::{self, Class, DUPLICATE_KEY};

/// Times an upsert that lost a race to create its bucket is sent again.
const DUPLICATE_KEY_RETRIES: usize = 5;

impl MongoStore {
    /// One write: cut into commands, sent, each update's outcome read.
    pub(super) async fn write_updates(&self, updates: &[&BucketUpdate]) -> Written {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; updates.len()];
        let mut round_trips = 0;
        let mut group: Vec<usize> = (0..updates.len()).collect();
        // Two writers creating the same bucket at once: one insert wins, the
        // other fails on the unique index and succeeds as an update when
        // resent. A plain statement on a bucket that holds versions fails the
        // same way, and goes again guarded.
        let keep_from = self.watermarks.keep_from();
        for round in 0..=DUPLICATE_KEY_RETRIES {
            if group.is_empty() {
                break;
            }
            let versioning = Versioning {
                form: if round == 0 {
                    Form::Plain
                } else {
                    Form::Guarded
                },
                keep_from,
            };
            group = self
                .send_group(updates, group, versioning, &mut outcomes, &mut round_trips)
                .await;
        }
        for i in group {
            outcomes[i] = Some(Outcome::Outage(
                "the upsert kept losing races on the unique index".into(),
            ));
        }
        Written {
            outcomes: outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(|| Outcome::Outage("not sent".into())))
                .collect(),
            round_trips,
        }
    }

    /// Sends `group` (indexes into `updates`) as commands within the limits,
    /// recording each update's outcome; returns the indexes that lost an
    /// upsert race and must be sent again.
    async fn send_group(
        &self,
        updates: &[&BucketUpdate],
        group: Vec<usize>,
        versioning: Versioning,
        outcomes: &mut [Option<Outcome>],
        round_trips: &mut usize,
    ) -> Vec<usize> {
        // Long: the command loop of a group: each command sent and every update's outcome recorded.
        let mut races = Vec::new();
        // Groups to send; a command refused as a whole for a poison error is
        // split in halves until the statement that causes it stands alone.
        let mut work = std::collections::VecDeque::from([group]);
        while let Some(group) = work.pop_front() {
            let target = Target {
                collection: self.buckets.name(),
                write_concern: self.write_concern.as_deref(),
                granularity: self.granularity,
                limits: self.limits,
                versioning,
            };
            let capacity = group.iter().map(|&i| estimated_len(updates[i])).sum();
            let mut commands =
                Commands::new(updates, group.into_iter(), target).first_capacity(capacity);
            while let Some(chunk) = commands.next() {
                let command = match chunk {
                    Chunk::Oversized { index, bytes } => {
                        outcomes[index] = Some(Outcome::Poison(format!(
                            "the bucket update is {bytes} bytes, more than the server takes in one command"
                        )));
                        continue;
                    }
                    Chunk::Unencodable { indexes, reason } => {
                        for i in indexes {
                            outcomes[i] = Some(Outcome::Poison(reason.clone()));
                        }
                        continue;
                    }
                    Chunk::Command(command) => command,
                };
                *round_trips += 1;
                match self.driver(self.db.run_raw_command(command.body)).await {
                    Ok(reply) => read_reply(&reply, &command.indexes, outcomes, &mut races),
                    Err(e) => {
                        let class = errors::classify(&e);
                        let message = e.to_string();
                        match class {
                            Class::Poison if command.indexes.len() == 1 => {
                                outcomes[command.indexes[0]] =
                                    Some(Outcome::Poison(errors::describe(&e)));
                            }
                            Class::Poison => {
                                let mut indexes = command.indexes;
                                let back = indexes.split_off(indexes.len() / 2);
                                work.push_front(back);
                                work.push_front(indexes);
                            }
                            Class::Outage => {
                                // The server is in the way: nothing more goes out now.
                                let unknown = errors::is_unclassed(&e);
                                let rest = command
                                    .indexes
                                    .into_iter()
                                    .chain(commands.rest())
                                    .chain(work.into_iter().flatten())
                                    .chain(races);
                                for i in rest {
                                    outcomes[i] = Some(if unknown {
                                        Outcome::Unknown(message.clone())
                                    } else {
                                        Outcome::Outage(message.clone())
                                    });
                                }
                                return Vec::new();
                            }
                        }
                    }
                }
            }
        }
        races
    }
}

/// Records the outcome of each statement of one unordered `update` reply.
fn read_reply(
    reply: &Document,
    indexes: &[usize],
    outcomes: &mut [Option<Outcome>],
    races: &mut Vec<usize>,
) {
    let mut failed = vec![false; indexes.len()];
    if let Ok(errors) = reply.get_array("writeErrors") {
        for e in errors.iter().filter_map(Bson::as_document) {
            let code = e.get_i32("code").unwrap_or_default();
            let Some(position) = e
                .get_i32("index")
                .ok()
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < indexes.len())
            else {
                continue;
            };
            failed[position] = true;
            let i = indexes[position];
            if code == DUPLICATE_KEY {
                races.push(i);
                continue;
            }
            let message = format!(
                "code {code}: {}",
                e.get_str("errmsg").unwrap_or("no message")
            );
            outcomes[i] = Some(match errors::classify_write_error(code) {
                Class::Outage => Outcome::Outage(message),
                Class::Poison => Outcome::Poison(message),
            });
        }
    }
    let unconfirmed = unconfirmed(reply);
    for (position, &i) in indexes.iter().enumerate() {
        if !failed[position] {
            outcomes[i] = Some(match &unconfirmed {
                Some(message) => Outcome::Outage(message.clone()),
                None => Outcome::Stored,
            });
        }
    }
}
