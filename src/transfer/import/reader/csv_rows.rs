//! The reader's CSV rows: plain lines split at their commas, and the rest
//! of a file from its first line that needs quoting rules read by the
//! `csv` crate.

use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

use tokio::sync::mpsc;

use super::super::batch::{Batch, Reject};
use super::job::{MAX_LINE_BYTES, Reader};
use crate::ingest::decode::csv as csv_body;
use crate::transfer::TransferError;

/// The `csv` crate's input, failing once a record passes
/// [`MAX_LINE_BYTES`] (an unclosed quote would read the rest of the file
/// into one record): `since` counts what was read since the last record
/// ended, its read-ahead included.
pub(in super::super) struct Bounded<R> {
    inner: R,
    since: Rc<Cell<usize>>,
}

impl<R> Bounded<R> {
    pub(in super::super) fn new(inner: R) -> Self {
        Self {
            inner,
            since: Rc::default(),
        }
    }
}

/// The `csv` crate's own read-ahead, allowed on top of a record.
const READ_AHEAD: usize = 64 * 1024;

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let since = self.since.get() + n;
        self.since.set(since);
        if since > MAX_LINE_BYTES + READ_AHEAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a record is longer than {MAX_LINE_BYTES} bytes (an unclosed quote?)"),
            ));
        }
        Ok(n)
    }
}

/// How far the reader went through a CSV file without the `csv` crate.
#[derive(Debug, Default)]
pub(super) struct PlainCsv {
    /// Lines read.
    pub(super) lines: u64,
    /// The header row was read.
    pub(super) header: bool,
}

impl Reader {
    /// One line of a CSV file (`raw`, its line ending on or off) read
    /// without the `csv` crate, when it has no quote and no carriage return
    /// but at its end: its fields are the ones the `csv` crate would read,
    /// and the service splits it at its commas. `None`: the line needs
    /// quoting rules, and nothing of it was taken. `Some(false)`: nobody
    /// listens.
    pub(super) fn plain_csv_line(
        &self,
        raw: &[u8],
        plain: &mut PlainCsv,
        records: &mut u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> Option<bool> {
        let text = csv_body::plain_line(raw)?;
        Some(self.plain_csv_row(text, plain, records, batch, readings, tx))
    }

    /// A line without quotes, carriage returns or its newline: a record
    /// unless it is blank, sent as it is (the service checks it, and
    /// `Checker` here once the service has refused its batch). `false`:
    /// nobody listens.
    pub(super) fn plain_csv_row(
        &self,
        text: &[u8],
        plain: &mut PlainCsv,
        records: &mut u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> bool {
        plain.lines += 1;
        // A blank line is no record, as the `csv` crate reads it.
        if text.is_empty() {
            return true;
        }
        *records += 1;
        if !plain.header {
            // Checked when the import was planned.
            plain.header = true;
            return true;
        }
        if *records <= self.skip {
            return true;
        }
        let full = self.offer(
            batch,
            plain.lines,
            readings,
            |out| {
                out.extend_from_slice(text);
                Ok(1)
            },
            String::new,
        );
        !full || self.send_full(batch, readings, *records, tx)
    }

    /// The rest of a CSV file from a line that needs quoting rules, read by
    /// the `csv` crate; its line numbers continue `plain`'s.
    pub(super) fn quoted_csv(
        &self,
        input: impl Read,
        plain: &PlainCsv,
        records: &mut u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> Result<bool, TransferError> {
        let io = |e: &dyn std::fmt::Display| TransferError::file(&self.path, e);
        let since = Rc::new(Cell::new(0));
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(Bounded {
                inner: input,
                since: since.clone(),
            });
        // Bytes, not text: only the fields a reading uses are checked as
        // UTF-8 (by the service), and no row allocates.
        let mut record = csv::ByteRecord::new();
        if !plain.header {
            // The header was checked when the import was planned.
            csv.read_byte_record(&mut record).map_err(|e| io(&e))?;
            *records += 1;
        }
        loop {
            let read = csv.read_byte_record(&mut record);
            since.set(0);
            match read {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => {
                    // A broken row (bad UTF-8, an unclosed quote) is
                    // refused; the rest of the file is still read.
                    let line = e.position().map_or(0, |p| plain.lines + p.line());
                    *records += 1;
                    if *records > self.skip {
                        batch.rejects.push(Reject {
                            line,
                            reason: e.to_string(),
                            text: String::new(),
                        });
                    }
                    if matches!(e.kind(), csv::ErrorKind::Io(_)) {
                        return Err(io(&e));
                    }
                    continue;
                }
            }
            *records += 1;
            if *records <= self.skip {
                continue;
            }
            let line = plain.lines + record.position().map_or(*records, |p| p.line());
            if self.take(batch, line, "", Some(&record), readings)
                && !self.send_full(batch, readings, *records, tx)
            {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
