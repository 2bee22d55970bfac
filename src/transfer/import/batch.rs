//! What travels from the reader to the senders: a file's lines cut into
//! batches, each line an item, and the lines refused on the way.

/// One line of a batch: where it came from, its bytes in the batch text.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub(super) line: u64,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) readings: usize,
}

/// A refused line.
#[derive(Debug, Clone)]
pub struct Reject {
    pub line: u64,
    pub reason: String,
    pub text: String,
}

/// Records of one file, sent as one request (or split if refused).
pub(super) struct Batch {
    pub(super) file: usize,
    /// Records consumed up to the end of this batch.
    pub(super) records: u64,
    pub(super) text: Vec<u8>,
    pub(super) items: Vec<Item>,
    pub(super) rejects: Vec<Reject>,
    /// The file's last batch.
    pub(super) last: bool,
}
