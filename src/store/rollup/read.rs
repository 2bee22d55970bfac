//! Reading rollup documents back (`write` writes them): each slot's bytes
//! decoded (`codec`) with its write count, its sketch at the
//! accuracy asked.

use mongodb::bson::{RawBsonRef, RawDocument};

use super::codec;
use crate::domain::{Period, RollupRead};
use crate::store::StoreError;
use crate::store::document::{elements, raw_number, raw_seconds};

/// Parses a rollup document of `period`, with its slots' sketches at the
/// accuracy `sketches` if given. A version-1 document holds nothing
/// complete; a newer version is refused rather than misread.
pub fn read_rollup(
    d: &RawDocument,
    period: Period,
    sketches: Option<f64>,
) -> Result<RollupRead, StoreError> {
    // Long: the rollup document read field by field.
    let (mut start, mut version, mut complete, mut stored, mut counts) =
        (None, None, None, None, None);
    for e in elements(d) {
        let (key, value) = e?;
        match key {
            "start" => start = Some(raw_seconds(value, "rollup start")?),
            "schema_version" => version = Some(value),
            "complete" => complete = Some(value),
            "s" => stored = Some(value),
            "w" => counts = Some(value),
            _ => {}
        }
    }
    let start =
        start.ok_or_else(|| StoreError::Unreadable("rollup start is missing".to_owned()))?;
    match version {
        Some(RawBsonRef::Int32(3)) | Some(RawBsonRef::Int64(3)) => {}
        Some(RawBsonRef::Int32(1 | 2)) | Some(RawBsonRef::Int64(1 | 2)) => {
            return Ok(RollupRead {
                start,
                ..RollupRead::default()
            });
        }
        other => {
            return Err(StoreError::Unreadable(format!(
                "unknown rollup schema_version {other:?}"
            )));
        }
    }
    let complete = match complete {
        Some(RawBsonRef::Int64(x)) => x as u64,
        Some(RawBsonRef::Int32(x)) => x as u32 as u64,
        None => 0,
        Some(other) => {
            return Err(StoreError::Unreadable(format!(
                "rollup complete is {:?}",
                other.element_type()
            )));
        }
    };
    let slot_count = period.seconds() / period.slot_seconds();
    let slot_number = |k: &str| -> Result<i64, StoreError> {
        k.parse()
            .ok()
            .filter(|&i| i >= 0 && i < slot_count)
            .ok_or_else(|| StoreError::Unreadable(format!("rollup slot key {k:?}")))
    };
    // Write counts by slot number (at most 60 slots).
    let mut n = [None; 64];
    if let Some(RawBsonRef::Document(w)) = counts {
        for e in elements(w) {
            let (k, v) = e?;
            let x = raw_number(v, &format_args!("rollup write count {k}"))?;
            if x < 0.0 || x.fract() != 0.0 {
                return Err(StoreError::Unreadable(format!(
                    "rollup write count {k} is {x}, not a count"
                )));
            }
            n[slot_number(k)? as usize] = Some(x as u64);
        }
    }
    let mut slots = Vec::new();
    if let Some(RawBsonRef::Document(s)) = stored {
        for e in elements(s) {
            let (k, v) = e?;
            let index = slot_number(k)?;
            let RawBsonRef::Binary(bytes) = v else {
                return Err(StoreError::Unreadable(format!(
                    "rollup slot {k} is no binary"
                )));
            };
            // A count of 1 is not stored (see `rollup::write_statement`).
            let writes = n[index as usize].unwrap_or(1);
            slots.push(
                codec::decode(
                    bytes.bytes,
                    start + index * period.slot_seconds(),
                    writes,
                    sketches,
                )
                .map_err(|e| StoreError::Unreadable(format!("rollup slot {k}: {e}")))?,
            );
        }
    }
    slots.sort_by_key(|s| s.start);
    Ok(RollupRead {
        start,
        complete,
        slots,
    })
}
