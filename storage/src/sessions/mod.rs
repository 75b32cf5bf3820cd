//! Sessions, their counters and their log chunks.
//!
//! A session's record and its index live in `records`; its log chunks in the `logs` tree, one
//! key per appended batch (`v1/l/{session}/{chunk}`), so a million lines are a thousand keys,
//! not a million. Appending a chunk and advancing the counters is one transaction over both
//! trees, so a crash never leaves counters that disagree with the chunks.
//!
//! Here the record, its lists and counters; `append` (a batch, its sequence number checked
//! with the write), `chunks` (reading chunks, local or sealed), `artifacts`, `delete`; `seal`
//! merges small chunks into `segments`; `text_filter` lets a search skip chunks.

pub mod records;

use crate::engine::{Bytes, Iter, TxError, TxOutcome};
use crate::keys::ord;
use crate::lists::{Entry, ListId, Listed, Query};
use crate::{
    Artifact, LogChunk, Result, Session, SessionCounters, SessionStatus, StorageError, Store,
    Writes, codec, keys,
};

mod append;
mod artifacts;
mod chunks;
mod delete;
pub mod seal;
pub mod segments;
pub(crate) mod text_filter;

pub use append::ChunkIndex;

/// Sessions are listed by start time; each (device, status) filter has its own list.
fn list(project: u64, device: Option<u64>, status: Option<SessionStatus>) -> ListId {
    match (device, status) {
        (None, None) => ListId::new("ss").id(project),
        (Some(d), None) => ListId::new("ssd").id(project).id(d),
        (None, Some(s)) => ListId::new("sst").id(project).str(s.as_str()),
        (Some(d), Some(s)) => ListId::new("ssdt").id(project).id(d).str(s.as_str()),
    }
}

impl Listed for Session {
    fn entries(&self) -> Vec<Entry> {
        let (p, o, id) = (self.project_id, ord(self.started_at), self.id);
        let (d, s) = (Some(self.device_id), Some(self.status));
        vec![
            Entry::at(list(p, None, None), o, id),
            Entry::at(list(p, d, None), o, id),
            Entry::at(list(p, None, s), o, id),
            Entry::at(list(p, d, s), o, id),
        ]
    }
}

/// Which sessions a list shows; `since` inclusive and `until` exclusive on the start.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionQuery {
    pub device: Option<u64>,
    pub status: Option<SessionStatus>,
    pub since: Option<i64>,
    pub until: Option<i64>,
}

/// A project's own retention of ended sessions, overriding `[logs] retention_days`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogRetention {
    /// Days an ended session is kept (0: for good); `None`: the server's default.
    pub retention_days: Option<u32>,
}

/// What an append or an artifact to a session no longer active conflicts with.
pub const SESSION_NOT_ACTIVE: &str = "session not active";
/// The conflict of a batch whose sequence number the session has already stored.
pub const DUPLICATE_BATCH: &str = "duplicate batch";

impl Store {
    pub fn session(&self, project: u64, id: u64) -> Result<Option<Session>> {
        self.get(&keys::session(project, id))
    }

    /// A session by id alone (its actor knows no project).
    pub fn session_by_id(&self, id: u64) -> Result<Option<Session>> {
        match self.get_id(&keys::session_project(id))? {
            Some(project) => self.session(project, id),
            None => Ok(None),
        }
    }

    /// A page of a project's sessions, newest start first (id breaking ties), and how many
    /// the query shows. A time range counts its entries by key; otherwise one read counts.
    pub fn sessions_page(
        &self,
        project: u64,
        q: SessionQuery,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<Session>, u64)> {
        let keep = |_: &Session| true;
        let key = |id| keys::session(project, id);
        Query {
            unlisted: false,
            candidates: vec![list(project, q.device, q.status)],
            all: list(project, None, None),
            lo: q.since.map(ord).unwrap_or(0),
            hi: q.until.map(ord),
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    /// Up to `limit` of `project`'s sessions that ended before `cutoff` (Unix ms), oldest start
    /// first, looking at no more than `scan` ended sessions of each end status (a long session
    /// that started before the cutoff but ended after it is passed over).
    pub fn sessions_ended_before(
        &self,
        project: u64,
        cutoff: i64,
        limit: usize,
        scan: usize,
    ) -> Result<Vec<Session>> {
        let mut out = Vec::new();
        for status in [SessionStatus::Completed, SessionStatus::Failed] {
            for id in self.list_ids_from(&list(project, None, Some(status)), 0, scan)? {
                if out.len() >= limit {
                    return Ok(out);
                }
                let Some(s) = self.session(project, id)? else {
                    continue;
                };
                if s.started_at >= cutoff {
                    break;
                }
                if s.ended_at.is_some_and(|e| e < cutoff) {
                    out.push(s);
                }
            }
        }
        Ok(out)
    }

    pub fn log_retention(&self, project: u64) -> Result<LogRetention> {
        Ok(self
            .get(&keys::project_log_retention(project))?
            .unwrap_or_default())
    }

    pub fn put_log_retention(&self, project: u64, r: &LogRetention) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::project_log_retention(project), r)?;
        self.apply(w)
    }

    /// A project's sessions, newest first.
    pub fn project_sessions(&self, project: u64) -> Result<Vec<Session>> {
        self.scan_rev(&keys::session_prefix(project))
    }

    pub fn put_session(&self, s: &Session) -> Result<()> {
        let mut w = Writes::new();
        w.put_listed(keys::session(s.project_id, s.id), s)?;
        w.put_id(keys::session_project(s.id), s.project_id);
        self.apply(w)
    }

    pub fn session_counters(&self, id: u64) -> Result<SessionCounters> {
        Ok(self.get(&keys::session_counters(id))?.unwrap_or_default())
    }

    /// The counters of each of `ids`, in order, in one read (a list page's).
    pub fn sessions_counters(&self, ids: &[u64]) -> Result<Vec<SessionCounters>> {
        let keys: Vec<Vec<u8>> = ids.iter().map(|id| keys::session_counters(*id)).collect();
        let mut out = Vec::with_capacity(ids.len());
        for v in self.inner.records.get_many(&keys)? {
            out.push(match v {
                Some(v) => codec::decode(&v)?,
                None => SessionCounters::default(),
            });
        }
        Ok(out)
    }

    pub fn put_session_counters(&self, id: u64, c: &SessionCounters) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::session_counters(id), c)?;
        self.apply(w)
    }
}
