//! The rollup upkeep's outbox: statements written straight into `update`
//! commands cut to the server's limits.

use mongodb::bson::RawDocumentBuf;

use crate::store::StoreError;
use crate::store::command::Limits;
use crate::store::mongo::give_way::UPKEEP_STATEMENTS;
use crate::store::raw_writer::{self, Writer, index_key};

/// Rollup statements written straight into their `update` command, which
/// goes out once the next statement would not fit it: a roll-up of many
/// series holds one command at a time (an hour document's statement is some
/// 25 KB; a backfill's 1 200 series-hours were 30 MB at once), and each
/// statement is written once, where it had been built alone and copied in.
pub(in crate::store::mongo) struct Outbox {
    collection: String,
    limits: Limits,
    open: Option<Open>,
}

/// The command being written.
struct Open {
    w: Writer,
    root: raw_writer::Open,
    updates: raw_writer::Open,
    /// Bytes before the first statement.
    header: usize,
    statements: usize,
}

impl Outbox {
    pub(in crate::store::mongo) fn new(collection: &str, limits: Limits) -> Self {
        Self {
            collection: collection.to_owned(),
            limits,
            open: None,
        }
    }

    /// Writes a statement: `write` writes it as the element with the key it
    /// is given, and may be called twice. Answers the command before it,
    /// with its statement count, when the statement would take its
    /// statements past half the command budget or the command holds the
    /// most a write batch may or [`UPKEEP_STATEMENTS`]: to be sent now.
    pub(in crate::store::mongo) fn push(
        &mut self,
        write: impl Fn(&mut Writer, &str),
    ) -> Result<Option<(RawDocumentBuf, usize)>, StoreError> {
        let budget = self.limits.command_budget() / 2;
        let max = self.limits.max_write_batch_size.clamp(1, UPKEEP_STATEMENTS);
        let mut ready = None;
        if self.open.as_ref().is_some_and(|c| c.statements >= max) {
            ready = self.take()?;
        }
        let mut key = [0; 20];
        let c = self
            .open
            .get_or_insert_with(|| open(&self.collection, budget));
        let before = c.w.written();
        write(&mut c.w, index_key(c.statements, &mut key));
        if c.statements > 0 && c.w.written() - c.header > budget {
            c.w.truncate(before);
            ready = self.take()?;
            let c = self
                .open
                .get_or_insert_with(|| open(&self.collection, budget));
            write(&mut c.w, index_key(0, &mut key));
            c.statements = 1;
        } else {
            c.statements += 1;
        }
        Ok(ready)
    }

    /// The command written so far, if any, closed.
    pub(in crate::store::mongo) fn take(
        &mut self,
    ) -> Result<Option<(RawDocumentBuf, usize)>, StoreError> {
        let Some(Open {
            mut w,
            root,
            updates,
            statements,
            ..
        }) = self.open.take()
        else {
            return Ok(None);
        };
        w.end(updates);
        w.boolean("ordered", false);
        w.end(root);
        let command = w
            .finish()
            .map_err(|e| StoreError::Unclassed(format!("a rollup command: {e}")))?;
        Ok(Some((command, statements)))
    }
}

/// A new `update` command on `collection`, with room for `budget` bytes of
/// statements (only the pages written are ever touched).
fn open(collection: &str, budget: usize) -> Open {
    let mut w = Writer::with_capacity(budget.min(MAX_PRESIZED) + 64 * 1024);
    let root = w.root();
    w.string("update", collection);
    let updates = w.array("updates");
    Open {
        header: w.written(),
        w,
        root,
        updates,
        statements: 0,
    }
}

/// The most a command's buffer is sized up front.
const MAX_PRESIZED: usize = 16 << 20;
