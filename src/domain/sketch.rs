//! Percentile sketches with a relative-error guarantee: DDSketch (Masson,
//! Rim and Lee, VLDB 2019), the sketch Datadog's agents and VictoriaMetrics'
//! `histogram` family build on.
//!
//! A value `v` with `|v|` above [`MIN_MAGNITUDE`] counts in the bin of key
//! `⌈ln|v| / ln γ⌉`, `γ = (1 + α) / (1 − α)`, one store per sign; smaller
//! magnitudes count as zero. A bin answers `2γᵏ / (γ + 1)`, within `α`
//! relative of every value it holds, so a quantile is within `α` of the
//! exact one (the value at rank `⌊q·(n − 1)⌋` of the sorted readings).
//! Bins merge by adding counts, in any order: a rollup slot's sketch is its
//! slots' or readings' sketches merged, exactly as if built from them all.
//!
//! Written here rather than taken from a crate: slots store the bins
//! themselves (sparse, delta-encoded, [`Sketch::encode`]) inside MongoDB
//! documents and the query fold merges them as they stream, where the
//! crates keep dense stores behind their own formats.

/// Magnitudes at or below this count as zero (their quantile answers 0).
pub const MIN_MAGNITUDE: f64 = 1e-9;
/// Bins kept per sign: past it the bins nearest zero are merged into one
/// (DDSketch's collapsing-lowest store), which only loosens quantiles of
/// magnitudes 2 048 bins below the largest (a factor of 10¹⁷ at 1 %).
pub const MAX_BINS: usize = 2048;
/// The finest accuracy: keys of every finite double then fit an `i32`.
pub const MIN_ACCURACY: f64 = 1e-4;
/// The encoding's version byte.
const VERSION: u8 = 1;

/// Why a sketch cannot be built, merged or read back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SketchError {
    #[error("the relative accuracy must be at least 0.0001 and below 0.5, not {0}")]
    Accuracy(f64),
    #[error("sketches of different accuracies do not merge")]
    Mismatch,
    #[error("the encoded sketch is malformed: {0}")]
    Malformed(&'static str),
}

/// A mergeable quantile sketch.
#[derive(Debug, Clone, PartialEq)]
pub struct Sketch {
    accuracy: f64,
    ln_gamma: f64,
    zero: u64,
    /// Positive values' bins, by ascending key.
    pos: Vec<(i32, u64)>,
    /// Negative values' bins, by the ascending key of their magnitude.
    neg: Vec<(i32, u64)>,
}

impl Sketch {
    /// An empty sketch with relative accuracy `accuracy` (0.01: 1 %).
    pub fn new(accuracy: f64) -> Result<Self, SketchError> {
        if !(MIN_ACCURACY..0.5).contains(&accuracy) {
            return Err(SketchError::Accuracy(accuracy));
        }
        let gamma = (1.0 + accuracy) / (1.0 - accuracy);
        Ok(Self {
            accuracy,
            ln_gamma: gamma.ln(),
            zero: 0,
            pos: Vec::new(),
            neg: Vec::new(),
        })
    }

    pub fn accuracy(&self) -> f64 {
        self.accuracy
    }

    /// Readings counted.
    pub fn count(&self) -> u64 {
        let bins = |s: &[(i32, u64)]| s.iter().map(|b| b.1).sum::<u64>();
        self.zero + bins(&self.pos) + bins(&self.neg)
    }

    /// Counts `v` (readings are finite; anything else is not counted).
    pub fn add(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        let magnitude = v.abs();
        if magnitude <= MIN_MAGNITUDE {
            self.zero += 1;
            return;
        }
        let key = self.key(magnitude);
        let store = if v > 0.0 {
            &mut self.pos
        } else {
            &mut self.neg
        };
        match store.binary_search_by_key(&key, |b| b.0) {
            Ok(i) => store[i].1 += 1,
            Err(i) => {
                store.insert(i, (key, 1));
                collapse(store);
            }
        }
    }

