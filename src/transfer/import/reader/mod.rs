//! The reader thread: a file's lines (gunzipped when they are gzip),
//! cut into batches, handed to the senders in file order.

mod csv_rows;
mod job;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

pub(super) use self::csv_rows::Bounded;
use self::csv_rows::PlainCsv;
use self::job::MAX_LINE_BYTES;
pub(super) use self::job::{Reader, Spares};
use super::batch::{Batch, Item, Reject};
use super::formats::Format;
use crate::transfer::TransferError;

/// Counts the bytes read from the file (before decompression): the progress.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The file's text: gunzipped if it starts with gzip's magic bytes.
pub(super) fn open(
    path: &Path,
    read: Arc<AtomicU64>,
) -> Result<Box<dyn BufRead + Send>, TransferError> {
    let io = |e: std::io::Error| TransferError::file(path, e);
    let file = File::open(path).map_err(io)?;
    let mut buffered = BufReader::with_capacity(1 << 16, Counting { inner: file, read });
    let gz = buffered.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    Ok(if gz {
        Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::bufread::MultiGzDecoder::new(buffered),
        ))
    } else {
        Box::new(buffered)
    })
}

fn too_long(path: &Path, line: u64) -> TransferError {
    TransferError::Io(format!(
        "{}: line {line} is longer than {MAX_LINE_BYTES} bytes without ending; is the file newline-delimited (an unclosed quote, in CSV)?",
        path.display()
    ))
}

/// Refuses a line being gathered once it passes [`MAX_LINE_BYTES`].
fn check_line(carry: &[u8], path: &Path, records: u64) -> Result<(), TransferError> {
    if carry.len() > MAX_LINE_BYTES {
        return Err(too_long(path, records + 1));
    }
    Ok(())
}

