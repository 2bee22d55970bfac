//! What a line-protocol body decodes to: compact rows in the body's order,
//! the series they belong to, and what was refused; the readings built
//! grouped by series for whoever takes them.

use std::fmt::Write as _;

use crate::domain::{MetricName, Reading, SensorId, SensorLabels};

/// A refused line: its number (from 1) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub reason: String,
}

/// A reading as decoded: its series by number (see [`Decoded::series`]).
/// A third of a [`Reading`]'s size, so a body's readings are written and
/// reordered compactly before they become readings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    pub(super) series: u32,
    pub(super) ts: i64,
    pub(super) value: f64,
}

/// What a body decodes to.
#[derive(Debug, Default)]
pub struct Decoded<'a> {
    /// The readings in the body's order.
    pub(super) rows: Vec<Row>,
    /// Each series' sensor and metric, by number: one per sensor and
    /// metric, numbered from 0 in the order met.
    pub(super) series: Vec<(SensorId<'a>, MetricName<'a>)>,
    /// The labels the taken lines carry (each distinct tag set once per
    /// body); a refused line's are not among them.
    pub labels: Vec<SensorLabels<'a>>,
    /// The first `MAX_DETAILS` refused lines.
    pub errors: Vec<LineError>,
    /// How many lines were refused in all.
    pub refused: usize,
    /// Lines taken (those with only string fields included).
    pub lines: usize,
    /// String fields skipped.
    pub strings: usize,
}

impl<'a> Decoded<'a> {
    /// Readings taken.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    fn reading(&self, row: &Row) -> Reading<'a> {
        let (sensor, metric) = &self.series[row.series as usize];
        Reading {
            sensor: sensor.clone(),
            metric: metric.clone(),
            ts: row.ts,
            value: row.value,
        }
    }

    /// The readings in the body's order.
    pub fn readings(&self) -> Vec<Reading<'a>> {
        self.rows.iter().map(|r| self.reading(r)).collect()
    }

    /// Takes the readings with each series' together, each series' in the
    /// order they came (a stable counting sort by series). A body written
    /// in time order interleaves its series; grouped, what takes the
    /// readings looks each bucket and series up once per run instead of
    /// once per reading.
    pub fn take_grouped(&mut self) -> Vec<Reading<'a>> {
        let rows = std::mem::take(&mut self.rows);
        let mut next = vec![0u32; self.series.len()];
        for r in &rows {
            next[r.series as usize] += 1;
        }
        // Already together: one series, or a body written series by series.
        let runs = 1 + rows
            .windows(2)
            .filter(|w| w[0].series != w[1].series)
            .count();
        if rows.len() < 2 || runs == next.iter().filter(|&&n| n > 0).count() {
            return rows.iter().map(|r| self.reading(r)).collect();
        }
        let mut at = 0;
        for n in &mut next {
            (*n, at) = (at, at + *n);
        }
        // Each place's row, then the readings built in that order: written
        // once each, in sequence, rather than swapped into place.
        let mut order = vec![0u32; rows.len()];
        for (i, r) in (0u32..).zip(&rows) {
            let place = &mut next[r.series as usize];
            order[*place as usize] = i;
            *place += 1;
        }
        order
            .iter()
            .map(|&i| self.reading(&rows[i as usize]))
            .collect()
    }

    /// InfluxDB's partial-write message: the refused lines and reasons
    /// (each at most [`MAX_REASON`] bytes: a reason may quote the line).
    pub fn partial_write_message(&self) -> String {
        let mut m = format!(
            "partial write: {} of {} lines refused",
            self.refused,
            self.refused + self.lines
        );
        for e in &self.errors {
            let _ = write!(m, "; line {}: {}", e.line, clipped(&e.reason));
        }
        if self.refused > self.errors.len() {
            let _ = write!(m, "; and {} more", self.refused - self.errors.len());
        }
        m.push_str("; the other lines were stored");
        m
    }
}

/// The most of one line's reason a message carries.
const MAX_REASON: usize = 256;

/// `reason`, cut to [`MAX_REASON`] bytes (at a character) with an ellipsis.
fn clipped(reason: &str) -> std::borrow::Cow<'_, str> {
    if reason.len() <= MAX_REASON {
        return reason.into();
    }
    let mut end = MAX_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &reason[..end]).into()
}