    /// Uncounts `v`, one of the readings counted: a slot's sketch without
    /// its first reading (PromQL's left-open windows). A value below the
    /// bins kept counts in the lowest, where collapsing put it.
    pub fn remove(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        let magnitude = v.abs();
        if magnitude <= MIN_MAGNITUDE {
            self.zero = self.zero.saturating_sub(1);
            return;
        }
        let key = self.key(magnitude);
        let store = if v > 0.0 {
            &mut self.pos
        } else {
            &mut self.neg
        };
        let at = match store.binary_search_by_key(&key, |b| b.0) {
            Ok(i) => Some(i),
            Err(0) if !store.is_empty() => Some(0),
            Err(_) => None,
        };
        if let Some(i) = at {
            store[i].1 -= 1;
            if store[i].1 == 0 {
                store.remove(i);
            }
        }
    }

    /// Adds `other`'s counts: the sketch of both sketches' readings.
    pub fn merge(&mut self, other: &Sketch) -> Result<(), SketchError> {
        if other.accuracy.to_bits() != self.accuracy.to_bits() {
            return Err(SketchError::Mismatch);
        }
        self.zero = self.zero.saturating_add(other.zero);
        merge_bins(&mut self.pos, &other.pos);
        merge_bins(&mut self.neg, &other.neg);
        Ok(())
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) within the accuracy of the exact one;
    /// none for an empty sketch or a `q` outside [0, 1].
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let n = self.count();
        if n == 0 || !(0.0..=1.0).contains(&q) {
            return None;
        }
        self.at_rank((q * (n - 1) as f64).floor() as u64)
    }

    /// The value at `rank` (from 0) of the sorted readings, within the
    /// accuracy; none past the last.
    pub fn at_rank(&self, rank: u64) -> Option<f64> {
        let mut seen = 0u64;
        // Most negative first: the largest magnitudes of the negative store.
        for &(key, c) in self.neg.iter().rev() {
            seen += c;
            if seen > rank {
                return Some(-self.value(key));
            }
        }
        seen += self.zero;
        if seen > rank {
            return Some(0.0);
        }
        for &(key, c) in &self.pos {
            seen += c;
            if seen > rank {
                return Some(self.value(key));
            }
        }
        None
    }

    /// The bins, compactly: the accuracy, the zero count, then each store's
    /// length and its bins as key deltas and counts (LEB128 varints, keys
    /// zigzagged). A slot of readings within one decade encodes in tens of
    /// bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + 4 * (self.pos.len() + self.neg.len()));
        out.push(VERSION);
        out.extend_from_slice(&self.accuracy.to_le_bytes());
        varint(&mut out, self.zero);
        for store in [&self.neg, &self.pos] {
            varint(&mut out, store.len() as u64);
            let mut last = 0i64;
            for &(key, c) in store {
                let delta = i64::from(key) - last;
                varint(&mut out, ((delta << 1) ^ (delta >> 63)) as u64);
                varint(&mut out, c);
                last = i64::from(key);
            }
        }
        out
    }

    /// Reads [`Sketch::encode`]'s bytes back; any other bytes are an error.
    pub fn decode(bytes: &[u8]) -> Result<Self, SketchError> {
        let mut r = Reader { bytes, at: 0 };
        if r.byte()? != VERSION {
            return Err(SketchError::Malformed("unknown version"));
        }
        let mut accuracy = [0u8; 8];
        for b in &mut accuracy {
            *b = r.byte()?;
        }
        let mut s = Sketch::new(f64::from_le_bytes(accuracy))
            .map_err(|_| SketchError::Malformed("accuracy out of range"))?;
        s.zero = r.varint()?;
        for negative in [true, false] {
            let len = r.varint()?;
            if len > MAX_BINS as u64 {
                return Err(SketchError::Malformed("too many bins"));
            }
            let mut store = Vec::with_capacity(len as usize);
            let mut last = 0i64;
            for _ in 0..len {
                let z = r.varint()?;
                let delta = ((z >> 1) as i64) ^ -((z & 1) as i64);
                let key = last
                    .checked_add(delta)
                    .and_then(|k| i32::try_from(k).ok())
                    .ok_or(SketchError::Malformed("key out of range"))?;
                if !store.is_empty() && i64::from(key) <= last {
                    return Err(SketchError::Malformed("keys out of order"));
                }
                let c = r.varint()?;
                if c == 0 {
                    return Err(SketchError::Malformed("an empty bin"));
                }
                store.push((key, c));
                last = i64::from(key);
            }
            if negative {
                s.neg = store;
            } else {
                s.pos = store;
            }
        }
        if r.at != bytes.len() {
            return Err(SketchError::Malformed("trailing bytes"));
        }
        // Counts that overflow a u64 together are not a sketch's.
        [s.zero]
            .into_iter()
            .chain(s.pos.iter().chain(&s.neg).map(|b| b.1))
            .try_fold(0u64, u64::checked_add)
            .ok_or(SketchError::Malformed("counts overflow"))?;
        Ok(s)
    }

    fn key(&self, magnitude: f64) -> i32 {
        // Finite magnitudes above MIN_MAGNITUDE give keys within ±4 million
        // at MIN_ACCURACY.
        (magnitude.ln() / self.ln_gamma).ceil() as i32
    }

    fn value(&self, key: i32) -> f64 {
        let gamma = self.ln_gamma.exp();
        2.0 * (f64::from(key) * self.ln_gamma).exp() / (gamma + 1.0)
    }
}

