//! One memory budget per query: every value a PromQL evaluation holds
//! (series, their values, label sets, the strings functions build) is
//! charged to the query's [`Ledger`] before it is built, and the ledger
//! draws on the instance's [`MemoryPool`], so neither one query nor all of
//! them together can hold more than their settings
//! (`query.max_memory_per_query`, `query.max_memory`).
//!
//! How a tree is charged, by construction rather than case by case:
//! - **Reads** are charged as they are laid out (series × evaluation times),
//!   before their values are allocated, and given back as the tree takes
//!   them.
//! - **Each node** is evaluated between a mark and a reset
//!   ([`Ledger::mark`], [`Ledger::reset`]): what its children answered and
//!   what it reserved while building its own answer are released together
//!   when it returns, and its answer is charged in their place. So what is
//!   charged at any moment is what the frames of the recursion hold: the
//!   answers of finished siblings (the left side of `a ^ (b ^ …)` while the
//!   right is computed) and the answer being built.
//! - **Operations whose answer can be larger than their inputs** (a
//!   subquery's windows, `count_values`' series per value, vector matching,
//!   `@` broadcasts, the label functions' new values) reserve each new series
//!   before allocating it, so a short text cannot allocate past the budget
//!   even once. The rest answer at most what they were given, already
//!   charged.
//!
//! Over the query's budget the answer is a 422 naming
//! `query.max_memory_per_query`; over the instance's (other queries hold
//! it) a 503 with Retry-After naming `query.max_memory`. Pure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::error::PromError;
use super::value::{LabelSet, Series, Value};

/// What every query together may hold (`query.max_memory`).
#[derive(Debug)]
pub struct MemoryPool {
    used: AtomicUsize,
    max: usize,
}

impl MemoryPool {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            max,
        })
    }

    /// Bytes the running queries hold now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }
}

/// Where a node's evaluation began (see [`Ledger::mark`]).
#[derive(Debug, Clone, Copy)]
pub struct Mark(usize);

/// One query's memory: reads laid out and not yet taken, and what the
/// evaluation holds.
#[derive(Debug)]
pub struct Ledger {
    /// Reads charged and not yet taken by the tree.
    reads: AtomicUsize,
    /// What the evaluation's frames hold.
    held: AtomicUsize,
    max: usize,
    pool: Option<Arc<MemoryPool>>,
}

impl Ledger {
    /// A ledger of `max` bytes drawing on `pool`.
    pub fn new(max: usize, pool: Option<Arc<MemoryPool>>) -> Self {
        Self {
            reads: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            max,
            pool,
        }
    }

    /// A ledger no evaluation can exhaust, for tests of other things.
    #[cfg(test)]
    pub fn unlimited() -> Self {
        Self::new(usize::MAX, None)
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.reads
            .load(Ordering::Acquire)
            .saturating_add(self.held.load(Ordering::Acquire))
    }

    /// Charges `n` bytes to the query (and the instance), or refuses.
    fn take(&self, n: usize) -> Result<(), PromError> {
        if self.used().saturating_add(n) > self.max {
            return Err(PromError::Execution(format!(
                "the query would hold more than {} bytes (query.max_memory_per_query); narrow its selectors, range or steps",
                self.max
            )));
        }
        if let Some(pool) = &self.pool
            && !pool.take(n)
        {
            return Err(PromError::Busy(format!(
                "the queries running now hold query.max_memory ({} bytes); retry shortly",
                pool.max
            )));
        }
        Ok(())
    }

    fn give_back(&self, n: usize) {
        if let Some(pool) = &self.pool {
            pool.give_back(n);
        }
    }

    /// Reserves `n` bytes for what the current node is about to build.
    pub fn reserve(&self, n: usize) -> Result<(), PromError> {
        self.take(n)?;
        self.held.fetch_add(n, Ordering::AcqRel);
        Ok(())
    }

    /// Charges a read of `n` bytes, before its values are allocated.
    pub fn reserve_read(&self, n: usize) -> Result<(), PromError> {
        self.take(n)?;
        self.reads.fetch_add(n, Ordering::AcqRel);
        Ok(())
    }

