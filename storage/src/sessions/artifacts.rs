//! A session's artifacts (the files a run uploaded).

use super::*;

impl Store {
    pub fn artifact(&self, session: u64, path: &str) -> Result<Option<Artifact>> {
        self.get(&keys::artifact(session, path))
    }

    /// A session's artifacts, sorted by path.
    pub fn artifacts(&self, session: u64) -> Result<Vec<Artifact>> {
        let mut v: Vec<Artifact> = self.scan_rev(&keys::artifact_prefix(session))?;
        v.reverse();
        Ok(v)
    }

    /// Records an artifact (replacing one at the same path) with the session's new counters.
    /// Stores an artifact record with the counters that account for it, while the session
    /// (of `project`) is still active and its stored counters are still `prev`
    /// ([`StorageError::Conflict`] otherwise, as for appends).
    pub fn put_artifact(
        &self,
        project: u64,
        a: &Artifact,
        prev: &SessionCounters,
        counters: &SessionCounters,
    ) -> Result<()> {
        let mut w = Writes::new();
        w.guard(
            keys::session(project, a.session_id),
            SESSION_NOT_ACTIVE,
            |v| {
                v.and_then(|v| codec::decode::<crate::Session>(v).ok())
                    .is_some_and(|s| s.status == SessionStatus::Active)
            },
        );
        let key = keys::session_counters(a.session_id);
        let prev = *prev;
        w.guard(key, "session counters", move |v| {
            let stored = match v {
                Some(v) => codec::decode::<SessionCounters>(v).ok(),
                None => Some(SessionCounters::default()),
            };
            stored == Some(prev)
        });
        w.put(keys::artifact(a.session_id, &a.path), a)?;
        w.put(keys::session_counters(a.session_id), counters)?;
        self.apply(w)
    }
}