/// Merges the bins nearest zero until at most [`MAX_BINS`] are left.
fn collapse(store: &mut Vec<(i32, u64)>) {
    if store.len() <= MAX_BINS {
        return;
    }
    let cut = store.len() - MAX_BINS;
    let folded: u64 = store[..=cut].iter().map(|b| b.1).sum();
    store[cut].1 = folded;
    store.drain(..cut);
}

fn merge_bins(into: &mut Vec<(i32, u64)>, other: &[(i32, u64)]) {
    if other.is_empty() {
        return;
    }
    let mut out = Vec::with_capacity(into.len() + other.len());
    let (mut i, mut j) = (0, 0);
    loop {
        let bin = match (into.get(i), other.get(j)) {
            (Some(&x), Some(&y)) if x.0 == y.0 => {
                i += 1;
                j += 1;
                (x.0, x.1.saturating_add(y.1))
            }
            (Some(&x), Some(&y)) if x.0 < y.0 => {
                i += 1;
                x
            }
            (_, Some(&y)) => {
                j += 1;
                y
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (None, None) => break,
        };
        out.push(bin);
    }
    collapse(&mut out);
    *into = out;
}

fn varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push((x as u8) | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, SketchError> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or(SketchError::Malformed("cut short"))?;
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, SketchError> {
        let mut x = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(SketchError::Malformed("a varint past 64 bits"));
            }
            x |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(x);
            }
        }
        Err(SketchError::Malformed("a varint past 64 bits"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn values() -> impl Strategy<Value = Vec<f64>> {
        let one = prop_oneof![
            4 => -1e6f64..1e6,
            2 => 1e-6f64..1e9,
            1 => -1e9f64..-1e-6,
            1 => Just(0.0),
            1 => (0u32..20).prop_map(f64::from),
        ];
        prop::collection::vec(one, 1..400)
    }

    /// The exact quantile the sketch answers within its accuracy.
    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() - 1) as f64).floor() as usize]
    }

    fn within(got: f64, want: f64, accuracy: f64) -> bool {
        if want.abs() <= MIN_MAGNITUDE {
            return got == 0.0;
        }
        (got - want).abs() <= accuracy * want.abs() * (1.0 + 1e-9)
    }

    proptest! {
        /// Every quantile is within the accuracy of the exact one, and a
        /// sketch merged from parts is the sketch of all the readings.
        #[test]
        fn quantiles_are_within_the_accuracy_and_merging_is_exact(
            xs in values(),
            accuracy in prop_oneof![Just(0.01), Just(0.001), 0.005f64..0.1],
            qs in prop::collection::vec(0.0f64..=1.0, 1..8),
            cut in 0usize..400,
        ) {
            let mut all = Sketch::new(accuracy).expect("accuracy");
            xs.iter().for_each(|&x| all.add(x));
            let mut sorted = xs.clone();
            sorted.sort_by(f64::total_cmp);
            for q in qs.iter().copied().chain([0.0, 0.5, 0.95, 0.99, 1.0]) {
                let got = all.quantile(q).expect("readings");
                let want = exact(&sorted, q);
                prop_assert!(within(got, want, accuracy), "q {}: {} against {}", q, got, want);
            }
            let cut = cut.min(xs.len());
            let (mut a, mut b) = (Sketch::new(accuracy).expect("a"), Sketch::new(accuracy).expect("b"));
            xs[..cut].iter().for_each(|&x| a.add(x));
            xs[cut..].iter().for_each(|&x| b.add(x));
            b.merge(&a).expect("same accuracy");
            prop_assert_eq!(&b, &all);
            prop_assert_eq!(all.count(), xs.len() as u64);
            // Removing the first reading leaves the sketch of the others.
            let mut rest = all.clone();
            rest.remove(xs[0]);
            let mut others = Sketch::new(accuracy).expect("others");
            xs[1..].iter().for_each(|&x| others.add(x));
            prop_assert_eq!(&rest, &others);
            let back = Sketch::decode(&all.encode());
            prop_assert_eq!(back, Ok(all));
        }

        /// Bytes that are not an encoded sketch are an error, never a panic.
        #[test]
        fn any_bytes_decode_to_a_sketch_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(s) = Sketch::decode(&bytes) {
                prop_assert_eq!(Sketch::decode(&s.encode()), Ok(s));
            }
        }
    }

    #[test]
    fn every_double_keeps_at_most_the_bins_and_the_high_quantiles() {
        let mut s = Sketch::new(0.001).expect("accuracy");
        let mut xs = Vec::new();
        // Over 2 700 distinct bins per sign: the ones nearest zero collapse.
        for e in -300..=300 {
            for m in 1..=9 {
                let x: f64 = f64::from(m) * 10f64.powi(e);
                xs.extend([x, -x]);
            }
        }
        xs.iter().for_each(|&x| s.add(x));
        assert!(s.pos.len() <= MAX_BINS && s.neg.len() <= MAX_BINS);
        assert_eq!(s.count(), xs.len() as u64);
        xs.sort_by(f64::total_cmp);
        assert_eq!(s.pos.len(), MAX_BINS);
        for q in [0.0, 0.01, 0.99, 1.0] {
            let (got, want) = (s.quantile(q).expect("q"), exact(&xs, q));
            assert!(within(got, want, 0.001), "{q}: {got} against {want}");
        }
        // The collapsed bins answer their lowest kept bin, not 1e-300.
        assert!(s.quantile(0.5).is_some());
    }

    #[test]
    fn accuracies_are_checked_and_do_not_mix() {
        assert!(Sketch::new(0.0).is_err());
        assert!(Sketch::new(0.5).is_err());
        assert!(Sketch::new(f64::NAN).is_err());
        let mut a = Sketch::new(0.01).expect("a");
        let b = Sketch::new(0.02).expect("b");
        assert_eq!(a.merge(&b), Err(SketchError::Mismatch));
        assert_eq!(a.quantile(0.5), None);
        a.add(f64::NAN);
        a.add(f64::INFINITY);
        assert_eq!(a.count(), 0);
        a.add(20.0);
        assert_eq!(a.quantile(1.5), None);
        // One reading: every quantile is it, to 1 %.
        let got = a.quantile(0.3).expect("one");
        assert!((got - 20.0).abs() <= 0.2, "{got}");
        // Readings within a decade encode in a few dozen bytes.
        for k in 0..3600 {
            a.add(20.0 + f64::from(k % 100) / 50.0);
        }
        assert!(a.encode().len() < 40, "{}", a.encode().len());
    }
}