impl Reader {
    /// `false` when the import is over (an error sent, or nobody listens).
    pub(super) fn run(mut self, tx: &mpsc::Sender<Result<Batch, TransferError>>) -> bool {
        match self.batches(tx) {
            Ok(more) => more,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                false
            }
        }
    }

    fn fresh(&self, records: u64) -> Batch {
        let (mut text, items) = self.spares.take().unwrap_or_else(|| {
            (
                Vec::with_capacity(self.max_bytes.min(1 << 20)),
                // A line holds at least one reading: never grown.
                Vec::with_capacity(self.batch.min(1 << 16)),
            )
        });
        text.extend_from_slice(&self.head);
        Batch {
            file: self.file,
            records,
            text,
            items,
            rejects: Vec::new(),
            last: false,
        }
    }

    fn batches(
        &mut self,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> Result<bool, TransferError> {
        let input = open(&self.path, self.read.clone())?;
        let mut records: u64 = 0;
        let mut batch = self.fresh(0);
        let mut readings = 0;
        let more = match self.format {
            Format::Csv => self.csv_batches(input, &mut records, &mut batch, &mut readings, tx)?,
            Format::Ndjson | Format::LineProtocol => {
                self.text_batches(input, &mut records, &mut batch, &mut readings, tx)?
            }
        };
        if !more {
            return Ok(false);
        }
        batch.records = records.max(self.skip);
        batch.last = true;
        Ok(tx.blocking_send(Ok(batch)).is_ok())
    }

    /// A CSV file's lines into batches: plain lines cut in place, and from
    /// the first that needs quoting rules, the rest through the `csv` crate.
    /// `false` when the import is over.
    fn csv_batches(
        &mut self,
        mut input: Box<dyn BufRead + Send>,
        records: &mut u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> Result<bool, TransferError> {
        // Long: the cutter's hot loop over the read buffer: the carried line, the hand-off to the csv crate and the batch cuts share its state.
        let io = |e: &dyn std::fmt::Display| TransferError::file(&self.path, e);
        let mut plain = PlainCsv::default();
        // A line that spans the reader's buffer is gathered here.
        let mut carry = Vec::new();
        // From the first line that needs quoting rules, that line and
        // the rest of the file go to the `csv` crate.
        let mut quoted: Option<Vec<u8>> = None;
        'plain: loop {
            let buf = input.fill_buf().map_err(|e| io(&e))?;
            if buf.is_empty() {
                if !carry.is_empty() {
                    let line = std::mem::take(&mut carry);
                    match self.plain_csv_line(&line, &mut plain, records, batch, readings, tx) {
                        Some(true) => {}
                        Some(false) => return Ok(false),
                        None => quoted = Some(line),
                    }
                }
                break;
            }
            let len = buf.len();
            let mut used = 0;
            // The line begun in the buffer before ends first.
            if !carry.is_empty()
                && let Some(i) = memchr::memchr(b'\n', buf)
            {
                carry.extend_from_slice(&buf[..=i]);
                check_line(&carry, &self.path, *records)?;
                match self.plain_csv_line(&carry, &mut plain, records, batch, readings, tx) {
                    Some(true) => {}
                    Some(false) => return Ok(false),
                    None => {
                        carry.extend_from_slice(&buf[i + 1..]);
                        check_line(&carry, &self.path, *records)?;
                        input.consume(len);
                        quoted = Some(std::mem::take(&mut carry));
                        break 'plain;
                    }
                }
                carry.clear();
                used = i + 1;
            }
            // The buffer's whole lines in one pass of `memchr`, which
            // stops at line ends and at what needs quoting rules.
            if carry.is_empty() {
                let mut at = used;
                // The line ends in a CRLF.
                let mut crlf = false;
                while let Some(i) = memchr::memchr3(b'\n', b'"', b'\r', &buf[at..]) {
                    let i = at + i;
                    match buf[i] {
                        b'\n' => {
                            let line = &buf[used..i - usize::from(crlf)];
                            if !self.plain_csv_row(line, &mut plain, records, batch, readings, tx) {
                                return Ok(false);
                            }
                            used = i + 1;
                            crlf = false;
                        }
                        b'\r' if buf.get(i + 1) == Some(&b'\n') => crlf = true,
                        // Its newline is in the next buffer: the line
                        // is carried, and looked at whole there.
                        b'\r' if i + 1 == len => break,
                        _ => {
                            let rest = buf[used..].to_vec();
                            input.consume(len);
                            quoted = Some(rest);
                            break 'plain;
                        }
                    }
                    at = i + 1;
                }
            }
            carry.extend_from_slice(&buf[used..]);
            check_line(&carry, &self.path, *records)?;
            input.consume(len);
        }
        if let Some(rest) = quoted {
            let more = self.quoted_csv(
                std::io::Cursor::new(rest).chain(input),
                &plain,
                records,
                batch,
                readings,
                tx,
            )?;
            if !more {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// An NDJSON or line-protocol file's lines into batches, read in place
    /// (a line spanning two buffers is gathered). `false` when the import
    /// is over.
    fn text_batches(
        &mut self,
        mut input: Box<dyn BufRead + Send>,
        records: &mut u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> Result<bool, TransferError> {
        // Long: the cutter's hot loop over the read buffer: the carried line, whole-buffer UTF-8 checks and the batch cuts share its state.
        let io = |e: &dyn std::fmt::Display| TransferError::file(&self.path, e);
        // A line that spans the reader's buffer is gathered here;
        // the others are read in place, not copied.
        let mut carry = Vec::new();
        loop {
            let buf = input.fill_buf().map_err(|e| io(&e))?;
            if buf.is_empty() {
                if !carry.is_empty() {
                    *records += 1;
                    let raw = std::mem::take(&mut carry);
                    if !self.text_line(&raw, *records, batch, readings, tx) {
                        return Ok(false);
                    }
                }
                break;
            }
            let mut used = 0;
            // The line begun in the buffer before ends first.
            if !carry.is_empty()
                && let Some(i) = memchr::memchr(b'\n', buf)
            {
                carry.extend_from_slice(&buf[..=i]);
                check_line(&carry, &self.path, *records)?;
                *records += 1;
                if !self.text_line(&carry, *records, batch, readings, tx) {
                    return Ok(false);
                }
                carry.clear();
                used = i + 1;
            }
            // The buffer's whole lines checked as UTF-8 at once, then
            // sliced out (a line that is not UTF-8 makes the buffer
            // go line by line below, where it is refused alone).
            if carry.is_empty()
                && *records >= self.skip
                && let Some(last) = memchr::memrchr(b'\n', &buf[used..]).map(|i| used + i)
                && let Ok(region) = std::str::from_utf8(&buf[used..last])
            {
                // `memchr`'s search, not `str::split`'s: `split`'s
                // newline search was a seventh of the command's CPU.
                let mut from = 0;
                for end in memchr::memchr_iter(b'\n', region.as_bytes())
                    .chain(std::iter::once(region.len()))
                {
                    *records += 1;
                    let text = &region[from..end];
                    from = end + 1;
                    if !self.text(text, *records, batch, readings, tx) {
                        return Ok(false);
                    }
                }
                used = last + 1;
            }
            let mut more = true;
            while let Some(i) = memchr::memchr(b'\n', &buf[used..]) {
                let end = used + i + 1;
                *records += 1;
                let raw = if carry.is_empty() {
                    &buf[used..end]
                } else {
                    carry.extend_from_slice(&buf[used..end]);
                    check_line(&carry, &self.path, *records)?;
                    &carry[..]
                };
                more = self.text_line(raw, *records, batch, readings, tx);
                carry.clear();
                used = end;
                if !more {
                    break;
                }
            }
            if !more {
                return Ok(false);
            }
            let len = buf.len();
            if used < len {
                carry.extend_from_slice(&buf[used..]);
                check_line(&carry, &self.path, *records)?;
            }
            input.consume(len);
        }
        Ok(true)
    }

    /// Offers one record to the batch (converted, or refused with its
    /// reason); answers whether the batch is full.
    fn take(
        &self,
        batch: &mut Batch,
        line: u64,
        text: &str,
        record: Option<&csv::ByteRecord>,
        readings: &mut usize,
    ) -> bool {
        self.offer(
            batch,
            line,
            readings,
            |out| self.converter.line(text, record, out),
            || match record {
                Some(r) => r
                    .iter()
                    .map(String::from_utf8_lossy)
                    .collect::<Vec<_>>()
                    .join(","),
                None => text.to_owned(),
            },
        )
    }

    /// Appends what `convert` writes of a record at `line` to the batch, or
    /// refuses the record (as `refused_text` shows it) with `convert`'s
    /// reason; answers whether the batch is full.
    fn offer(
        &self,
        batch: &mut Batch,
        line: u64,
        readings: &mut usize,
        convert: impl FnOnce(&mut Vec<u8>) -> Result<usize, String>,
        refused_text: impl FnOnce() -> String,
    ) -> bool {
        let mark = batch.text.len();
        if !batch.items.is_empty() {
            batch.text.push(b'\n');
        }
        let start = batch.text.len();
        match convert(&mut batch.text) {
            Ok(n) => {
                batch.items.push(Item {
                    line,
                    start,
                    end: batch.text.len(),
                    readings: n,
                });
                *readings += n;
            }
            Err(reason) => {
                batch.text.truncate(mark);
                batch.rejects.push(Reject {
                    line,
                    reason,
                    text: refused_text(),
                });
            }
        }
        *readings >= self.batch || batch.text.len() >= self.max_bytes
    }

    /// Sends the full batch and starts the next; `false` when nobody listens.
    fn send_full(
        &self,
        batch: &mut Batch,
        readings: &mut usize,
        records: u64,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> bool {
        batch.records = records;
        let full = std::mem::replace(batch, self.fresh(records));
        *readings = 0;
        tx.blocking_send(Ok(full)).is_ok()
    }

    /// One NDJSON or line-protocol line (`raw`, with its newline): taken,
    /// and a full batch sent. `false` when nobody listens.
    fn text_line(
        &self,
        raw: &[u8],
        records: u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> bool {
        if records <= self.skip {
            return true;
        }
        match std::str::from_utf8(raw) {
            Ok(text) => self.text(text, records, batch, readings, tx),
            Err(_) => {
                batch.rejects.push(Reject {
                    line: records,
                    reason: "the line is not UTF-8".to_owned(),
                    text: String::from_utf8_lossy(raw).trim_end().to_owned(),
                });
                true
            }
        }
    }

    /// One line's text (its newline, if any, still on): taken, and a full
    /// batch sent. `false` when nobody listens.
    fn text(
        &self,
        text: &str,
        records: u64,
        batch: &mut Batch,
        readings: &mut usize,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> bool {
        let text = text.trim_end_matches(['\n', '\r']);
        // Blank lines and line-protocol comments hold nothing (a line that
        // starts with neither space nor `#` is neither: no trim needed).
        let plain = text
            .as_bytes()
            .first()
            .is_some_and(|&b| b != b'#' && !b.is_ascii_whitespace());
        if !plain {
            let trimmed = text.trim();
            if trimmed.is_empty()
                || (self.format == Format::LineProtocol && trimmed.starts_with('#'))
            {
                return true;
            }
        }
        !self.take(batch, records, text, None, readings)
            || self.send_full(batch, readings, records, tx)
    }
}

#[cfg(test)]
mod tests {
    use super::super::TsUnit;
    use super::*;
    use crate::ingest::decode::csv as csv_body;
    use crate::ingest::decode::csv::CsvColumns;
    use crate::transfer::import::formats::Converter;
    use std::path::PathBuf;

    /// The batches a reader makes of `text`, resumed past `skip` records:
    /// each line sent with its number, and the refused ones.
    fn read(text: &[u8], skip: u64, batch: usize) -> (Vec<(u64, String)>, Vec<u64>, u64) {
        let converter = super::super::formats::tests::converter(Format::Ndjson);
        read_as(Format::Ndjson, converter, text, skip, batch)
    }

    fn read_as(
        format: Format,
        converter: Converter,
        text: &[u8],
        skip: u64,
        batch: usize,
    ) -> (Vec<(u64, String)>, Vec<u64>, u64) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("lines");
        std::fs::write(&path, text).expect("written");
        let head = match format {
            Format::Csv => format!("{}\n", csv_columns().canonical_header()).into_bytes(),
            _ => Vec::new(),
        };
        let reader = Reader {
            file: 0,
            path,
            format,
            skip,
            converter,
            head: head.clone(),
            batch,
            max_bytes: 1 << 20,
            read: Arc::new(AtomicU64::new(0)),
            spares: Spares::default(),
        };
        let (tx, mut rx) = mpsc::channel(4);
        let thread = std::thread::spawn(move || reader.run(&tx));
        let (mut sent, mut refused, mut records) = (Vec::new(), Vec::new(), 0);
        while let Some(b) = rx.blocking_recv() {
            let b = b.expect("no error");
            assert!(
                b.text.starts_with(&head),
                "each batch starts with the header"
            );
            for item in &b.items {
                let line = String::from_utf8(b.text[item.start..item.end].to_vec());
                sent.push((item.line, line.expect("UTF-8")));
            }
            refused.extend(b.rejects.iter().map(|r| r.line));
            records = b.records;
        }
        assert!(thread.join().expect("the reader"));
        (sent, refused, records)
    }

    /// The error a reader of `text` ends with.
    fn read_error(format: Format, converter: Converter, text: &[u8], gzip: bool) -> String {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("lines");
        let bytes = if gzip {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(text).expect("compressed");
            gz.finish().expect("compressed")
        } else {
            text.to_vec()
        };
        std::fs::write(&path, bytes).expect("written");
        let reader = Reader {
            file: 0,
            path,
            format,
            skip: 0,
            converter,
            head: Vec::new(),
            batch: 10,
            max_bytes: 1 << 20,
            read: Arc::new(AtomicU64::new(0)),
            spares: Spares::default(),
        };
        let (tx, mut rx) = mpsc::channel(4);
        let thread = std::thread::spawn(move || reader.run(&tx));
        let mut error = None;
        while let Some(b) = rx.blocking_recv() {
            if let Err(e) = b {
                error = Some(e.to_string());
            }
        }
        assert!(!thread.join().expect("the reader"), "the import stops");
        error.expect("an error")
    }

    /// A file with no line end (or a CSV quote never closed), gzipped or
    /// not, is refused past MAX_LINE_BYTES instead of read into memory.
    #[test]
    fn a_line_that_never_ends_is_refused_at_the_bound() {
        let endless = vec![b'x'; 3 * MAX_LINE_BYTES];
        for gzip in [false, true] {
            let e = read_error(
                Format::Ndjson,
                super::super::formats::tests::converter(Format::Ndjson),
                &endless,
                gzip,
            );
            assert!(e.contains("line 1 is longer than"), "{e}");
        }
        let mut quoted = b"sensor,metric,ts,value,note\ns1,m,1764000000,1.5,\"".to_vec();
        quoted.extend(&endless);
        for gzip in [false, true] {
            let e = read_error(
                Format::Csv,
                super::super::formats::tests::converter(Format::Csv),
                &quoted,
                gzip,
            );
            assert!(e.contains("longer than"), "{e}");
        }
    }

    #[test]
    fn a_batch_reuses_the_buffers_handed_back() {
        let spares = Spares::default();
        let reader = Reader {
            file: 0,
            path: PathBuf::new(),
            format: Format::Ndjson,
            skip: 0,
            converter: super::super::formats::tests::converter(Format::Ndjson),
            head: Vec::new(),
            batch: 10,
            max_bytes: 1 << 20,
            read: Arc::new(AtomicU64::new(0)),
            spares: spares.clone(),
        };
        let mut text = Vec::with_capacity(3 << 20);
        text.extend_from_slice(b"sent");
        let at = text.as_ptr();
        spares.give(text, Vec::new());
        let reused = reader.fresh(0);
        assert_eq!(reused.text.as_ptr(), at);
        assert!(reused.text.is_empty());
        let fresh = reader.fresh(0);
        assert_ne!(fresh.text.as_ptr(), at, "none left: a new one");
    }

    /// Lines read in place from the reader's buffer, gathered across its
    /// edges, are the file's lines: checked against `split` on files larger
    /// than the buffer, with CRLF, blank, bad and unterminated lines.
    #[test]
    fn lines_across_the_read_buffer_are_read_whole_and_numbered() {
        let line = |i: u64| {
            // Lengths vary so that lines straddle the buffer's edges.
            format!(
                r#"{{"sensor":"s{i}{}","ts":1764000000000,"value":{i}.5}}"#,
                "x".repeat((i % 37) as usize)
            )
        };
        let mut text = Vec::new();
        let (mut want, mut bad) = (Vec::new(), Vec::new());
        let n = 6_000u64;
        for i in 1..=n {
            match i % 500 {
                7 => text.extend_from_slice(b"\r\n"),
                // Only in the first half: the reader's buffers without such
                // a line are checked as UTF-8 whole (its fast path).
                8 if i < n / 2 => {
                    text.extend_from_slice(b"{\"sensor\":\"\xff\"}\n");
                    bad.push(i);
                }
                9 => {
                    text.extend_from_slice(b"not an object\n");
                    bad.push(i);
                }
                _ => {
                    let l = line(i);
                    text.extend_from_slice(l.as_bytes());
                    text.extend_from_slice(if i.is_multiple_of(3) { b"\r\n" } else { b"\n" });
                    want.push(i);
                }
            }
        }
        // The last line without its newline.
        text.truncate(text.len() - if n.is_multiple_of(3) { 2 } else { 1 });
        assert!(text.len() > 3 << 16);
        for skip in [0, 1_234] {
            let (sent, refused, records) = read(&text, skip, 1000);
            let kept = |l: &&u64| **l > skip;
            assert_eq!(
                sent,
                want.iter()
                    .filter(kept)
                    .map(|&i| (i, line(i)))
                    .collect::<Vec<_>>()
            );
            assert_eq!(
                refused,
                bad.iter().filter(kept).copied().collect::<Vec<_>>()
            );
            assert_eq!(records, n);
        }
    }

    /// CSV files: sensor, metric, ts (s), value and an ignored note.
    fn csv_columns() -> CsvColumns {
        let header = ["sensor", "metric", "ts", "value", "note"];
        CsvColumns::from_header(header, &[], &["note".to_owned()]).expect("the header")
    }

    /// Why the service refuses a row as the import sends it, if it does.
    fn refused(text: &str) -> bool {
        let ctx = super::super::formats::tests::ctx();
        let c = csv_columns();
        csv_body::check_row(text.as_bytes(), &c, TsUnit::Seconds, &ctx).is_err()
    }

    /// What the reader makes of a CSV file, as the `csv` crate reads all of
    /// it: each record sent as one CSV line, at the line it starts on
    /// (counted here: the `csv` crate starts a row after a CRLF on the line
    /// before), and the lines of the rows the service refuses.
    fn csv_model(text: &[u8], skip: u64) -> (Vec<(u64, String)>, Vec<u64>, u64) {
        let ctx = super::super::formats::tests::ctx();
        let c = csv_columns();
        let mut csv = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(text);
        let mut record = csv::ByteRecord::new();
        let (mut sent, mut refused, mut records) = (Vec::new(), Vec::new(), 0u64);
        while csv.read_byte_record(&mut record).expect("a record") {
            records += 1;
            if records == 1 || records <= skip {
                continue;
            }
            let mut at =
                usize::try_from(record.position().expect("a position").byte()).expect("in memory");
            while matches!(text.get(at), Some(b'\r' | b'\n')) {
                at += 1;
            }
            let line = 1 + memchr::memchr_iter(b'\n', &text[..at]).count() as u64;
            let mut out = Vec::new();
            csv_body::write_row(&record, &mut out);
            sent.push((line, String::from_utf8(out).expect("UTF-8")));
            if c.reading(&&record, TsUnit::Seconds, &ctx).is_err() {
                refused.push(line);
            }
        }
        // A resumed file reports at least the records resumed past.
        (sent, refused, records.max(skip))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// Lines split by hand are the rows the `csv` crate reads, with the
        /// same line numbers, and a file is handed to the `csv` crate from
        /// its first line that needs quoting rules: checked on files larger
        /// than the reader's buffer, with CRLF, quoted fields (some across
        /// lines), bad rows and a last line without its newline.
        #[test]
        fn csv_lines_read_by_hand_are_the_rows_the_csv_crate_reads(
            kinds in proptest::collection::vec(0u8..12, 2_500..3_500),
            quoted_from in proptest::option::of(0usize..3_500),
            skip in 0u64..3_000,
            header_quoted in proptest::bool::ANY,
        ) {
            let mut text: Vec<u8> = if header_quoted {
                b"\"sensor\",metric,ts,value,note\n".to_vec()
            } else {
                b"sensor,metric,ts,value,note\n".to_vec()
            };
            for (i, &kind) in kinds.iter().enumerate() {
                let quoting = header_quoted || quoted_from.is_some_and(|q| i >= q);
                let row = match kind {
                    0 => format!("s{i},m,1763999000,x{i},n"),
                    // After the switch lines are numbered as the `csv` crate
                    // numbers them, which a CRLF throws off.
                    1 if !quoting => format!("s{i},m,1763999000,{i}.5\r"),
                    2 if quoting => format!("\"s{i}\",m,1763999000,{i}.5,\"a\nb\""),
                    3 if quoting => format!("s{i},m,1763999000,{i}.5,\"say \"\"hi\"\"\""),
                    _ => format!("s{i},m,{},{i}.25,n{}", 1_763_999_000 + i % 900, "x".repeat(i % 29)),
                };
                text.extend_from_slice(row.as_bytes());
                text.push(b'\n');
            }
            text.pop();
            proptest::prop_assert!(text.len() > 1 << 16);
            let (sent, at_read, records) = read_as(Format::Csv, super::super::formats::tests::converter(Format::Csv), &text, skip, 700);
            let (want_sent, want_refused, want_records) = csv_model(&text, skip);
            proptest::prop_assert_eq!(records, want_records);
            let first = sent.iter().zip(&want_sent).find(|(a, b)| a != b);
            proptest::prop_assert_eq!(first, None);
            proptest::prop_assert_eq!(sent.len(), want_sent.len());
            proptest::prop_assert!(at_read.is_empty(), "rows are checked by the service");
            // The rows as sent are refused where the rows as read are.
            let refused: Vec<u64> =
                sent.iter().filter(|(_, t)| refused(t)).map(|(l, _)| *l).collect();
            proptest::prop_assert_eq!(refused, want_refused);
        }
    }

    /// A blank line is no record; the rows after it carry their own lines.
    #[test]
    fn blank_csv_lines_are_skipped_and_rows_keep_their_line_numbers() {
        let text = b"sensor,metric,ts,value,note\n\ns1,m,1763999000,1,n\r\n\r\n\ns2,m,1763999000,bad,n\ns3,m,1763999000,3,n";
        let (sent, _, records) = read_as(
            Format::Csv,
            super::super::formats::tests::converter(Format::Csv),
            text,
            0,
            10,
        );
        let lines: Vec<u64> = sent.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [3, 6, 7]);
        let bad: Vec<u64> = sent
            .iter()
            .filter(|(_, t)| refused(t))
            .map(|(l, _)| *l)
            .collect();
        assert_eq!(bad, [6]);
        assert_eq!(
            sent[0].1, "s1,m,1763999000,1,n",
            "sent as it is, without its CR"
        );
        assert_eq!(records, 4, "the header and three rows");
        // Resumed past the header and the first row.
        let (sent, _, _) = read_as(
            Format::Csv,
            super::super::formats::tests::converter(Format::Csv),
            text,
            2,
            10,
        );
        let lines: Vec<u64> = sent.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [6, 7]);
    }
}
