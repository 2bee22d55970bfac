//! The journal directory's own files: the instance id its floor is
//! published under, and the target its readings were acknowledged for.

/// Opening the journal failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("opening the journal in {dir}: {source}")]
    Io { dir: String, source: std::io::Error },
    /// The journal holds readings acknowledged for another target: they
    /// must be stored there, never replayed into this one.
    #[error(
        "the journal in {dir} holds {readings} readings acknowledged for {found}, but this \
         instance writes to {configured}; start once with the old setting to store them (a \
         clean stop empties the journal), or give this configuration its own journal.dir"
    )]
    OtherTarget {
        dir: String,
        readings: u64,
        found: String,
        configured: String,
    },
}

/// The file in the journal directory naming the target its readings were
/// acknowledged for: `database/collection (granularity)`.
const TARGET_FILE: &str = "TARGET";
const INSTANCE_FILE: &str = "INSTANCE";

/// This journal's instance id: the name its floor is published under (see
/// `store::mongo::instances`), kept beside the segments so a restart over
/// the same journal is the same instance.
pub(super) fn instance_id(dir: &std::path::Path) -> Result<String, OpenError> {
    let path = dir.join(INSTANCE_FILE);
    let io = |source| OpenError::Io {
        dir: dir.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let id = uuid::Uuid::new_v4().to_string();
    let tmp = dir.join(format!("{INSTANCE_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n")).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(id)
}

/// Binds the journal in `dir` to `target`: refuses when it holds readings of
/// another target, and records `target` otherwise. A journal from before the
/// target was recorded is taken as this target's.
pub(super) fn bind(dir: &std::path::Path, target: &str, readings: u64) -> Result<(), OpenError> {
    let path = dir.join(TARGET_FILE);
    let io = |source| OpenError::Io {
        dir: dir.display().to_string(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(found) if found.trim() == target => return Ok(()),
        Ok(found) if readings > 0 => {
            return Err(OpenError::OtherTarget {
                dir: dir.display().to_string(),
                readings,
                found: found.trim().to_owned(),
                configured: target.to_owned(),
            });
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    // Written before any reading is journaled for this target, and synced
    // with its directory, so a crash cannot leave readings without it.
    let tmp = dir.join(format!("{TARGET_FILE}.tmp"));
    std::fs::write(&tmp, format!("{target}\n")).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_of(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join(TARGET_FILE)).expect("a target file")
    }

    #[test]
    fn a_journal_with_readings_is_bound_to_its_target_and_an_empty_one_is_rebound() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        bind(dir.path(), "db1/buckets (minute)", 0).expect("a new journal binds");
        assert_eq!(target_of(dir.path()), "db1/buckets (minute)\n");
        bind(dir.path(), "db1/buckets (minute)", 7).expect("the same target");
        match bind(dir.path(), "db2/buckets (minute)", 7) {
            Err(e @ OpenError::OtherTarget { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains("7 readings acknowledged for db1/buckets (minute)")
                        && message.contains("writes to db2/buckets (minute)"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(target_of(dir.path()), "db1/buckets (minute)\n", "unchanged");
        bind(dir.path(), "db2/buckets (hour)", 0).expect("nothing left to store");
        assert_eq!(target_of(dir.path()), "db2/buckets (hour)\n");
    }

    #[test]
    fn a_journal_from_before_targets_were_recorded_is_taken_as_this_targets() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        bind(dir.path(), "db/buckets (hour)", 12).expect("binds");
        assert_eq!(target_of(dir.path()), "db/buckets (hour)\n");
    }
}