    /// A read of `n` bytes passes into the tree (which charges it as the
    /// answer of the node that took it).
    pub fn read_taken(&self, n: usize) {
        let before = self
            .reads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(n))
            })
            .unwrap_or(0);
        self.give_back(before.min(n));
    }

    /// Where a node begins.
    pub fn mark(&self) -> Mark {
        Mark(self.held.load(Ordering::Acquire))
    }

    /// A node ended: everything reserved since `mark` (its children's
    /// answers, its own reservations) is released.
    pub fn reset(&self, mark: Mark) {
        let before = self.held.swap(mark.0, Ordering::AcqRel);
        self.give_back(before.saturating_sub(mark.0));
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.give_back(self.used());
    }
}

/// Bytes a label set holds (each entry's two strings and its share of the
/// map's nodes).
pub fn label_bytes(labels: &LabelSet) -> usize {
    labels
        .iter()
        .map(|(k, v)| k.len() + v.len() + LABEL_ENTRY)
        .sum::<usize>()
        .saturating_add(SERIES_HEADER)
}

/// What a map entry costs besides its strings' bytes: two `String`s and a
/// share of a B-tree node.
const LABEL_ENTRY: usize = 72;
/// A series' own fields.
const SERIES_HEADER: usize = 64;
/// One value of a series (`Option<f64>`).
pub const VALUE: usize = std::mem::size_of::<Option<f64>>();

/// Bytes a series of `n` values with `labels` holds.
pub fn series_bytes(labels: &LabelSet, n: usize) -> usize {
    label_bytes(labels).saturating_add(n.saturating_mul(VALUE))
}

/// Bytes the label sets of `series` hold.
pub fn labels_of(series: &[Series]) -> usize {
    series
        .iter()
        .map(|s| label_bytes(&s.labels))
        .fold(0usize, usize::saturating_add)
}

/// Bytes `series` hold.
pub fn vector_bytes(series: &[Series]) -> usize {
    series
        .iter()
        .map(|s| series_bytes(&s.labels, s.values.len()))
        .fold(0usize, usize::saturating_add)
}

/// Bytes a value holds.
pub fn value_bytes(v: &Value) -> usize {
    match v {
        Value::Scalar(x) => x.len().saturating_mul(8).saturating_add(SERIES_HEADER),
        Value::Vector(s) => vector_bytes(s),
        Value::String(s) => s.len().saturating_add(SERIES_HEADER),
    }
}

/// Bytes writing out `v` takes besides `v` itself: its points copied into
/// the answer (16 bytes each) and the answer's JSON text (about 25 bytes a
/// point, labels quoted), charged before either is built.
pub fn answer_bytes(v: &Value) -> usize {
    value_bytes(v).saturating_mul(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_releases_its_childrens_answers_and_is_charged_its_own() {
        let pool = MemoryPool::new(10_000);
        let ledger = Ledger::new(1_000, Some(pool.clone()));
        ledger.reserve_read(300).expect("fits");
        let outer = ledger.mark();
        ledger.reserve(200).expect("a child's answer");
        let inner = ledger.mark();
        ledger.reserve(400).expect("a grandchild's");
        assert!(ledger.reserve(101).is_err(), "past the query's 1000");
        ledger.reset(inner);
        assert_eq!(ledger.used(), 500);
        ledger.read_taken(300);
        ledger.reset(outer);
        assert_eq!(ledger.used(), 0);
        assert_eq!(pool.used(), 0, "the instance got every byte back");
    }

    #[test]
    fn the_instance_pool_bounds_queries_together_and_gets_back_what_a_dropped_query_held() {
        let pool = MemoryPool::new(1_000);
        let a = Ledger::new(800, Some(pool.clone()));
        let b = Ledger::new(800, Some(pool.clone()));
        a.reserve(700).expect("fits");
        match b.reserve(400) {
            Err(PromError::Busy(m)) => assert!(m.contains("query.max_memory"), "{m}"),
            other => panic!("busy: {other:?}"),
        }
        match a.reserve(200) {
            Err(PromError::Execution(m)) => {
                assert!(m.contains("query.max_memory_per_query"), "{m}")
            }
            other => panic!("over the query's budget: {other:?}"),
        }
        drop(a);
        assert_eq!(pool.used(), 0);
        b.reserve(400).expect("room again");
    }
}
