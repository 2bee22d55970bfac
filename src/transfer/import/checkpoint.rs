//! An import's progress through one file, and the file of its refused
//! lines, both kept beside the file (or in `--state-dir`).
//!
//! The checkpoint is written after batches are acknowledged and their
//! rejects are written and synced, replacing the last one atomically (a
//! temporary file renamed over it). It is written at most every
//! [`SAVE_EVERY`] and at each file's end: an fsync per batch would cost
//! more than the batch, and what an interruption loses is only re-sent
//! (a reading written twice changes nothing). It records how long the
//! rejects file was, so a resumed import cuts off rejects written for
//! batches that were never settled and no line is reported twice.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::batch::Reject;
use crate::transfer::TransferError;

/// How often a running import writes its checkpoint.
pub const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Progress through one file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    #[serde(skip)]
    at: PathBuf,
    /// The file's size and modification time (epoch seconds) when the
    /// import began: a file changed since is not resumed.
    pub size: u64,
    pub modified: i64,
    /// Records (lines, or CSV rows with the header) settled.
    pub records: u64,
    pub readings: u64,
    pub rejected: u64,
    /// Length of the rejects file when this was written.
    pub rejects_bytes: u64,
    /// The whole file is imported.
    pub done: bool,
}

/// `<dir>/<file name><suffix>`, next to the file unless a directory is given.
fn beside(path: &Path, dir: Option<&Path>, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "import".into(), |n| n.to_string_lossy().into_owned());
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => path.parent().map_or_else(PathBuf::new, Path::to_path_buf),
    };
    dir.join(format!("{name}{suffix}"))
}

impl Checkpoint {
    /// The file's checkpoint, or a fresh one (`restart`, or none yet).
    pub fn load(file: &Path, dir: Option<&Path>, restart: bool) -> Result<Self, TransferError> {
        let meta = std::fs::metadata(file).map_err(|e| TransferError::file(file, e))?;
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let at = beside(file, dir, ".import-checkpoint");
        let fresh = Checkpoint {
            at: at.clone(),
            size: meta.len(),
            modified,
            ..Checkpoint::default()
        };
        if restart {
            return Ok(fresh);
        }
        let text = match std::fs::read_to_string(&at) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fresh),
            Err(e) => return Err(TransferError::file(&at, e)),
        };
        let mut saved: Checkpoint = serde_json::from_str(&text).map_err(|e| {
            TransferError::Usage(format!(
                "{} is not an import checkpoint ({e}); remove it or pass --restart",
                at.display()
            ))
        })?;
        if (saved.size, saved.modified) != (fresh.size, fresh.modified) {
            return Err(TransferError::Usage(format!(
                "{} changed since its import began (checkpoint {}); pass --restart to import it from its start",
                file.display(),
                at.display()
            )));
        }
        saved.at = at;
        Ok(saved)
    }

    pub fn save(&self) -> Result<(), TransferError> {
        let tmp = self.at.with_extension("tmp");
        let text = serde_json::to_vec(self).map_err(|e| TransferError::file(&self.at, e))?;
        let mut f = File::create(&tmp).map_err(|e| TransferError::file(&tmp, e))?;
        f.write_all(&text)
            .map_err(|e| TransferError::file(&tmp, e))?;
        f.sync_data().map_err(|e| TransferError::file(&tmp, e))?;
        std::fs::rename(&tmp, &self.at).map_err(|e| TransferError::file(&self.at, e))
    }
}

/// The refused lines of one file: `<file>:<line>: <reason>` then a tab and
/// the line as it was.
pub struct Rejects {
    at: PathBuf,
    file: Option<File>,
    len: u64,
    /// Appended since the last sync.
    unsynced: bool,
}

impl Rejects {
    /// Opens the rejects file cut to `len` bytes (what the checkpoint
    /// counted); created only when a line is refused.
    pub fn open(file: &Path, dir: Option<&Path>, len: u64) -> Result<Self, TransferError> {
        let at = beside(file, dir, ".rejects");
        let mut rejects = Rejects {
            at,
            file: None,
            len: 0,
            unsynced: false,
        };
        match OpenOptions::new().write(true).open(&rejects.at) {
            Ok(f) => {
                f.set_len(len)
                    .map_err(|e| TransferError::file(&rejects.at, e))?;
                rejects.len = len;
                rejects.file = Some(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(TransferError::file(&rejects.at, e)),
        }
        // The directory must take the checkpoint: found out before anything is sent.
        let probe = beside(file, dir, ".import-checkpoint.probe");
        File::create(&probe)
            .and_then(|_| std::fs::remove_file(&probe))
            .map_err(|e| {
                TransferError::Usage(format!(
                    "{}: cannot write the import's checkpoint there ({e}); give a writable --state-dir",
                    probe.parent().map_or_else(String::new, |p| p.display().to_string())
                ))
            })?;
        Ok(rejects)
    }

    pub fn path(&self) -> &Path {
        &self.at
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn append(&mut self, source: &Path, rejects: &[Reject]) -> Result<(), TransferError> {
        if rejects.is_empty() {
            return Ok(());
        }
        let mut text = Vec::new();
        for r in rejects {
            let reason = r.reason.replace(['\n', '\t'], " ");
            let _ = writeln!(
                text,
                "{}:{}: {reason}\t{}",
                source.display(),
                r.line,
                r.text
            );
        }
        if self.file.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.at)
                .map_err(|e| TransferError::file(&self.at, e))?;
            self.file = Some(f);
        }
        if let Some(f) = &mut self.file {
            use std::io::{Seek, SeekFrom};
            f.seek(SeekFrom::Start(self.len))
                .map_err(|e| TransferError::file(&self.at, e))?;
            f.write_all(&text)
                .map_err(|e| TransferError::file(&self.at, e))?;
        }
        self.len += text.len() as u64;
        self.unsynced = true;
        Ok(())
    }

    /// Makes what was appended durable: before a checkpoint counts it.
    pub fn sync(&mut self) -> Result<(), TransferError> {
        if let (true, Some(f)) = (self.unsynced, &self.file) {
            f.sync_data()
                .map_err(|e| TransferError::file(&self.at, e))?;
        }
        self.unsynced = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_resumes_only_the_same_file_and_rejects_are_cut_to_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("data.csv");
        std::fs::write(&file, "sensor,ts,value\n").expect("written");
        let mut c = Checkpoint::load(&file, None, false).expect("fresh");
        assert_eq!(c.records, 0);
        let mut r = Rejects::open(&file, None, 0).expect("opened");
        let bad = |line| Reject {
            line,
            reason: "bad\nvalue".into(),
            text: "x".into(),
        };
        r.append(&file, &[bad(2)]).expect("appended");
        c.records = 5;
        c.rejected = 1;
        c.rejects_bytes = r.len();
        c.save().expect("saved");
        // Rejects written after the checkpoint (a batch never settled).
        r.append(&file, &[bad(7)]).expect("appended");
        let again = Checkpoint::load(&file, None, false).expect("resumed");
        assert_eq!((again.records, again.rejected), (5, 1));
        let r = Rejects::open(&file, None, again.rejects_bytes).expect("reopened");
        let text = std::fs::read_to_string(r.path()).expect("readable");
        assert_eq!(text, format!("{}:2: bad value\tx\n", file.display()));
        assert_eq!(
            Checkpoint::load(&file, None, true)
                .expect("restart")
                .records,
            0
        );
        std::fs::write(&file, "sensor,ts,value\ns1,1,1\n").expect("changed");
        let err = Checkpoint::load(&file, None, false).expect_err("changed file");
        assert!(err.to_string().contains("--restart"), "{err}");
    }
}
