//! Sessions, their counters and their log chunks.
//!
//! A session's record and its index live in `records`; its log chunks in the `logs` tree, one
//! key per appended batch (`v1/l/{session}/{chunk}`), so a million lines are a thousand keys,
//! not a million. Appending a chunk and advancing the counters is one transaction over both
//! trees, so a crash never leaves counters that disagree with the chunks.

use crate::engine::{Bytes, Iter, TxError, TxOutcome};
use crate::keys::ord;
use crate::lists::{Entry, ListId, Listed, Query};
use crate::{
    Artifact, LogChunk, Result, Session, SessionCounters, SessionStatus, StorageError, Store,
    Writes, codec, keys,
};

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
            filter: crate::text_filter::build(chunk),
        })
    }

    pub(crate) fn summary_bytes(&self) -> &[u8] {
        &self.summary
    }

    pub(crate) fn filter_bytes(&self) -> Option<&[u8]> {
        self.filter.as_deref()
    }
}

/// Where a chunk's bytes are.
enum Place {
    Local(Bytes),
    /// Its encoded [`crate::segments::ChunkLocation`].
    Remote(Bytes),
}

/// A chunk's stored bytes, however they were read.
enum ChunkBytes {
    Local(Bytes),
    Remote(bytes::Bytes),
}

impl std::ops::Deref for ChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ChunkBytes::Local(v) => v,
            ChunkBytes::Remote(b) => b,
        }
    }
}

type KvIter = Box<dyn Iterator<Item = Result<(Bytes, Bytes)>> + Send>;

/// A session's local chunks and sealed chunk locations merged in sequence order.
struct Places {
    local: KvIter,
    remote: KvIter,
    next_local: Option<(u64, Bytes)>,
    next_remote: Option<(u64, Bytes)>,
    rev: bool,
}

fn next_of(it: &mut KvIter) -> Result<Option<(u64, Bytes)>> {
    for kv in it.by_ref() {
        let (k, v) = kv?;
        if let Some(seq) = keys::trailing_id(&k) {
            return Ok(Some((seq, v)));
        }
    }
    Ok(None)
}

