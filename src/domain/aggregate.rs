/// Pre-aggregates of a set of values: what a bucket stores next to its values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agg {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

impl Default for Agg {
    fn default() -> Self {
        Self {
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl Agg {
    pub fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }

    pub fn merge(&mut self, other: &Agg) {
        if other.count == 0 {
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// `sum / count`, or `None` for an empty set.
    pub fn avg(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    pub fn min(&self) -> Option<f64> {
        (self.count > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<f64> {
        (self.count > 0).then_some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_aggregate_has_no_average_min_or_max() {
        let a = Agg::default();
        assert_eq!((a.avg(), a.min(), a.max()), (None, None, None));
    }

    #[test]
    fn merging_equals_adding_every_value() {
        let mut whole = Agg::default();
        let (mut left, mut right) = (Agg::default(), Agg::default());
        for (i, v) in [3.0, -1.5, 8.0, 2.0].into_iter().enumerate() {
            whole.add(v);
            if i % 2 == 0 {
                left.add(v)
            } else {
                right.add(v)
            }
        }
        left.merge(&right);
        left.merge(&Agg::default());
        assert_eq!(left, whole);
        assert_eq!(whole.avg(), Some(11.5 / 4.0));
    }
}
