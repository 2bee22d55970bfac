//! What a query needs of each point's readings, and a point answered.

use crate::domain::{Agg, Sample, Sketch, Summary};

/// What a query needs of the readings in each point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Count, sum, min and max: an hour bucket's minute aggregates will do.
    Aggregates,
    /// Everything a [`Summary`] holds (`last_over_time`, counters).
    Summaries,
    /// Every reading (quantiles): only buckets hold them.
    Values,
    /// Count, sum, min and max with a percentile sketch of the readings:
    /// from whole rollup slots that keep one, else from buckets' values.
    Sketches,
}

/// One point, answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cell {
    pub agg: Agg,
    /// With [`Need::Summaries`] and [`Need::Values`]; none for a point
    /// without readings.
    pub summary: Option<Summary>,
    /// With [`Need::Values`]: the readings, in time order.
    pub samples: Vec<Sample>,
    /// With [`Need::Sketches`]: the readings' sketch; none for a point
    /// without readings.
    pub sketch: Option<Sketch>,
}
