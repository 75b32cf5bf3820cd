//! Sessions, their counters and their log chunks.
//!
//! A session's record and its index live in `records`; its log chunks in the `logs` tree, one
//! key per appended batch (`v1/l/{session}/{chunk}`), so a million lines are a thousand keys,
//! not a million. Appending a chunk and advancing the counters is one transaction over both
//! trees, so a crash never leaves counters that disagree with the chunks.

use sled::Transactional;

use crate::{
    Artifact, LogChunk, Result, Session, SessionCounters, StorageError, Store, Writes, codec, keys,
};

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

    /// A project's sessions, newest first.
    pub fn project_sessions(&self, project: u64) -> Result<Vec<Session>> {
        self.scan_rev(&keys::session_prefix(project))
    }

    pub fn put_session(&self, s: &Session) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::session(s.project_id, s.id), s)?;
        w.put_id(keys::session_project(s.id), s.project_id);
        self.apply(w.0)
    }

    pub fn session_counters(&self, id: u64) -> Result<SessionCounters> {
        Ok(self.get(&keys::session_counters(id))?.unwrap_or_default())
    }

    /// Stores one chunk and the counters that account for it, atomically.
    pub fn append_chunk(
        &self,
        session: u64,
        chunk: &LogChunk,
        counters: &SessionCounters,
        seq: u64,
    ) -> Result<()> {
        let chunk_bytes = codec::encode(chunk)?;
        let counter_bytes = codec::encode(counters)?;
        let chunk_key = keys::log_chunk(session, seq);
        let counters_key = keys::session_counters(session);
        (&self.inner.logs, &self.inner.records)
            .transaction(|(logs, records)| {
                logs.insert(chunk_key.as_slice(), chunk_bytes.as_slice())?;
                records.insert(counters_key.as_slice(), counter_bytes.as_slice())?;
                Ok(())
            })
            .map_err(|e: sled::transaction::TransactionError<()>| match e {
                sled::transaction::TransactionError::Storage(s) => StorageError::Sled(s),
                sled::transaction::TransactionError::Abort(()) => {
                    StorageError::Corrupt("log append aborted".into())
                }
            })
    }

    pub fn put_session_counters(&self, id: u64, c: &SessionCounters) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::session_counters(id), c)?;
        self.apply(w.0)
    }

    /// The session's chunks in arrival order with their sequence numbers, decoded lazily.
    pub fn log_chunks(
        &self,
        session: u64,
    ) -> impl Iterator<Item = Result<(u64, LogChunk)>> + use<> {
        self.inner
            .logs
            .scan_prefix(keys::log_prefix(session))
            .map(|kv| {
                let (k, v) = kv?;
                let seq = keys::trailing_id(&k).unwrap_or(0);
                Ok((seq, codec::decode::<LogChunk>(&v)?))
            })
    }

    /// The session's chunks from the newest back, with their sequence numbers.
    pub fn log_chunks_rev(
        &self,
        session: u64,
    ) -> impl Iterator<Item = Result<(u64, LogChunk)>> + use<> {
        self.inner
            .logs
            .scan_prefix(keys::log_prefix(session))
            .rev()
            .map(|kv| {
                let (k, v) = kv?;
                let seq = keys::trailing_id(&k).unwrap_or(0);
                Ok((seq, codec::decode::<LogChunk>(&v)?))
            })
    }

    pub fn log_chunk(&self, session: u64, seq: u64) -> Result<Option<LogChunk>> {
        match self.inner.logs.get(keys::log_chunk(session, seq))? {
            Some(v) => codec::decode(&v).map(Some),
            None => Ok(None),
        }
    }

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
    pub fn put_artifact(&self, a: &Artifact, counters: &SessionCounters) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::artifact(a.session_id, &a.path), a)?;
        w.put(keys::session_counters(a.session_id), counters)?;
        self.apply(w.0)
    }

    /// Removes the session record, its counters, every log chunk and every artifact record in
    /// one transaction, so a crash leaves the session either whole or gone. Returns the blob
    /// keys, for the caller to delete afterwards.
    pub fn delete_session(&self, s: &Session) -> Result<Vec<String>> {
        let artifacts = self.artifacts(s.id)?;
        let artifact_keys: Vec<Vec<u8>> = artifacts
            .iter()
            .map(|a| keys::artifact(s.id, &a.path))
            .collect();
        let chunk_keys: Vec<sled::IVec> = self
            .inner
            .logs
            .scan_prefix(keys::log_prefix(s.id))
            .keys()
            .collect::<std::result::Result<_, _>>()?;
        let rec = keys::session(s.project_id, s.id);
        let counters = keys::session_counters(s.id);
        let owner = keys::session_project(s.id);
        (&self.inner.logs, &self.inner.records)
            .transaction(|(logs, records)| {
                for k in &chunk_keys {
                    logs.remove(k)?;
                }
                records.remove(rec.as_slice())?;
                records.remove(counters.as_slice())?;
                records.remove(owner.as_slice())?;
                for k in &artifact_keys {
                    records.remove(k.as_slice())?;
                }
                Ok(())
            })
            .map_err(|e: sled::transaction::TransactionError<()>| match e {
                sled::transaction::TransactionError::Storage(s) => StorageError::Sled(s),
                sled::transaction::TransactionError::Abort(()) => {
                    StorageError::Corrupt("session delete aborted".into())
                }
            })?;
        Ok(artifacts.into_iter().map(|a| a.blob_key).collect())
    }
}
