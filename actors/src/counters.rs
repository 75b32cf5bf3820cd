//! Running totals for `/metrics` that no one actor owns: log lines ingested and notification
//! attempts by outcome. Relaxed atomics: each is one add on its path.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Counters {
    /// Lines of acknowledged (durable) log batches.
    pub log_lines: AtomicU64,
    /// Log batches (chunks as appended) sealed ...
    pub log_batches_sealed: AtomicU64,
    /// ... and the chunks they became.
    pub log_chunks_sealed: AtomicU64,
    /// Seals that failed (an error of the store or the blob store): their batches stay
    /// unsealed, answer queries as they are, and are sealed at a later request or pass.
    pub log_seals_failed: AtomicU64,
    /// Notification attempts the target accepted.
    pub notifications_sent: AtomicU64,
    /// Attempts that failed and will be tried again.
    pub notifications_retried: AtomicU64,
    /// Notifications given up on (a final refusal, or out of attempts).
    pub notifications_failed: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
