//! One file's reading: the [`Reader`] the reader thread holds while it cuts
//! a file into batches (its lines in `reader`, its CSV records in
//! `csv_rows`), and the batch buffers it reuses.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::transfer::import::batch::Item;
use crate::transfer::import::formats::{Converter, Format};

/// Batch buffers handed back once sent, for the next batches: their pages
/// are faulted in once, not for every batch.
#[derive(Debug, Clone, Default)]
pub(in crate::transfer::import) struct Spares(Arc<Mutex<Vec<Spare>>>);

/// A batch's text and items, emptied.
type Spare = (Vec<u8>, Vec<Item>);

/// The longest line (or CSV record) an import reads: a file with no line
/// ends, or an unclosed quote, is refused instead of read into memory.
pub(in crate::transfer::import) const MAX_LINE_BYTES: usize = 1024 * 1024;

impl Spares {
    /// Enough for the batches in flight and queued; more are dropped.
    const KEPT: usize = 32;

    pub(in crate::transfer::import) fn give(&self, mut text: Vec<u8>, mut items: Vec<Item>) {
        text.clear();
        items.clear();
        let mut spares = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if spares.len() < Self::KEPT {
            spares.push((text, items));
        }
    }

    pub(super) fn take(&self) -> Option<Spare> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }
}

/// Reads one file into batches on the reader thread.
pub(in crate::transfer::import) struct Reader {
    pub(in crate::transfer::import) file: usize,
    pub(in crate::transfer::import) path: PathBuf,
    pub(in crate::transfer::import) format: Format,
    /// Records read before an interruption: skipped.
    pub(in crate::transfer::import) skip: u64,
    pub(in crate::transfer::import) converter: Converter,
    /// What starts each batch: a CSV file's header line.
    pub(in crate::transfer::import) head: Vec<u8>,
    pub(in crate::transfer::import) batch: usize,
    pub(in crate::transfer::import) max_bytes: usize,
    pub(in crate::transfer::import) read: Arc<AtomicU64>,
    pub(in crate::transfer::import) spares: Spares,
}
