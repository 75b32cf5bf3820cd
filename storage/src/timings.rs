//! A histogram of durations kept in relaxed atomics (one add per observation, no lock), for
//! figures taken on hot paths: every poll of every request, every group-commit fsync. `/metrics`
//! renders a snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the buckets: 62.5 µs doubling to about 2 s (1 ms is one).
pub const BOUNDS: [f64; 16] = {
    let mut b = [0.0; 16];
    let mut i = 0;
    while i < 16 {
        b[i] = 0.0000625 * (1u64 << i) as f64;
        i += 1;
    }
    b
};

#[derive(Debug, Default)]
pub struct Timings {
    /// One per bound, and the last past every bound.
    buckets: [AtomicU64; 17],
    sum_ns: AtomicU64,
}

/// What a [`Timings`] held at one moment.
pub struct Snapshot {
    /// `(upper bound, count in this bucket)`, the last bound `f64::MAX` (+Inf).
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl Timings {
    pub fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BOUNDS.len());
        if let Some(b) = self.buckets.get(i) {
            b.fetch_add(1, Relaxed);
        }
        self.sum_ns
            .fetch_add(took.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut buckets = Vec::with_capacity(BOUNDS.len() + 1);
        let mut count = 0;
        for (i, bound) in BOUNDS.iter().copied().chain([f64::MAX]).enumerate() {
            let k = self.buckets.get(i).map_or(0, |b| b.load(Relaxed));
            count += k;
            buckets.push((bound, k));
        }
        Snapshot {
            buckets,
            count,
            sum_seconds: self.sum_ns.load(Relaxed) as f64 / 1e9,
        }
    }
}
