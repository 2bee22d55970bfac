//! `hourglass export`: `GET /api/v1/export` into a file (or standard
//! output), gzip when asked. The file appears under its name only once the
//! whole answer has arrived: an answer cut off leaves `<file>.partial` and
//! an error, never a file that looks complete.

use std::io::Write;
use std::path::PathBuf;

use super::client::{Client, TransferError};
use crate::config::Settings;

/// What `hourglass export` was asked to do.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// The query's parameters (`sensor`, `metric`, `from`, `to`, `step`,
    /// `format`, `label.<name>`).
    pub query: Vec<(String, String)>,
    /// `None` or `-`: standard output.
    pub output: Option<PathBuf>,
    pub gzip: bool,
}

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    /// Bytes written (compressed when gzip).
    pub bytes: u64,
    pub output: Option<PathBuf>,
}

/// Counts what passes through to the file.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Where the answer goes: as it is, or compressed here.
enum Out<W: Write> {
    Plain(Counted<W>),
    Gzip(flate2::write::GzEncoder<Counted<W>>),
}

impl<W: Write> Out<W> {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Out::Plain(w) => w.write_all(bytes),
            Out::Gzip(w) => w.write_all(bytes),
        }
    }

    /// Ends the stream (gzip's trailer) and flushes; the bytes written.
    fn finish(self) -> std::io::Result<u64> {
        let mut counted = match self {
            Out::Plain(w) => w,
            Out::Gzip(w) => w.finish()?,
        };
        counted.flush()?;
        Ok(counted.bytes)
    }
}

pub async fn run(
    settings: &Settings,
    options: ExportOptions,
) -> Result<ExportSummary, TransferError> {
    let client = Client::new(settings)?;
    let url = reqwest::Url::parse_with_params(
        &format!("{}/api/v1/export", client.base()),
        options.query.iter(),
    )
    .map_err(|e| TransferError::Usage(format!("the service URL {}: {e}", client.base())))?;
    let mut request = client.http.get(url);
    if options.gzip {
        request = request.header(reqwest::header::ACCEPT_ENCODING, "gzip");
    }
    let mut response = client.send(request).await?;
    let compressed = response
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let output = options.output.clone().filter(|p| p.as_os_str() != "-");
    let partial = output.as_ref().map(|p| {
        let mut name = p.clone().into_os_string();
        name.push(".partial");
        PathBuf::from(name)
    });
    let io = |e: std::io::Error| {
        TransferError::Io(format!(
            "{}: {e}",
            partial
                .as_ref()
                .map_or_else(|| "standard output".to_owned(), |p| p.display().to_string())
        ))
    };
    let sink: Box<dyn Write> = match &partial {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(io)?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let counted = Counted {
        inner: sink,
        bytes: 0,
    };
    // The service compresses when asked (and able); otherwise it is done here.
    let mut out = if options.gzip && !compressed {
        Out::Gzip(flate2::write::GzEncoder::new(
            counted,
            flate2::Compression::default(),
        ))
    } else {
        Out::Plain(counted)
    };
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => out.write_all(&chunk).map_err(io)?,
            Ok(None) => break,
            Err(e) => {
                let _ = out.finish();
                return Err(TransferError::Service(format!(
                    "the export was cut off ({e}); {} holds what arrived",
                    partial
                        .as_ref()
                        .map_or_else(|| "standard output".to_owned(), |p| p.display().to_string())
                )));
            }
        }
    }
    let bytes = out.finish().map_err(io)?;
    if let (Some(partial), Some(output)) = (&partial, &output) {
        std::fs::rename(partial, output).map_err(|e| TransferError::file(output, e))?;
    }
    Ok(ExportSummary { bytes, output })
}
