//! `hourglass import`: files of readings into a running instance, through
//! its HTTP API, so they take the same validation, journal and batcher as
//! every other write.
//!
//! - [`formats`]: lines sent as they are (the service decodes them once,
//!   not twice; CSV rows after a header naming the fields where the file
//!   has them) and checked here with the service's own decoder only in a
//!   batch the service refused. A bad line goes to the file's rejects with
//!   its line number while the good ones are stored.
//! - [`checkpoint`]: every second and at each file's end, the records
//!   acknowledged (journaled) so far, so an interrupted import resumes
//!   there. Batches acknowledged after it, or in flight when it stopped,
//!   are sent again: a reading written twice at its second changes
//!   nothing, so nothing counts twice.
//!
//! A reader thread ([`reader`]) decodes (gzip or plain) and cuts lines
//! into batches; a few batches are in flight at once and settle in file
//! order, each writing its rejects and then the checkpoint. A batch the service refuses
//! (400) is checked line by line, then split until the lines it refuses
//! are found.

mod batch;
pub mod checkpoint;
pub mod formats;
mod reader;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::mpsc;

pub use self::batch::Reject;
use self::batch::{Batch, Item};
use self::checkpoint::{Checkpoint, Rejects};
pub use self::formats::Format;
use self::formats::{Checker, Converter};
use self::reader::{Reader, Spares, open};
use super::client::{Client, Posted, TransferError};
use crate::config::Settings;
use crate::ingest::decode::csv::CsvColumns;
pub use crate::ingest::decode::csv::TsUnit;
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
    // Long: the import's pipeline: the reader thread, the senders and the loop settling batches in file order share the plans and the summary.
    let started = Instant::now();
    let precision = checked(&options)?;
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
    let progress = progress_bar(total, options.progress);
    let read_bytes = Arc::new(AtomicU64::new(0));
    let spares = Spares::default();
    // Two batches ready beyond those in flight: the reader is many times
    // faster than the service, and each batch queued is a buffer more to
    // fault in (a deeper queue cost a tenth of the command's CPU).
    let (tx, rx) = mpsc::channel::<Result<Batch, TransferError>>(2);
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
        work.push(Reader {
            file: i,
            path: p.path.clone(),
            format: p.format,
            skip: p.checkpoint.records,
            converter: Converter::new(p.format),
            head: header_line(p),
            batch,
            max_bytes,
            read: read_bytes.clone(),
            spares: spares.clone(),
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
    let senders = senders(&plans, settings, &options, precision);
    let settled =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
            .map(|batch| {
                let client = &client;
                let senders = &senders;
                let spares = &spares;
                async move {
                    let mut batch = batch?;
                    // Handed over as it is: no copy of the body.
                    let body = bytes::Bytes::from(std::mem::take(&mut batch.text));
                    let sender = &senders[batch.file];
                    let outcome = deliver(client, sender, &batch.items, &body).await?;
                    // Sent: its buffers go back to the reader.
                    if let Ok(text) = body.try_into_mut() {
                        spares.give(text.into(), std::mem::take(&mut batch.items));
                    }
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
    // Written on a timer too: an import waiting on a slow answer still
    // records what was acknowledged before it.
    let mut ticks = tokio::time::interval(checkpoint::SAVE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let result = tokio::select! {
            next = settled.next() => match next {
                Some(result) => result,
                None => break,
            },
            _ = ticks.tick() => {
                if let Some(file) = unsaved.take() {
                    save(&mut plans[file])?;
                    saved = Instant::now();
                }
                continue;
            }
        };
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
        settle(plan, &batch, readings)?;
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

/// The options' own checks, before any file is looked at: the precision
/// they name, and the state directory made, as `mkdir -p` would (its
/// checkpoints are the import's own).
fn checked(options: &ImportOptions) -> Result<Precision, TransferError> {
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
    if let Some(dir) = &options.state_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            TransferError::Usage(format!(
                "--state-dir {}: cannot be made ({e})",
                dir.display()
            ))
        })?;
    }
    Ok(precision)
}

/// The bar of bytes read out of `total`, hidden when not asked for.
fn progress_bar(total: u64, shown: bool) -> indicatif::ProgressBar {
    let progress = if shown {
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
    progress
}

/// What sends each file's batches: its format, header and the checker of
/// a batch the service refused.
fn senders(
    plans: &[Plan],
    settings: &Settings,
    options: &ImportOptions,
    precision: Precision,
) -> Vec<Sender> {
    plans
        .iter()
        .map(|p| Sender {
            format: p.format,
            precision: options.precision.clone(),
            ts_unit: options.ts_unit,
            head: bytes::Bytes::from(header_line(p)),
            check: Checker::new(
                p.format,
                settings
                    .ingest
                    .decode_context(jiff::Timestamp::now().as_second()),
                precision,
                settings.line_protocol.sensor_tags.clone(),
                p.columns.clone().map(|c| (c, options.ts_unit)),
            ),
        })
        .collect()
}

/// A settled batch into its file's rejects and checkpoint (saved by the
/// caller): `readings` of it were stored.
fn settle(plan: &mut Plan, batch: &Batch, readings: u64) -> Result<(), TransferError> {
    plan.rejects.append(&plan.path, &batch.rejects)?;
    plan.checkpoint.records = batch.records;
    plan.checkpoint.readings += readings;
    plan.checkpoint.rejected += batch.rejects.len() as u64;
    plan.checkpoint.rejects_bytes = plan.rejects.len();
    plan.checkpoint.done = batch.last;
    Ok(())
}

/// What starts each of a file's batches: a CSV file's header, naming the
/// columns of the fields where the file has them (mapped and ignored
/// columns are settled here, by position), then its newline.
fn header_line(plan: &Plan) -> Vec<u8> {
    plan.columns.as_ref().map_or_else(Vec::new, |c| {
        let mut head = c.canonical_header().into_bytes();
        head.push(b'\n');
        head
    })
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
                .from_reader(reader::Bounded::new(open(
                    path,
                    Arc::new(AtomicU64::new(0)),
                )?));
            let mut header = csv::StringRecord::new();
            let found = csv
                .read_record(&mut header)
                .map_err(|e| TransferError::file(path, e))?;
            if !found {
                return Err(TransferError::Usage(format!(
                    "{}: the file is empty; a CSV file starts with its header row",
                    path.display()
                )));
            }
            Some(
                CsvColumns::from_header(header.iter(), &options.columns, &options.ignore)
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

/// How a file's batches go to the service.
struct Sender {
    format: Format,
    /// Line protocol's timestamp unit.
    precision: String,
    /// CSV's timestamp unit.
    ts_unit: TsUnit,
    /// What starts each batch (CSV's header), or nothing.
    head: bytes::Bytes,
    /// The service's decoder, asked which lines of a refused batch it
    /// refuses.
    check: Checker,
}

/// Sends a batch's `body` (its `items`, one line each). A part the service
/// refuses is checked line by line here (lines sent as they are: the
/// service's own decoder, so the bad lines are found without round trips;
/// the good ones go again, which changes nothing where a partial write
/// stored them) and split until the refused lines are alone. Answers the readings stored and the lines
/// refused.
async fn deliver(
    client: &Client,
    sender: &Sender,
    items: &[Item],
    body: &bytes::Bytes,
) -> Result<(u64, Vec<Reject>), TransferError> {
    let mut stored = 0u64;
    let mut refused = Vec::new();
    let text = |item: &Item| String::from_utf8_lossy(&body[item.start..item.end]).into_owned();
    // The whole batch goes as the reader built it; a part is built anew.
    // `checked`: its lines were checked here already.
    let mut pending = vec![(Cow::Borrowed(items), Some(body.clone()), false)];
    while let Some((part, built, checked)) = pending.pop() {
        if part.is_empty() {
            continue;
        }
        let sent = built.unwrap_or_else(|| {
            let mut text = sender.head.to_vec();
            for item in part.iter() {
                text.extend_from_slice(&body[item.start..item.end]);
                text.push(b'\n');
            }
            bytes::Bytes::from(text)
        });
        let posted = match sender.format {
            Format::Ndjson => client.post_ndjson(sent).await?,
            Format::Csv => client.post_csv(sent, sender.ts_unit).await?,
            Format::LineProtocol => client.post_line_protocol(sent, &sender.precision).await?,
        };
        match posted {
            Posted::Stored => stored += part.iter().map(|i| i.readings as u64).sum::<u64>(),
            Posted::Refused(reason) if part.len() == 1 => refused.push(Reject {
                line: part[0].line,
                reason,
                text: text(&part[0]),
            }),
            Posted::Refused(_) if !checked => {
                let mut good = Vec::with_capacity(part.len());
                for &item in part.iter() {
                    match sender.check.check(&body[item.start..item.end]) {
                        Ok(()) => good.push(item),
                        Err(reason) => refused.push(Reject {
                            line: item.line,
                            reason,
                            text: text(&item),
                        }),
                    }
                }
                pending.push((Cow::Owned(good), None, true));
            }
            Posted::Refused(_) => {
                let mid = part.len() / 2;
                pending.push((Cow::Owned(part[mid..].to_vec()), None, true));
                pending.push((Cow::Owned(part[..mid].to_vec()), None, true));
            }
        }
    }
    Ok((stored, refused))
}
