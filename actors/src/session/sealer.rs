//! [`LogSealer`]: runs the seals of sessions' log batches (`fleetops_storage::sessions::seal`), each
//! on a blocking thread, at most `[logs] max_concurrent_seals` at once.
//!
//! Three things ask for a seal: a session's actor once `[logs] seal_lines` lines or
//! `seal_bytes` bytes have arrived since its last request, the end of a session (completed or
//! failed), and the housekeeper's pass for sessions whose oldest unsealed batch is older than
//! `seal_age_seconds`. A request finding every place taken is dropped: the batches stay
//! unsealed (and answer queries as they are) until the next request or pass. A seal that
//! finds a reader holding the session's chunks (a query, an export) leaves them for later
//! the same way.
//!
//! It holds no state that matters: what is sealed and what is owed a seal are in the store,
//! so a panic in a seal loses nothing (its transaction did not commit) and a restart seals
//! what is owed at the first housekeeping pass.

use std::sync::Arc;

use fleetops_storage::Store;
use fleetops_storage::sessions::seal::{SealPlan, SealSkipped};

use crate::config::LogsConfig;
use crate::counters::Counters;

/// Seals one request runs at most for a session that may still be receiving.
const ROUNDS: usize = 16;
/// Sessions owed a seal that one housekeeping pass looks at, at most.
const OWED_PER_PASS: usize = 10_000;

#[derive(Clone)]
pub struct LogSealer {
    store: Store,
    plan: SealPlan,
    cfg: LogsConfig,
    places: Arc<tokio::sync::Semaphore>,
    counters: Arc<Counters>,
}

impl LogSealer {
    pub(crate) fn new(store: Store, cfg: LogsConfig, counters: Arc<Counters>) -> Self {
        let plan = SealPlan {
            chunk_lines: cfg.chunk_lines.max(1),
            chunk_bytes: cfg.chunk_bytes.max(1),
            // One seal reads two chunks' worth (one segment): enough to merge, and a short
            // transaction for the appends and readers that wait on it.
            max_source_bytes: cfg.chunk_bytes.max(1).saturating_mul(2),
            commit_wait: std::time::Duration::from_secs(1),
        };
        Self {
            places: Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent_seals.max(1))),
            store,
            plan,
            cfg,
            counters,
        }
    }

    /// Whether `lines` and `bytes` arrived unsealed call for a seal.
    pub(crate) fn due(&self, lines: usize, bytes: usize) -> bool {
        lines >= self.cfg.seal_lines || bytes >= self.cfg.seal_bytes
    }

    /// Starts sealing `session` unless every place is taken; whether it started. A session
    /// still receiving gets a few rounds (its actor asks again), so that a busy session never
    /// keeps a place from the others.
    pub(crate) fn request(&self, session: u64) -> bool {
        self.start(session, ROUNDS)
    }

    /// As [`LogSealer::request`] for a session that ended: every batch it has left is sealed
    /// (nothing more can arrive, so the rounds end).
    pub(crate) fn request_all(&self, session: u64) -> bool {
        self.start(session, usize::MAX)
    }

    fn start(&self, session: u64, rounds: usize) -> bool {
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            return false;
        };
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _place = place;
            this.seal(session, rounds);
        });
        true
    }

    /// Seals sessions owed one for longer than `seal_age_seconds` (at most `OWED_PER_PASS`),
    /// as many as there are free places; how many were owed.
    pub(crate) async fn seal_owed(&self, now_ms: i64) -> crate::Result<usize> {
        let store = self.store.clone();
        let before = now_ms.saturating_sub((self.cfg.seal_age_seconds as i64).saturating_mul(1000));
        let owed =
            tokio::task::spawn_blocking(move || store.sessions_owed_seal(before, OWED_PER_PASS))
                .await
                .map_err(|e| crate::Error::Internal(e.to_string()))??;
        for &session in &owed {
            // What finds no place waits for the next pass: a slow blob store must not hold the
            // housekeeper's other chores.
            let Ok(place) = self.places.clone().try_acquire_owned() else {
                break;
            };
            let this = self.clone();
            tokio::task::spawn_blocking(move || {
                let _place = place;
                this.seal(session, ROUNDS);
            });
        }
        Ok(owed.len())
    }

    /// Seals `session` until nothing is left unsealed, a reader holds it, it is gone, or
    /// `rounds` seals are done.
    fn seal(&self, session: u64, rounds: usize) {
        // A deleted organization's sessions are purged, not sealed.
        if let Ok(Some(s)) = self.store.session_by_id(session)
            && self.store.project_retired(s.project_id)
        {
            return;
        }
        for _ in 0..rounds {
            match self.store.seal_logs(session, self.plan) {
                Ok(Ok(done)) => {
                    Counters::add(&self.counters.log_batches_sealed, done.sources as u64);
                    Counters::add(&self.counters.log_chunks_sealed, done.chunks as u64);
                    // Nothing taken: what the counters promise is not there (a purge under
                    // way); another round would find the same.
                    if !done.more || done.sources == 0 {
                        return;
                    }
                }
                Ok(Err(SealSkipped::Busy | SealSkipped::Gone)) => return,
                Err(e) => {
                    Counters::add(&self.counters.log_seals_failed, 1);
                    tracing::warn!(session, error = %e, "sealing log batches failed");
                    return;
                }
            }
        }
    }
}
