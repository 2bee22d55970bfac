//! What decoding takes and gives, whatever the format: the context readings
//! are checked in, the refusal with each invalid reading's reason, and the
//! collector that gathers a request's readings or its refusals.

use serde::Serialize;

use crate::domain::{Reading, TimeWindow};
use crate::telemetry::metrics::Rejection;

/// How many per-reading errors a response lists at most.
pub const MAX_DETAILS: usize = 100;

/// The context a batch of readings is validated in.
#[derive(Debug, Clone, Copy)]
pub struct DecodeContext {
    /// Time of receipt, epoch seconds: the timestamp of readings without one.
    pub now: i64,
    pub window: TimeWindow,
    pub max_readings: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detail {
    pub index: usize,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    #[error("the body is not valid JSON: {0}")]
    Malformed(String),
    #[error("the body must be a reading object or an array of them")]
    NotReadings,
    /// A CSV body's header, or its text.
    #[error("{0}")]
    Csv(String),
    #[error("{count} readings in one request; the limit is {max}")]
    TooMany { count: usize, max: usize },
    #[error("{invalid} of {total} readings are invalid; nothing was stored")]
    Invalid {
        invalid: usize,
        total: usize,
        details: Vec<Detail>,
    },
}

impl DecodeError {
    /// How it counts in `hourglass_readings_rejected_total`: the reason and
    /// how many readings it refused (1 when they could not be counted).
    pub fn rejection(&self) -> (Rejection, usize) {
        match self {
            DecodeError::Malformed(_) | DecodeError::NotReadings | DecodeError::Csv(_) => {
                (Rejection::Malformed, 1)
            }
            DecodeError::TooMany { count, .. } => (Rejection::TooLarge, *count),
            DecodeError::Invalid { total, .. } => (Rejection::Invalid, *total),
        }
    }
}

/// A request's readings as they are decoded: all of them, or the details
/// of the invalid ones.
pub(super) struct Collector<'a> {
    readings: Vec<Reading<'a>>,
    details: Vec<Detail>,
    total: usize,
    invalid: usize,
}

impl<'a> Collector<'a> {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            readings: Vec::with_capacity(capacity),
            details: Vec::new(),
            total: 0,
            invalid: 0,
        }
    }

    pub(super) fn push(&mut self, index: usize, result: Result<Reading<'a>, String>) {
        self.total += 1;
        match result {
            Ok(r) if self.invalid == 0 => self.readings.push(r),
            Ok(_) => {}
            Err(reason) => {
                self.invalid += 1;
                if self.details.len() < MAX_DETAILS {
                    self.details.push(Detail { index, reason });
                }
            }
        }
    }

    pub(super) fn finish(self) -> Result<Vec<Reading<'a>>, DecodeError> {
        if self.invalid > 0 {
            return Err(DecodeError::Invalid {
                invalid: self.invalid,
                total: self.total,
                details: self.details,
            });
        }
        Ok(self.readings)
    }
}