impl Iterator for Places {
    type Item = Result<(u64, Place)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_local.is_none() {
            match next_of(&mut self.local) {
                Ok(v) => self.next_local = v,
                Err(e) => return Some(Err(e)),
            }
        }
        if self.next_remote.is_none() {
            match next_of(&mut self.remote) {
                Ok(v) => self.next_remote = v,
                Err(e) => return Some(Err(e)),
            }
        }
        let take_local = match (&self.next_local, &self.next_remote) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((l, _)), Some((r, _))) => (l < r) != self.rev,
        };
        if take_local {
            self.next_local
                .take()
                .map(|(seq, v)| Ok((seq, Place::Local(v))))
        } else {
            self.next_remote
                .take()
                .map(|(seq, v)| Ok((seq, Place::Remote(v))))
        }
    }
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

    pub fn put_session_counters(&self, id: u64, c: &SessionCounters) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::session_counters(id), c)?;
        self.apply(w)
    }

    /// Every chunk of the session with where it is (its local bytes, or its location in a
    /// segment), in sequence order (`rev`: newest first), read lazily.
    fn places(&self, session: u64, rev: bool) -> Places {
        let local = self.inner.logs.scan_prefix(keys::log_prefix(session));
        let remote = self
            .inner
            .logs
            .scan_prefix(keys::log_location_prefix(session));
        let (local, remote): (Iter, Iter) = (local, remote);
        if rev {
            Places {
                local: Box::new(local.rev()),
                remote: Box::new(remote.rev()),
                next_local: None,
                next_remote: None,
                rev,
            }
        } else {
            Places {
                local: Box::new(local),
                remote: Box::new(remote),
                next_local: None,
                next_remote: None,
                rev,
            }
        }
    }

    /// A chunk's stored bytes, local or fetched from its segment.
    fn load(&self, place: &Place) -> Result<ChunkBytes> {
        match place {
            Place::Local(v) => Ok(ChunkBytes::Local(v.clone())),
            Place::Remote(v) => {
                let loc: crate::segments::ChunkLocation = codec::decode(v)?;
                let segs = self.inner.segments.get().ok_or_else(|| {
                    StorageError::Config("sealed log chunks need the blob store attached".into())
                })?;
                Ok(ChunkBytes::Remote(segs.fetch(&loc)?))
            }
        }
    }

    /// Several chunks' stored bytes, in order; the sealed ones not cached fetched together.
    fn load_many(&self, places: &[(u64, Place)]) -> Result<Vec<ChunkBytes>> {
        let mut locs = Vec::new();
        for (_, p) in places {
            if let Place::Remote(v) = p {
                locs.push(codec::decode::<crate::segments::ChunkLocation>(v)?);
            }
        }
        let mut fetched = match (locs.is_empty(), self.inner.segments.get()) {
            (true, _) => Vec::new(),
            (false, Some(segs)) => segs.fetch_many(&locs)?,
            (false, None) => {
                return Err(StorageError::Config(
                    "sealed log chunks need the blob store attached".into(),
                ));
            }
        }
        .into_iter();
        places
            .iter()
            .map(|(_, p)| match p {
                Place::Local(v) => Ok(ChunkBytes::Local(v.clone())),
                Place::Remote(_) => fetched
                    .next()
                    .map(ChunkBytes::Remote)
                    .ok_or_else(|| StorageError::Corrupt("a sealed chunk went missing".into())),
            })
            .collect()
    }

    /// Calls `visit` with chunks `seqs` (ascending) that exist, read in place, the sealed
    /// ones fetched `READ_AHEAD` at a time.
    pub fn visit_log_chunks_by_seq(
        &self,
        session: u64,
        seqs: &[u64],
        mut visit: impl FnMut(u64, &crate::LogChunkView<'_>),
    ) -> Result<()> {
        for window in seqs.chunks(crate::segments::READ_AHEAD) {
            let mut places = Vec::with_capacity(window.len());
            for &seq in window {
                if let Some(p) = self.place(session, seq)? {
                    places.push((seq, p));
                }
            }
            for ((seq, _), bytes) in places.iter().zip(self.load_many(&places)?) {
                visit(*seq, &codec::decode_borrowed(&bytes)?);
            }
        }
        Ok(())
    }

    /// Chunk `seq`'s place, read by key.
    fn place(&self, session: u64, seq: u64) -> Result<Option<Place>> {
        if let Some(v) = self.inner.logs.get(keys::log_chunk(session, seq))? {
            return Ok(Some(Place::Local(v)));
        }
        Ok(self
            .inner
            .logs
            .get(keys::log_location(session, seq))?
            .map(Place::Remote))
    }

    /// The session's chunks in arrival order with their sequence numbers, decoded lazily.
    pub fn log_chunks(
        &self,
        session: u64,
    ) -> impl Iterator<Item = Result<(u64, LogChunk)>> + use<> {
        let store = self.clone();
        self.places(session, false).map(move |item| {
            let (seq, place) = item?;
            Ok((seq, codec::decode::<LogChunk>(&store.load(&place)?)?))
        })
    }

    /// Calls `visit` with each chunk `wanted` names, read in place (no column copied), in one
    /// sequential pass over the session's chunks.
    pub fn visit_log_chunks(
        &self,
        session: u64,
        wanted: impl Fn(u64) -> bool,
        mut visit: impl FnMut(u64, &crate::LogChunkView<'_>),
    ) -> Result<()> {
        let mut window = Vec::with_capacity(crate::segments::READ_AHEAD);
        let mut flush = |window: &mut Vec<(u64, Place)>| -> Result<()> {
            for ((seq, _), bytes) in window.iter().zip(self.load_many(window)?) {
                visit(*seq, &codec::decode_borrowed(&bytes)?);
            }
            window.clear();
            Ok(())
        };
        for item in self.places(session, false) {
            let (seq, place) = item?;
            if wanted(seq) {
                window.push((seq, place));
                if window.len() == crate::segments::READ_AHEAD {
                    flush(&mut window)?;
                }
            }
        }
        flush(&mut window)
    }

    /// Every chunk in arrival order, read in place, while `visit` answers true: a reader with
    /// a budget stops the scan itself, not only the decoding.
    pub fn visit_log_chunks_while(
        &self,
        session: u64,
        mut visit: impl FnMut(&crate::LogChunkView<'_>) -> bool,
    ) -> Result<()> {
        for item in self.places(session, false) {
            let (_, place) = item?;
            let bytes = self.load(&place)?;
            if !visit(&codec::decode_borrowed(&bytes)?) {
                break;
            }
        }
        Ok(())
    }

    /// As [`Store::visit_log_chunks`] for one chunk, read by its key; false if it is gone.
    pub fn visit_log_chunk(
        &self,
        session: u64,
        seq: u64,
        visit: impl FnOnce(&crate::LogChunkView<'_>),
    ) -> Result<bool> {
        match self.place(session, seq)? {
            Some(place) => {
                let bytes = self.load(&place)?;
                visit(&codec::decode_borrowed(&bytes)?);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Every chunk's (seq, min_ts, max_ts), in arrival order, read without decoding the
    /// entries (nor fetching a sealed chunk: its location holds its time range): what a
    /// time-ordered merge needs to know which chunks to open next.
    pub fn log_chunk_heads(&self, session: u64) -> Result<Vec<(u64, i64, i64)>> {
        let mut out = Vec::new();
        for item in self.places(session, false) {
            let (seq, place) = item?;
            let (min, max): (i64, i64) = match &place {
                Place::Local(v) => codec::decode_head(v)?,
                Place::Remote(v) => {
                    let loc: crate::segments::ChunkLocation = codec::decode(v)?;
                    (loc.min_ts, loc.max_ts)
                }
            };
            out.push((seq, min, max));
        }
        Ok(out)
    }

    /// The session's chunks from the newest back, with their sequence numbers.
    pub fn log_chunks_rev(
        &self,
        session: u64,
    ) -> impl Iterator<Item = Result<(u64, LogChunk)>> + use<> {
        let store = self.clone();
        self.places(session, true).map(move |item| {
            let (seq, place) = item?;
            Ok((seq, codec::decode::<LogChunk>(&store.load(&place)?)?))
        })
    }

    /// Every chunk's summary with its sequence number, in arrival order. A store written
    /// before summaries existed has none for its older chunks: the caller compares the
    /// entries counted here with the session's `log_count` and falls back to the chunks.
    pub fn log_summaries(&self, session: u64) -> Result<Vec<(u64, crate::LogSummary)>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .logs
            .scan_prefix(keys::log_summary_prefix(session))
        {
            let (k, v) = kv?;
            let seq = keys::trailing_id(&k).unwrap_or(0);
            out.push((seq, codec::decode(&v)?));
        }
        Ok(out)
    }

    /// The chunks whose text filters show they cannot hold `needle` (lower-cased as the
    /// search compares) in any message, in ascending order. Chunks without a filter (written
    /// before filters existed, or too varied for one) are never in it.
    pub fn log_chunks_without(&self, session: u64, needle: &str) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        if needle.len() < 3 {
            return Ok(out);
        }
        for kv in self
            .inner
            .logs
            .scan_prefix(keys::log_text_filter_prefix(session))
        {
            let (k, v) = kv?;
            if let Some(seq) = keys::trailing_id(&k)
                && !crate::text_filter::may_contain(&v, needle.as_bytes())
            {
                out.push(seq);
            }
        }
        Ok(out)
    }

    /// As [`Store::log_summaries`], each summary read in place and handed to `visit`.
    pub fn visit_log_summaries(
        &self,
        session: u64,
        mut visit: impl FnMut(u64, &crate::LogSummaryView<'_>),
    ) -> Result<()> {
        for kv in self
            .inner
            .logs
            .scan_prefix(keys::log_summary_prefix(session))
        {
            let (k, v) = kv?;
            if let Some(seq) = keys::trailing_id(&k) {
                visit(seq, &codec::decode_borrowed(&v)?);
            }
        }
        Ok(())
    }

    /// Whether chunk `seq` may hold `needle` by its text filter (one read by key; a chunk
    /// without a filter may hold anything).
    pub fn log_chunk_may_hold(&self, session: u64, seq: u64, needle: &str) -> Result<bool> {
        Ok(
            match self.inner.logs.get(keys::log_text_filter(session, seq))? {
                Some(v) => crate::text_filter::may_contain(&v, needle.as_bytes()),
                None => true,
            },
        )
    }

    pub fn log_chunk(&self, session: u64, seq: u64) -> Result<Option<LogChunk>> {
        match self.place(session, seq)? {
            Some(place) => codec::decode(&self.load(&place)?).map(Some),
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

    /// Removes the session record, its counters, every log chunk and every artifact record in
    /// one transaction, so a crash leaves the session either whole or gone. Returns the blob
    /// keys, for the caller to delete afterwards.
    pub fn delete_session(&self, s: &Session) -> Result<Vec<String>> {
        // A seal that commits between the listing of the keys and their removal changes the
        // seal cursor: the removal is refused and the keys listed again (no reader pin, so a
        // delete never waits behind a seal's wait for readers).
        for _ in 0..100 {
            if let Some(blobs) = self.try_delete_session(s)? {
                return Ok(blobs);
            }
        }
        Err(StorageError::Corrupt(
            "session delete kept meeting seals".into(),
        ))
    }

    /// One attempt of [`Store::delete_session`]; `None` if a seal committed meanwhile.
    fn try_delete_session(&self, s: &Session) -> Result<Option<Vec<String>>> {
        let cursor_key = keys::log_seal_cursor(s.id);
        let cursor_before = self.inner.logs.get(&cursor_key)?;
        let artifacts = self.artifacts(s.id)?;
        let artifact_keys: Vec<Vec<u8>> = artifacts
            .iter()
            .map(|a| keys::artifact(s.id, &a.path))
            .collect();
        let chunk_keys: Vec<Bytes> = self
            .inner
            .logs
            .scan_prefix(keys::log_prefix(s.id))
            .keys()
            .chain(
                self.inner
                    .logs
                    .scan_prefix(keys::log_summary_prefix(s.id))
                    .keys(),
            )
            .chain(
                self.inner
                    .logs
                    .scan_prefix(keys::log_text_filter_prefix(s.id))
                    .keys(),
            )
            .collect::<std::result::Result<_, _>>()?;
        // Sealed chunks: their locations go, and their segments onto the to-delete list.
        let mut location_keys = Vec::new();
        let mut segments = std::collections::BTreeSet::new();
        for kv in self.inner.logs.scan_prefix(keys::log_location_prefix(s.id)) {
            let (k, v) = kv?;
            let loc: crate::segments::ChunkLocation = codec::decode(&v)?;
            segments.insert(loc.segment);
            location_keys.push(k);
        }
        let doomed: Vec<Vec<u8>> = segments.iter().map(|g| keys::doomed_segment(g)).collect();
        let seal_keys = [keys::log_seal_cursor(s.id), keys::log_pending(s.id)];
        let rec = keys::session(s.project_id, s.id);
        let counters = keys::session_counters(s.id);
        let owner = keys::session_project(s.id);
        let batch_seq = keys::session_batch_seq(s.id);
        let gate = self.inner.gate.shared();
        let _g = self.list_guard();
        let relist = crate::lists::plan(
            self,
            &[crate::lists::Relist {
                key: rec.clone(),
                new: None,
                old: crate::lists::old_entries::<Session>,
            }],
        )?;
        let done = self
            .inner
            .logs
            .transaction_held(&self.inner.records, &gate, |logs, records| {
                if logs.get(cursor_key.as_slice())? != cursor_before {
                    return Err(TxError::Abort(true));
                }
                for (k, v) in &relist {
                    match v {
                        Some(v) => records.insert(k.as_slice(), v.as_slice())?,
                        None => records.remove(k.as_slice())?,
                    };
                }
                for k in &chunk_keys {
                    logs.remove(k)?;
                }
                for k in &seal_keys {
                    logs.remove(k.as_slice())?;
                }
                for k in &location_keys {
                    logs.remove(k)?;
                }
                for k in &doomed {
                    logs.insert(k.as_slice(), &[][..])?;
                }
                records.remove(rec.as_slice())?;
                records.remove(counters.as_slice())?;
                records.remove(batch_seq.as_slice())?;
                records.remove(owner.as_slice())?;
                for k in &artifact_keys {
                    records.remove(k.as_slice())?;
                }
                Ok(())
            });
        match done {
            Ok(()) => Ok(Some(
                artifacts
                    .into_iter()
                    .map(|a| a.blob_key)
                    .chain(segments)
                    .collect(),
            )),
            // A seal committed since the keys were listed.
            Err(TxOutcome::Abort(true)) => Ok(None),
            Err(TxOutcome::Abort(false)) => {
                Err(StorageError::Corrupt("session delete aborted".into()))
            }
            Err(TxOutcome::Storage(e)) => Err(e),
        }
    }

    /// Up to `limit` segments of deleted sessions still to be deleted from the blob store.
    pub fn doomed_segments(&self, limit: usize) -> Result<Vec<String>> {
        let prefix = keys::doomed_segment_prefix();
        let mut out = Vec::new();
        for k in self.inner.logs.scan_prefix(&prefix).keys().take(limit) {
            let k = k?;
            out.push(String::from_utf8_lossy(&k[prefix.len()..]).into_owned());
        }
        Ok(out)
    }

    /// Deletes `segment` from the blob store, then from the to-delete list.
    pub fn delete_doomed_segment(&self, segment: &str) -> Result<()> {
        if let Some(segs) = self.inner.segments.get() {
            segs.delete(segment)?;
        }
        // Not flushed: if it comes back after a crash, the delete is repeated.
        self.inner.logs.remove(keys::doomed_segment(segment))?;
        Ok(())
    }

    /// The segments `session`'s chunk locations point at. A segment of the session that is
    /// neither here nor on the to-delete list ([`Store::segment_doomed`]) is an orphan (a seal
    /// that crashed before its transaction, or whose transaction failed).
    pub fn segments_referenced(&self, session: u64) -> Result<std::collections::HashSet<String>> {
        let mut out = std::collections::HashSet::new();
        for kv in self
            .inner
            .logs
            .scan_prefix(keys::log_location_prefix(session))
        {
            let (_, v) = kv?;
            out.insert(codec::decode::<crate::segments::ChunkLocation>(&v)?.segment);
        }
        Ok(out)
    }

    /// Whether `segment` is on the to-delete list.
    pub fn segment_doomed(&self, segment: &str) -> Result<bool> {
        self.inner.logs.contains_key(keys::doomed_segment(segment))
    }
}
