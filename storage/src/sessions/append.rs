//! Appending a batch: one chunk and the counters that account for it in one transaction, the
//! batch's sequence number checked (a duplicate batch is a conflict) with the write.

use super::*;

/// What is stored beside a log chunk (its summary, encoded, and its text filter), built
/// apart from the write: for a large batch it is a pass over all its text.
#[derive(Debug, Clone)]
pub struct ChunkIndex {
    summary: Vec<u8>,
    filter: Option<Vec<u8>>,
}

impl ChunkIndex {
    pub fn of(chunk: &LogChunk) -> Result<Self> {
        Ok(Self {
            summary: codec::encode(&crate::LogSummary::of(chunk))?,
            filter: crate::sessions::text_filter::build(chunk),
        })
    }

    pub(crate) fn summary_bytes(&self) -> &[u8] {
        &self.summary
    }

    pub(crate) fn filter_bytes(&self) -> Option<&[u8]> {
        self.filter.as_deref()
    }
}

impl Store {
    /// Stores one chunk and the counters that account for it, atomically, with its index.
    pub fn append_chunk(
        &self,
        session: u64,
        chunk: &LogChunk,
        counters: &SessionCounters,
        seq: u64,
    ) -> Result<()> {
        self.append_checked(
            session,
            chunk,
            &ChunkIndex::of(chunk)?,
            None,
            counters,
            seq,
            None,
        )
    }

    /// As [`Store::append_chunk`], with the index built beforehand ([`ChunkIndex::of`]), so
    /// that the caller can build it off the thread that writes; and only while the session
    /// (of `project`) is still active and its stored counters are still `prev`, both decided
    /// inside the write's transaction. Otherwise [`StorageError::Conflict`]: `session not
    /// active` (another server completed or deleted it), or `session counters` (another
    /// server appended to it or stored an artifact in it meanwhile, and the caller reads the
    /// counters again).
    /// `counters`: as read (`prev`) and after this batch.
    pub fn append_indexed_chunk(
        &self,
        project: u64,
        session: u64,
        chunk: &LogChunk,
        index: &ChunkIndex,
        (prev, counters): (&SessionCounters, &SessionCounters),
        seq: u64,
    ) -> Result<()> {
        self.append_checked(
            session,
            chunk,
            index,
            Some((project, prev)),
            counters,
            seq,
            None,
        )
    }

    /// As [`Store::append_indexed_chunk`], for a batch its sender numbered `batch` (each
    /// sender's numbers rising within the session): stored only when `batch` is above the
    /// last the session stored, else [`StorageError::Conflict`]`(`[`DUPLICATE_BATCH`]`)`
    /// and nothing is written, decided inside the write, so a batch sent again after a lost
    /// answer is never stored twice.
    #[allow(clippy::too_many_arguments)]
    pub fn append_batch(
        &self,
        project: u64,
        session: u64,
        chunk: &LogChunk,
        index: &ChunkIndex,
        (prev, counters): (&SessionCounters, &SessionCounters),
        seq: u64,
        batch: Option<u64>,
    ) -> Result<()> {
        self.append_checked(
            session,
            chunk,
            index,
            Some((project, prev)),
            counters,
            seq,
            batch,
        )
    }

    /// The last batch number session `id` stored (0 before any numbered batch).
    pub fn session_batch_seq(&self, id: u64) -> Result<u64> {
        Ok(self
            .inner
            .records
            .get(keys::session_batch_seq(id))?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    #[allow(clippy::too_many_arguments)]
    fn append_checked(
        &self,
        session: u64,
        chunk: &LogChunk,
        index: &ChunkIndex,
        check: Option<(u64, &SessionCounters)>,
        counters: &SessionCounters,
        seq: u64,
        batch: Option<u64>,
    ) -> Result<()> {
        let batch_key = keys::session_batch_seq(session);
        let chunk_bytes = codec::encode(chunk)?;
        let summary_bytes = &index.summary;
        let filter = &index.filter;
        let filter_key = keys::log_text_filter(session, seq);
        let counter_bytes = codec::encode(counters)?;
        let chunk_key = keys::log_chunk(session, seq);
        let summary_key = keys::log_summary(session, seq);
        let counters_key = keys::session_counters(session);
        let pending_key = keys::log_pending(session);
        let now = codec::encode(&crate::clock::now_ms())?;
        let gate = self.inner.gate.shared();
        self.inner
            .logs
            .transaction_held(&self.inner.records, &gate, |logs, records| {
                if let Some((project, prev)) = check {
                    let read = records
                        .get_many(&[counters_key.clone(), keys::session(project, session)])?;
                    let active = read[1]
                        .as_ref()
                        .and_then(|v| codec::decode::<crate::Session>(v).ok())
                        .is_some_and(|s| s.status == SessionStatus::Active);
                    if !active {
                        return Err(TxError::Abort(StorageError::Conflict(
                            SESSION_NOT_ACTIVE.into(),
                        )));
                    }
                    let stored = match &read[0] {
                        Some(v) => codec::decode::<SessionCounters>(v).ok(),
                        None => Some(SessionCounters::default()),
                    };
                    if stored.as_ref() != Some(prev) {
                        return Err(TxError::Abort(StorageError::Conflict(
                            "session counters".into(),
                        )));
                    }
                }
                if let Some(b) = batch {
                    let stored = records
                        .get(batch_key.as_slice())?
                        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
                        .map_or(0, u64::from_be_bytes);
                    if b <= stored {
                        return Err(TxError::Abort(StorageError::Conflict(
                            DUPLICATE_BATCH.into(),
                        )));
                    }
                    records.insert(batch_key.as_slice(), &b.to_be_bytes()[..])?;
                }
                // The first unsealed chunk marks the session as owed a seal.
                if logs.get(pending_key.as_slice())?.is_none() {
                    logs.insert(pending_key.as_slice(), now.as_slice())?;
                }
                logs.insert(chunk_key.as_slice(), chunk_bytes.as_slice())?;
                logs.insert(summary_key.as_slice(), summary_bytes.as_slice())?;
                if let Some(f) = &filter {
                    logs.insert(filter_key.as_slice(), f.as_slice())?;
                }
                records.insert(counters_key.as_slice(), counter_bytes.as_slice())?;
                Ok(())
            })
            .map_err(|e: TxOutcome<StorageError>| match e {
                TxOutcome::Storage(s) | TxOutcome::Abort(s) => s,
            })
    }
}
