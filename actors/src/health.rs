//! What `/healthz` reports: the parts of the supervision tree that are down, and the entities
//! held down past their restart budget. Written by the root and keyed supervisors, read by
//! the edge; it depends on nothing else in the tree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// The root's children that are down now (failed and not yet running again), by name; and
/// the entities (one project's, session's, installation's actor) past their restart budget,
/// each refusing its own requests (503) while everything else serves.
#[derive(Clone, Default)]
pub struct Health {
    down: Arc<Mutex<BTreeSet<&'static str>>>,
    /// Entity -> the end of its window (it is refused until then, and named until then).
    contained: Arc<Mutex<BTreeMap<(&'static str, u64), Instant>>>,
    /// Fault injection for tests: the next start of the named child fails.
    #[cfg(feature = "fault-injection")]
    fail_next_start: Arc<Mutex<BTreeSet<String>>>,
}

impl Health {
    pub fn down(&self) -> Vec<&'static str> {
        let d = self.down.lock().unwrap_or_else(|p| p.into_inner());
        d.iter().copied().collect()
    }

    /// Entities past their restart budget whose window has not passed, as `kind id` (at most
    /// [`Self::MAX_NAMED`]), and how many there are. Entries whose window passed are dropped
    /// here, so the set holds only entities refusing now.
    pub fn contained(&self) -> (Vec<String>, usize) {
        let mut c = self.entities();
        let now = Instant::now();
        c.retain(|_, until| *until > now);
        let names = c
            .keys()
            .take(Self::MAX_NAMED)
            .map(|(kind, id)| format!("{kind} {id}"))
            .collect();
        (names, c.len())
    }

    /// Entities named at most by `/healthz` (the count is always whole).
    pub const MAX_NAMED: usize = 100;

    /// A poisoned lock still holds a consistent map (every change is one insert or remove).
    fn entities(&self) -> MutexGuard<'_, BTreeMap<(&'static str, u64), Instant>> {
        self.contained.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn contain(&self, kind: &'static str, id: u64, until: Instant) {
        self.entities().insert((kind, id), until);
    }

    pub(crate) fn release(&self, kind: &'static str, id: u64) {
        let mut c = self.entities();
        if !c.is_empty() {
            c.remove(&(kind, id));
        }
    }

    /// Every entity of a kind, when its supervisor starts afresh (with no budgets spent).
    pub(crate) fn release_kind(&self, kind: &'static str) {
        self.entities().retain(|(k, _), _| *k != kind);
    }

    pub(crate) fn set(&self, child: &'static str, down: bool) {
        let mut d = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if down {
            d.insert(child);
        } else {
            d.remove(child);
        }
    }

    /// Makes the next start of the named child fail (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_start_failure(&self, name: &str) {
        if let Ok(mut f) = self.fail_next_start.lock() {
            f.insert(name.to_string());
        }
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn take_start_failure(&self, child: &str) -> bool {
        self.fail_next_start
            .lock()
            .map(|mut f| f.remove(child))
            .unwrap_or(false)
    }
}
