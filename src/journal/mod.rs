//! The journal: an append-only, checksummed, fsync'd log on local disk between
//! the ingestors and the batcher.
//!
//! A writer's readings are framed ([`record`]) and handed to the journal task,
//! which appends whatever has queued up since its last commit and fsyncs once
//! for all of them (group commit), then answers them: that is the
//! acknowledgement. Right after the fsync, the same task offers the readings
//! to the batcher as *held* readings, tagged with their segment; the batcher
//! writes each bucket when its window ends. When the batcher has no room
//! (MongoDB is down, or memory is at its bound) the task stops offering and
//! later reads the backlog back from disk, in order, as room frees up: memory
//! stays bounded and the disk absorbs the outage until `journal.max_bytes`.
//!
//! A segment is deleted once it is read and the batcher reports every reading
//! from it stored or dead-lettered. On start, [`segments::Segments::open`]
//! checks every record's checksum, cuts torn tails, and the task replays the
//! segments that remain; bucket upserts are idempotent, so a replay of
//! readings already stored changes nothing.
//!
//! [`Intake`] is what the ingestors call: it sends readings through the
//! journal, or straight to the batcher when the journal is off or the writer
//! asked to wait for storage.

mod cursor;
mod errors;
mod files;
mod handle;
mod intake;
mod record;
mod segments;
mod settings;
mod task;

use crate::domain::Reading;
pub use errors::IntakeError;
pub use handle::Journal;
pub use intake::{Ack, Intake, NotSafe, REGISTER_WAIT, Registrar, Wait};
use record::FRAME_HEADER;
pub use settings::Settings;
pub use task::JournalTask;

/// One framed journal record of `readings` (for the benchmarks).
pub fn encode_frame(readings: &[Reading<'_>]) -> Vec<u8> {
    record::encode(readings, 0)
}

/// The readings of a framed record, checksum verified (for the benchmarks).
pub fn decode_frame(frame: &[u8]) -> Option<Vec<Reading<'_>>> {
    let record::Frame::Valid { len } = record::frame_at(frame, 0) else {
        return None;
    };
    record::decode(&frame[FRAME_HEADER..FRAME_HEADER + len])
        .ok()
        .map(|d| d.readings)
}
