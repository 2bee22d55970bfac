//! `hourglass import`: files of readings into a running instance, through
//! its HTTP API, so they take the same validation, journal and batcher as
//! every other write.
//!
//! - [`formats`]: CSV rows and line-protocol lines checked with the
//!   service's own decoders before they are sent, NDJSON lines sent as they
//!   are (the service decodes them once, not twice) and checked here only
//!   in a batch the service refused; a bad line goes to the file's rejects
//!   with its line number while the good ones are stored.
//! - [`checkpoint`]: every second and at each file's end, the records
//!   acknowledged (journaled) so far, so an interrupted import resumes
//!   there. Batches acknowledged after it, or in flight when it stopped,
//!   are sent again: a reading written twice at its second changes
//!   nothing, so nothing counts twice.
//!
//! A reader thread decodes (gzip or plain) and converts lines into batches;
//! a few batches are in flight at once and settle in file order, each
//! writing its rejects and then the checkpoint. A batch the service refuses
//! (400) is checked line by line, then split until the lines it refuses
//! are found.

pub mod checkpoint;
pub mod formats;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use self::checkpoint::{Checkpoint, Rejects};
use self::formats::{Converter, CsvColumns};
pub use self::formats::{Format, TsUnit};
use super::{Client, Posted, TransferError};
use crate::config::Settings;
use crate::ingest::decode::DecodeContext;
use crate::ingest::line_protocol::Precision;

/// What `hourglass import` was asked to do.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    pub files: Vec<PathBuf>,
    /// `None`: from each file's name.
    pub format: Option<Format>,
    /// CSV: `(field, column)` pairs.
    pub columns: Vec<(String, String)>,
    /// CSV: columns to leave out.
    pub ignore: Vec<String>,
    pub ts_unit: TsUnit,
    /// Line protocol: the timestamps' unit (`ns`, `us`, `ms`, `s`).
    pub precision: String,
    /// Readings per request.
    pub batch: usize,
    /// Requests in flight at once.
    pub in_flight: usize,
    /// Where checkpoints and rejects go; next to each file when `None`.
    pub state_dir: Option<PathBuf>,
    /// Ignore checkpoints: import every file from its start.
    pub restart: bool,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub files: usize,
    /// Files a checkpoint says were imported already.
    pub skipped_files: usize,
    /// Records resumed past (read before an interruption).
    pub resumed: u64,
    pub readings: u64,
    pub rejected: u64,
    /// Requests sent again: the service was busy (503, 429) or unreachable.
    pub retries: u64,
    /// The rejects files that hold lines.
    pub rejects_files: Vec<PathBuf>,
    pub elapsed: Duration,
}

/// One line of a batch: where it came from, its bytes in the batch text.
#[derive(Debug, Clone, Copy)]
struct Item {
    line: u64,
    start: usize,
    end: usize,
    readings: usize,
}

/// A refused line.
#[derive(Debug, Clone)]
pub struct Reject {
    pub line: u64,
    pub reason: String,
    pub text: String,
}

/// Records of one file, sent as one request (or split if refused).
struct Batch {
    file: usize,
    /// Records consumed up to the end of this batch.
    records: u64,
    text: Vec<u8>,
    items: Vec<Item>,
    rejects: Vec<Reject>,
    /// The file's last batch.
    last: bool,
}

/// A file with what was settled before it is read.
struct Plan {
    path: PathBuf,
    format: Format,
    columns: Option<CsvColumns>,
    checkpoint: Checkpoint,
    rejects: Rejects,
}

