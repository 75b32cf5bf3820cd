//! Pins: readers holding a session's chunks against a seal's rewrite, on this server (a
//! count and a condition variable) and across servers (the session's advisory lock).

use super::*;

#[derive(Default)]
pub(super) struct PinState {
    readers: u32,
    /// A seal of the session is under way (one at a time).
    sealing: bool,
    /// Its transaction is waiting or running: new readers wait.
    committing: bool,
}

impl PinState {
    pub(super) fn idle(&self) -> bool {
        self.readers == 0 && !self.sealing && !self.committing
    }
}

/// Readers and seals of each session's chunks (see the module header).
#[derive(Default)]
pub(crate) struct LogPins {
    state: Mutex<HashMap<u64, PinState>>,
    changed: Condvar,
}

/// A reader's hold on a session's chunks: no seal rewrites them while it lives. A reader takes
/// one pin for all its reads: a second pin of the same session, taken while a seal waits for
/// the first to go, waits for that seal (up to its `commit_wait`).
pub struct LogPin {
    store: Store,
    session: u64,
    /// The session's advisory lock, held shared against other servers' seals (shared
    /// databases only).
    across: Option<(crate::engine::pg::Pg, i64)>,
}

impl Drop for LogPin {
    fn drop(&mut self) {
        if let Some((pg, key)) = self.across.take() {
            // Given back by a task of the engine's own, whether or not it is awaited.
            drop(pg.advisory(key, Advisory::GiveShared));
        }
        let pins = &self.store.inner.log_pins;
        let mut st = pins.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = st.get_mut(&self.session) {
            p.readers = p.readers.saturating_sub(1);
            let (last, idle) = (p.readers == 0, p.idle());
            if idle {
                st.remove(&self.session);
            }
            drop(st);
            if last {
                pins.changed.notify_all();
            }
        }
    }
}

/// How long a reader waits for another server's seal to commit.
pub(super) const ACROSS_WAIT: Duration = Duration::from_secs(30);

/// A seal's exclusive hold of a session's advisory lock against other servers' readers;
/// given back when dropped. Empty on a store of one server.
pub(super) struct SealAcross(Option<(crate::engine::pg::Pg, i64)>);

impl Drop for SealAcross {
    fn drop(&mut self) {
        if let Some((pg, key)) = self.0.take() {
            drop(pg.advisory(key, Advisory::Give));
        }
    }
}

impl Store {
    /// Takes `session`'s advisory lock exclusive (shared databases), trying for up to
    /// `wait`: `None` while other servers' readers keep it.
    pub(super) fn seal_across(&self, session: u64, wait: Duration) -> Result<Option<SealAcross>> {
        let (crate::engine::Db::Pg(pg), true) = (&self.inner.db, self.inner.shared) else {
            return Ok(Some(SealAcross(None)));
        };
        let key = crate::sections::lock_key(&format!("logs/{session}"));
        let deadline = Instant::now() + wait;
        while !pg.advisory_blocking(key, Advisory::Take)? {
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(Some(SealAcross(Some((pg.clone(), key)))))
    }
}

/// A seal under way: the only one for its session.
pub(super) struct SealHold<'a> {
    pins: &'a LogPins,
    session: u64,
}

impl Drop for SealHold<'_> {
    fn drop(&mut self) {
        let mut st = self.pins.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = st.get_mut(&self.session) {
            p.sealing = false;
            if p.idle() {
                st.remove(&self.session);
            }
        }
    }
}

/// A seal's transaction: no reader holds the session's chunks while it lives.
pub(super) struct CommitHold<'a> {
    pins: &'a LogPins,
    session: u64,
}

impl Drop for CommitHold<'_> {
    fn drop(&mut self) {
        let mut st = self.pins.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = st.get_mut(&self.session) {
            p.committing = false;
        }
        drop(st);
        self.pins.changed.notify_all();
    }
}

impl LogPins {
    pub(super) fn try_seal(&self, session: u64) -> Option<SealHold<'_>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let p = st.entry(session).or_default();
        if p.sealing {
            return None;
        }
        p.sealing = true;
        Some(SealHold {
            pins: self,
            session,
        })
    }

    /// Stops new readers of `session` and waits, at most `wait`, for its readers to finish.
    pub(super) fn commit(&self, session: u64, wait: Duration) -> Option<CommitHold<'_>> {
        let deadline = Instant::now() + wait;
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.entry(session).or_default().committing = true;
        let hold = CommitHold {
            pins: self,
            session,
        };
        loop {
            if st.get(&session).is_none_or(|p| p.readers == 0) {
                return Some(hold);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(st);
                // Dropping the hold lets the waiting readers in.
                drop(hold);
                return None;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Store {
    /// Holds `session`'s chunks against a seal's rewrite while the pin lives (waiting for one
    /// committing now).
    pub fn log_pin(&self, session: u64) -> LogPin {
        let pins = &self.inner.log_pins;
        let mut st = pins.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let p = st.entry(session).or_default();
            if !p.committing {
                p.readers += 1;
                break;
            }
            st = pins.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        drop(st);
        let mut pin = LogPin {
            store: self.clone(),
            session,
            across: None,
        };
        // Other servers' seals: held off by the session's advisory lock, taken shared. A
        // seal holds it exclusive only while its transaction commits.
        if let (crate::engine::Db::Pg(pg), true) = (&self.inner.db, self.inner.shared) {
            let key = crate::sections::lock_key(&format!("logs/{session}"));
            let deadline = Instant::now() + ACROSS_WAIT;
            loop {
                match pg.advisory_blocking(key, Advisory::TakeShared) {
                    Ok(true) => {
                        pin.across = Some((pg.clone(), key));
                        break;
                    }
                    Ok(false) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    // Never past a seal's commit, which its statements' timeouts bound; or
                    // the database is out of reach, and so are the reads that follow.
                    other => {
                        tracing::warn!(session, answer = ?other, "log read not held against other servers' seals");
                        break;
                    }
                }
            }
        }
        pin
    }
}