pub async fn run(
    settings: &Settings,
    options: ImportOptions,
) -> Result<ImportSummary, TransferError> {
    let started = Instant::now();
    let precision = Precision::v2(&options.precision).ok_or_else(|| {
        TransferError::Usage(format!(
            "--precision {:?} is not one of ns, us, ms, s",
            options.precision
        ))
    })?;
    if options.batch == 0 || options.in_flight == 0 {
        return Err(TransferError::Usage(
            "--batch and --in-flight must be at least 1".into(),
        ));
    }
    let batch = options.batch.min(settings.ingest.max_readings_per_request);
    // Half the body limit: a JSON reading can grow on the server's side
    // of the count, and a batch is cut by bytes as well as readings.
    let max_bytes = settings.http.max_body_bytes / 2;
    // Everything that can stop an import is checked before anything is sent.
    let mut plans = Vec::new();
    for path in &options.files {
        plans.push(plan(path, &options)?);
    }
    let client = Client::new(settings)?;
    client.check().await?;
    let mut summary = ImportSummary {
        files: plans.len(),
        ..ImportSummary::default()
    };
    let total: u64 = plans
        .iter()
        .filter(|p| !p.checkpoint.done)
        .map(|p| p.checkpoint.size)
        .sum();
    let progress = if options.progress {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {bytes}/{total_bytes} {msg} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let read_bytes = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel::<Result<Batch, TransferError>>(options.in_flight * 2);
    let mut work = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        if p.checkpoint.done {
            summary.skipped_files += 1;
            summary.readings += p.checkpoint.readings;
            summary.rejected += p.checkpoint.rejected;
            continue;
        }
        summary.resumed += p.checkpoint.records;
        summary.readings += p.checkpoint.readings;
        summary.rejected += p.checkpoint.rejected;
        let ctx = settings
            .ingest
            .decode_context(time::OffsetDateTime::now_utc().unix_timestamp());
        let mut converter = Converter::new(
            p.format,
            ctx,
            options.ts_unit,
            precision,
            settings.line_protocol.sensor_tags.clone(),
        );
        if let Some(c) = &p.columns {
            converter.set_columns(c.clone());
        }
        work.push(Reader {
            file: i,
            path: p.path.clone(),
            format: p.format,
            skip: p.checkpoint.records,
            converter,
            batch,
            max_bytes,
            read: read_bytes.clone(),
        });
    }
    let reader = std::thread::Builder::new()
        .name("import-reader".into())
        .spawn(move || {
            for r in work {
                if !r.run(&tx) {
                    return;
                }
            }
        })
        .map_err(|e| TransferError::Io(format!("starting the reader thread: {e}")))?;
    let senders: Vec<Sender> = plans
        .iter()
        .map(|p| Sender {
            format: p.format,
            // Converted rows go in epoch seconds; line-protocol files as they are.
            precision: match p.format {
                Format::LineProtocol => options.precision.clone(),
                Format::Csv | Format::Ndjson => "s".to_owned(),
            },
            check: (p.format == Format::Ndjson).then(|| {
                settings
                    .ingest
                    .decode_context(time::OffsetDateTime::now_utc().unix_timestamp())
            }),
        })
        .collect();
    let settled =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
            .map(|batch| {
                let client = &client;
                let senders = &senders;
                async move {
                    let mut batch = batch?;
                    // Handed over as it is: no copy of the body.
                    let body = bytes::Bytes::from(std::mem::take(&mut batch.text));
                    let sender = &senders[batch.file];
                    let outcome = deliver(client, sender, &batch.items, body).await?;
                    Ok::<_, TransferError>((batch, outcome))
                }
            })
            .buffered(options.in_flight);
    futures_util::pin_mut!(settled);
    let since = Instant::now();
    let mut sent = 0u64;
    let mut saved = Instant::now();
    // The file whose checkpoint has news not yet written.
    let mut unsaved: Option<usize> = None;
    while let Some(result) = settled.next().await {
        let (mut batch, (readings, refused)) = match result {
            Ok(settled) => settled,
            Err(e) => {
                // What was acknowledged before the error is not sent again.
                // The error is the news: a checkpoint not written only means
                // those batches are sent again, which changes nothing.
                if let Some(file) = unsaved {
                    let _ = save(&mut plans[file]);
                }
                return Err(e);
            }
        };
        batch.rejects.extend(refused);
        batch.rejects.sort_by_key(|r| r.line);
        let plan = &mut plans[batch.file];
        plan.rejects.append(&plan.path, &batch.rejects)?;
        plan.checkpoint.records = batch.records;
        plan.checkpoint.readings += readings;
        plan.checkpoint.rejected += batch.rejects.len() as u64;
        plan.checkpoint.rejects_bytes = plan.rejects.len();
        plan.checkpoint.done = batch.last;
        unsaved = Some(batch.file);
        if batch.last || saved.elapsed() >= checkpoint::SAVE_EVERY {
            save(plan)?;
            saved = Instant::now();
            unsaved = None;
        }
        summary.readings += readings;
        summary.rejected += batch.rejects.len() as u64;
        sent += readings;
        progress.set_position(read_bytes.load(Ordering::Relaxed));
        let rate = sent as f64 / since.elapsed().as_secs_f64().max(1e-3);
        progress.set_message(format!(
            "{} readings stored, {rate:.0}/s, {} rejected",
            summary.readings, summary.rejected
        ));
    }
    progress.finish_and_clear();
    let _ = reader.join();
    summary.rejects_files = plans
        .iter()
        .filter(|p| p.checkpoint.rejected > 0)
        .map(|p| p.rejects.path().to_path_buf())
        .collect();
    summary.retries = client.retries();
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Writes a file's checkpoint once the rejects it counts are durable.
fn save(plan: &mut Plan) -> Result<(), TransferError> {
    plan.rejects.sync()?;
    plan.checkpoint.save()
}

/// A file's format, CSV header, checkpoint and rejects, before anything is
/// sent: an unknown column, an unreadable file or a changed one stops the
/// import here.
fn plan(path: &Path, options: &ImportOptions) -> Result<Plan, TransferError> {
    let format = match options.format.or_else(|| formats::Format::of_path(path)) {
        Some(f) => f,
        None => {
            return Err(TransferError::Usage(format!(
                "{}: the format is not known from the name; give --format csv, ndjson or lp",
                path.display()
            )));
        }
    };
    let columns = match format {
        Format::Csv => {
            let mut csv = csv::ReaderBuilder::new()
                .has_headers(false)
                .flexible(true)
                .from_reader(open(path, Arc::new(AtomicU64::new(0)))?);
            let mut header = csv::StringRecord::new();
            let found = csv
                .read_record(&mut header)
                .map_err(|e| TransferError::Io(format!("{}: {e}", path.display())))?;
            if !found {
                return Err(TransferError::Usage(format!(
                    "{}: the file is empty; a CSV file starts with its header row",
                    path.display()
                )));
            }
            Some(
                CsvColumns::from_header(&header, &options.columns, &options.ignore)
                    .map_err(|e| TransferError::Usage(format!("{}: {e}", path.display())))?,
            )
        }
        _ => None,
    };
    let checkpoint = Checkpoint::load(path, options.state_dir.as_deref(), options.restart)?;
    let rejects = Rejects::open(path, options.state_dir.as_deref(), checkpoint.rejects_bytes)?;
    Ok(Plan {
        path: path.to_path_buf(),
        format,
        columns,
        checkpoint,
        rejects,
    })
}

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
fn open(path: &Path, read: Arc<AtomicU64>) -> Result<Box<dyn BufRead + Send>, TransferError> {
    let io = |e: std::io::Error| TransferError::Io(format!("{}: {e}", path.display()));
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

/// Reads one file into batches on the reader thread.
struct Reader {
    file: usize,
    path: PathBuf,
    format: Format,
    /// Records read before an interruption: skipped.
    skip: u64,
    converter: Converter,
    batch: usize,
    max_bytes: usize,
    read: Arc<AtomicU64>,
}

impl Reader {
    /// `false` when the import is over (an error sent, or nobody listens).
    fn run(mut self, tx: &mpsc::Sender<Result<Batch, TransferError>>) -> bool {
        match self.batches(tx) {
            Ok(more) => more,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                false
            }
        }
    }

    fn fresh(&self, records: u64) -> Batch {
        Batch {
            file: self.file,
            records,
            text: Vec::with_capacity(self.max_bytes.min(1 << 20)),
            items: Vec::new(),
            rejects: Vec::new(),
            last: false,
        }
    }

    fn batches(
        &mut self,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> Result<bool, TransferError> {
        let io =
            |e: &dyn std::fmt::Display| TransferError::Io(format!("{}: {e}", self.path.display()));
        let input = open(&self.path, self.read.clone())?;
        let mut records: u64 = 0;
        let mut batch = self.fresh(0);
        let mut readings = 0;
        // Each record is offered to `take`, which answers whether the batch is full.
        let take = |this: &Self,
                    batch: &mut Batch,
                    line: u64,
                    text: &str,
                    record: Option<&csv::ByteRecord>,
                    readings: &mut usize| {
            let mark = batch.text.len();
            if !batch.items.is_empty() {
                batch.text.push(b'\n');
            }
            let start = batch.text.len();
            match this.converter.line(text, record, &mut batch.text) {
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
                        text: match record {
                            Some(r) => r
                                .iter()
                                .map(String::from_utf8_lossy)
                                .collect::<Vec<_>>()
                                .join(","),
                            None => text.to_owned(),
                        },
                    });
                }
            }
            *readings >= this.batch || batch.text.len() >= this.max_bytes
        };
        match self.format {
            Format::Csv => {
                let mut csv = csv::ReaderBuilder::new()
                    .has_headers(false)
                    .flexible(true)
                    .from_reader(input);
                // Bytes, not text: only the fields a reading uses are
                // checked as UTF-8 (by the converter), and no row allocates.
                let mut record = csv::ByteRecord::new();
                // The header was checked when the import was planned.
                csv.read_byte_record(&mut record).map_err(|e| io(&e))?;
                records += 1;
                loop {
                    match csv.read_byte_record(&mut record) {
                        Ok(false) => break,
                        Ok(true) => {}
                        Err(e) => {
                            // A broken row (bad UTF-8, an unclosed quote) is
                            // refused; the rest of the file is still read.
                            let line = e.position().map_or(0, |p| p.line());
                            records += 1;
                            if records > self.skip {
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
                    records += 1;
                    if records <= self.skip {
                        continue;
                    }
                    let line = record.position().map_or(records, |p| p.line());
                    if take(self, &mut batch, line, "", Some(&record), &mut readings) {
                        batch.records = records;
                        let full = std::mem::replace(&mut batch, self.fresh(records));
                        readings = 0;
                        if tx.blocking_send(Ok(full)).is_err() {
                            return Ok(false);
                        }
                    }
                }
            }
            Format::Ndjson | Format::LineProtocol => {
                let mut input = input;
                // A line that spans the reader's buffer is gathered here;
                // the others are read in place, not copied.
                let mut carry = Vec::new();
                loop {
                    let buf = input.fill_buf().map_err(|e| io(&e))?;
                    if buf.is_empty() {
                        if !carry.is_empty() {
                            records += 1;
                            let raw = std::mem::take(&mut carry);
                            if !self.text_line(&raw, records, &mut batch, &mut readings, &take, tx)
                            {
                                return Ok(false);
                            }
                        }
                        break;
                    }
                    let (mut used, mut more) = (0, true);
                    while let Some(i) = memchr::memchr(b'\n', &buf[used..]) {
                        let end = used + i + 1;
                        records += 1;
                        let raw = if carry.is_empty() {
                            &buf[used..end]
                        } else {
                            carry.extend_from_slice(&buf[used..end]);
                            &carry[..]
                        };
                        more = self.text_line(raw, records, &mut batch, &mut readings, &take, tx);
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
                    }
                    input.consume(len);
                }
            }
        }
        batch.records = records.max(self.skip);
        batch.last = true;
        Ok(tx.blocking_send(Ok(batch)).is_ok())
    }

    /// One NDJSON or line-protocol line (`raw`, with its newline): offered
    /// to `take`, a full batch sent. `false` when nobody listens.
    #[allow(clippy::too_many_arguments)]
    fn text_line(
        &self,
        raw: &[u8],
        records: u64,
        batch: &mut Batch,
        readings: &mut usize,
        take: &impl Fn(&Self, &mut Batch, u64, &str, Option<&csv::ByteRecord>, &mut usize) -> bool,
        tx: &mpsc::Sender<Result<Batch, TransferError>>,
    ) -> bool {
        if records <= self.skip {
            return true;
        }
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t.trim_end_matches(['\n', '\r']),
            Err(_) => {
                batch.rejects.push(Reject {
                    line: records,
                    reason: "the line is not UTF-8".to_owned(),
                    text: String::from_utf8_lossy(raw).trim_end().to_owned(),
                });
                return true;
            }
        };
        // Blank lines and line-protocol comments hold nothing.
        let trimmed = text.trim();
        if trimmed.is_empty() || (self.format == Format::LineProtocol && trimmed.starts_with('#')) {
            return true;
        }
        if take(self, batch, records, text, None, readings) {
            batch.records = records;
            let full = std::mem::replace(batch, self.fresh(records));
            *readings = 0;
            return tx.blocking_send(Ok(full)).is_ok();
        }
        true
    }
}

/// How a file's batches go to the service.
struct Sender {
    format: Format,
    /// Line protocol's timestamp unit (`s` for converted CSV rows).
    precision: String,
    /// NDJSON: the context to ask the service's decoder which lines of a
    /// refused batch it refuses.
    check: Option<DecodeContext>,
}

/// Sends a batch's `body` (its `items`, one line each). A part the service
/// refuses is checked line by line here (NDJSON: the service's own
/// decoder, so the bad lines are found without round trips) and split until
/// the refused lines are alone. Answers the readings stored and the lines
/// refused.
async fn deliver(
    client: &Client,
    sender: &Sender,
    items: &[Item],
    body: bytes::Bytes,
) -> Result<(u64, Vec<Reject>), TransferError> {
    let mut stored = 0u64;
    let mut refused = Vec::new();
    let text = |item: &Item| String::from_utf8_lossy(&body[item.start..item.end]).into_owned();
    // The whole batch goes as the reader built it; a part is built anew.
    // `checked`: its lines were checked here already.
    let mut pending = vec![(items.to_vec(), Some(body.clone()), false)];
    while let Some((part, built, checked)) = pending.pop() {
        if part.is_empty() {
            continue;
        }
        let sent = built.unwrap_or_else(|| {
            let mut text = Vec::new();
            for item in &part {
                text.extend_from_slice(&body[item.start..item.end]);
                text.push(b'\n');
            }
            bytes::Bytes::from(text)
        });
        let posted = match sender.format {
            Format::Ndjson => client.post_ndjson(sent).await?,
            Format::Csv | Format::LineProtocol => {
                client.post_line_protocol(sent, &sender.precision).await?
            }
        };
        match posted {
            Posted::Stored => stored += part.iter().map(|i| i.readings as u64).sum::<u64>(),
            Posted::Refused(reason) if part.len() == 1 => refused.push(Reject {
                line: part[0].line,
                reason,
                text: text(&part[0]),
            }),
            Posted::Refused(_) => match &sender.check {
                Some(ctx) if !checked => {
                    let mut good = Vec::with_capacity(part.len());
                    for item in part {
                        let line = text(&item);
                        match formats::check_ndjson(&line, ctx) {
                            Ok(()) => good.push(item),
                            Err(reason) => refused.push(Reject {
                                line: item.line,
                                reason,
                                text: line,
                            }),
                        }
                    }
                    pending.push((good, None, true));
                }
                _ => {
                    let mid = part.len() / 2;
                    pending.push((part[mid..].to_vec(), None, true));
                    pending.push((part[..mid].to_vec(), None, true));
                }
            },
        }
    }
    Ok((stored, refused))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batches a reader makes of `text`, resumed past `skip` records:
    /// each line sent with its number, and the refused ones.
    fn read(text: &[u8], skip: u64, batch: usize) -> (Vec<(u64, String)>, Vec<u64>, u64) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("lines.ndjson");
        std::fs::write(&path, text).expect("written");
        let reader = Reader {
            file: 0,
            path,
            format: Format::Ndjson,
            skip,
            converter: formats::tests::converter(Format::Ndjson, TsUnit::Auto),
            batch,
            max_bytes: 1 << 20,
            read: Arc::new(AtomicU64::new(0)),
        };
        let (tx, mut rx) = mpsc::channel(4);
        let thread = std::thread::spawn(move || reader.run(&tx));
        let (mut sent, mut refused, mut records) = (Vec::new(), Vec::new(), 0);
        while let Some(b) = rx.blocking_recv() {
            let b = b.expect("no error");
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
                8 => {
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
}
