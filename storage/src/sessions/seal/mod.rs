//! Sealing a session's log chunks: small appended batches merged into chunks of a target
//! size and, once a blob store is attached, moved into a segment there.
//!
//! Every appended batch is one chunk with its own summary and text filter, and a query visits
//! each: a robot that flushes ten lines a second makes a session of a hundred thousand tiny
//! chunks. Sealing takes a session's unsealed chunks (those from its seal cursor on, in
//! arrival order) and merges consecutive ones into chunks of at most `chunk_lines` lines and
//! `chunk_bytes` bytes, each with a rebuilt summary and filter, so a query's cost follows the
//! session's lines rather than its batch count.
//!
//! A merged chunk is stored under the sequence number of its first batch, and holds the
//! batches' entries in arrival order, so every ordering a query uses (timestamp, then chunk,
//! then index) is unchanged. With a blob store attached ([`Store::attach_segments`]), the
//! seal's chunks (merged or not) are packed into one segment ([`crate::segments`]), written
//! create-only, and the one transaction that follows records their locations and drops their
//! local bytes; local disk keeps the summaries, filters and locations. Without one, merged
//! chunks stay in sled. Either way the rewrite (new chunks or locations, their indexes, the
//! removal of the old ones, the new cursor) is one transaction, refused if the session was
//! deleted meanwhile, or if another server sealed from the same cursor first (its segment is
//! then deleted).
//!
//! Readers that look at a session's chunks in more than one read (a query reads summaries,
//! then chunks by sequence number; an export scans) hold a [`LogPin`] for the session. A seal
//! reads, merges and writes its segment without stopping them; only its transaction waits
//! until no pin is held (new pins wait for it meanwhile), at most `commit_wait`, past which
//! the seal gives up and leaves the chunks as they were. On a database several servers share,
//! a pin also holds the session's advisory lock shared, and a seal's transaction takes it
//! exclusive (trying for `commit_wait` too), so readers on one server hold off the seals of
//! the others.
//!
//! Which sessions have unsealed chunks is kept in the `logs` tree (`v1/lp/{session}`, the
//! time its oldest unsealed batch arrived), written by the append that finds none, and removed
//! by the seal that leaves none, so a pass over sessions owed a seal reads only those.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::engine::pg::Advisory;
use crate::engine::{TxError, TxOutcome};
use crate::segments::{ChunkLocation, segment_key};
use crate::sessions::ChunkIndex;
use crate::{Columns, LogChunk, Result, SessionCounters, StorageError, Store, codec, keys};

/// How chunks are merged when sealed.
#[derive(Debug, Clone, Copy)]
pub struct SealPlan {
    /// A merged chunk holds at most this many lines ...
    pub chunk_lines: usize,
    /// ... and about this many bytes (encoded).
    pub chunk_bytes: usize,
    /// Bytes of unsealed chunks one seal reads at most (one segment); a session with more is
    /// sealed again.
    pub max_source_bytes: usize,
    /// How long a seal's transaction waits for the session's readers to finish.
    pub commit_wait: Duration,
}

/// What one seal did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sealed {
    /// Unsealed chunks it took.
    pub sources: usize,
    /// Chunks they became (a chunk that merged with nothing counts as one).
    pub chunks: usize,
    /// Lines in them.
    pub lines: u64,
    /// Unsealed chunks remain (past `max_source_bytes`, or appended meanwhile).
    pub more: bool,
    /// The chunks went to a segment in the blob store.
    pub offloaded: bool,
}

/// Bytes of a session's logs on local disk ([`Store::log_footprint`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogFootprint {
    /// Chunks not sealed yet (or kept local, without a blob store).
    pub open_chunks: u64,
    pub summaries: u64,
    pub filters: u64,
    /// Where sealed chunks are.
    pub locations: u64,
}

/// Why a seal did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealSkipped {
    /// Another seal of the session runs, or a reader held it past `commit_wait`; try later.
    Busy,
    /// The session is gone.
    Gone,
}

#[derive(Default)]
struct PinState {
    readers: u32,
    /// A seal of the session is under way (one at a time).
    sealing: bool,
    /// Its transaction is waiting or running: new readers wait.
    committing: bool,
}

impl PinState {
    fn idle(&self) -> bool {
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
const ACROSS_WAIT: Duration = Duration::from_secs(30);

/// A seal's exclusive hold of a session's advisory lock against other servers' readers;
/// given back when dropped. Empty on a store of one server.
struct SealAcross(Option<(crate::engine::pg::Pg, i64)>);

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
    fn seal_across(&self, session: u64, wait: Duration) -> Result<Option<SealAcross>> {
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
struct SealHold<'a> {
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
struct CommitHold<'a> {
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
    fn try_seal(&self, session: u64) -> Option<SealHold<'_>> {
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
    fn commit(&self, session: u64, wait: Duration) -> Option<CommitHold<'_>> {
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

/// One chunk a seal produces: its first source's sequence number, the sources it takes, its
/// lines and time range, and either its merged entries or (while it merged with nothing) the
/// first source's stored bytes.
struct Out {
    first: u64,
    sources: Vec<u64>,
    chunk: Option<LogChunk>,
    lines: usize,
    min_ts: i64,
    max_ts: i64,
    bytes: usize,
    raw: Option<crate::engine::Bytes>,
    /// Large enough alone: moved as it is, never merged.
    big: bool,
}

/// Appends `src`'s entries to `dst`, mapping its modules onto `dst`'s.
fn extend(dst: &mut LogChunk, src: &impl Columns) -> Option<()> {
    let mut map: HashMap<u32, u32> = HashMap::new();
    for i in 0..src.len() {
        let m = src.module_at(i)?;
        let module = match map.get(&m) {
            Some(&d) => d,
            None => {
                let name = src.module_name(m)?;
                let d = match dst.modules.iter().position(|x| x == name) {
                    Some(d) => u32::try_from(d).ok()?,
                    None => {
                        dst.modules.push(name.to_string());
                        u32::try_from(dst.modules.len() - 1).ok()?
                    }
                };
                map.insert(m, d);
                d
            }
        };
        dst.push(
            src.ts_at(i)?,
            src.level_at(i)?,
            module,
            src.message(i)?,
            src.metadata(i)?,
        )?;
    }
    Some(())
}

/// What a seal writes for one produced chunk.
struct Write {
    first: u64,
    /// Sources whose keys go (all but `first` when kept local; all when offloaded).
    sources: Vec<u64>,
    /// New stored bytes (a merge kept local).
    bytes: Option<Vec<u8>>,
    /// A rebuilt summary and filter (a merge, or a chunk that had none).
    index: Option<ChunkIndex>,
    location: Option<ChunkLocation>,
}

impl Store {
    /// Attaches the blob store sealed chunks go to, the runtime its calls wait on (readers run
    /// on its blocking threads) and the read cache's size. Without it, seals keep chunks local.
    pub fn attach_segments(
        &self,
        blobs: crate::BlobStore,
        rt: tokio::runtime::Handle,
        cache_bytes: usize,
    ) {
        let _ = self
            .inner
            .segments
            .set(crate::segments::Segments::new(blobs, rt, cache_bytes));
    }

    /// What reading and writing segments has cost since start-up.
    pub fn segment_stats(&self) -> crate::segments::SegmentStats {
        self.inner
            .segments
            .get()
            .map(|s| s.stats())
            .unwrap_or_default()
    }

    /// Empties the read cache of sealed chunks (the benches' cold figures).
    pub fn clear_segment_cache(&self) {
        if let Some(s) = self.inner.segments.get() {
            s.clear_cache();
        }
    }

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

    /// Sessions owed a seal whose oldest unsealed batch arrived at or before `before` (Unix
    /// ms), at most `limit` of them, in id order.
    pub fn sessions_owed_seal(&self, before: i64, limit: usize) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for kv in self.inner.logs.scan_prefix(keys::log_pending_prefix()) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            let since: i64 = codec::decode(&v)?;
            if since <= before
                && let Some(id) = keys::trailing_id(&k)
            {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// What a session's logs hold in the `logs` tree (keys and values), by kind: the bytes a
    /// figure of local disk per line counts (sled's own overhead aside).
    pub fn log_footprint(&self, session: u64) -> Result<LogFootprint> {
        let sum = |prefix: Vec<u8>| -> Result<u64> {
            let mut n = 0u64;
            for kv in self.inner.logs.scan_prefix(prefix) {
                let (k, v) = kv?;
                n += (k.len() + v.len()) as u64;
            }
            Ok(n)
        };
        Ok(LogFootprint {
            open_chunks: sum(keys::log_prefix(session))?,
            summaries: sum(keys::log_summary_prefix(session))?,
            filters: sum(keys::log_text_filter_prefix(session))?,
            locations: sum(keys::log_location_prefix(session))?,
        })
    }

    /// The first chunk sequence number not sealed yet.
    pub fn log_seal_cursor(&self, session: u64) -> Result<u64> {
        Ok(self
            .inner
            .logs
            .get(keys::log_seal_cursor(session))?
            .map(|v| codec::decode::<u64>(&v))
            .transpose()?
            .unwrap_or(0))
    }

    /// Seals `session`'s unsealed chunks (see the module header).
    pub fn seal_logs(
        &self,
        session: u64,
        plan: SealPlan,
    ) -> Result<std::result::Result<Sealed, SealSkipped>> {
        let Some(_seal) = self.inner.log_pins.try_seal(session) else {
            return Ok(Err(SealSkipped::Busy));
        };
        let cursor = self.log_seal_cursor(session)?;
        let mut outs: Vec<Out> = Vec::new();
        let (mut read, mut last, mut lines, mut sources) = (0usize, None, 0u64, 0usize);
        let from = keys::log_chunk(session, cursor);
        let prefix = keys::log_prefix(session);
        for kv in self
            .inner
            .logs
            .range(from.as_slice()..)
            .take_while(|kv| kv.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix)))
        {
            let (k, v) = kv?;
            let Some(seq) = keys::trailing_id(&k) else {
                continue;
            };
            if read > 0 && read + v.len() > plan.max_source_bytes {
                break;
            }
            read += v.len();
            let unreadable =
                || StorageError::Corrupt(format!("log chunk {session}/{seq} unreadable"));
            let view: crate::LogChunkView<'_> = codec::decode_borrowed(&v)?;
            let n = view.len();
            sources += 1;
            lines += n as u64;
            last = Some(seq);
            // A chunk of an eighth of the target or more gains little from a merge: it is
            // moved as it is, never decoded.
            let big = n.saturating_mul(8) >= plan.chunk_lines
                || v.len().saturating_mul(8) >= plan.chunk_bytes;
            let fits = !big
                && outs.last().is_some_and(|o| {
                    !o.big
                        && o.lines + n <= plan.chunk_lines
                        && o.bytes + v.len() <= plan.chunk_bytes
                });
            match outs.last_mut() {
                Some(o) if fits => {
                    let chunk = match (o.chunk.take(), o.raw.take()) {
                        (Some(c), _) => c,
                        (None, Some(raw)) => codec::decode(&raw)?,
                        (None, None) => return Err(unreadable()),
                    };
                    let chunk = o.chunk.insert(chunk);
                    extend(chunk, &view).ok_or_else(unreadable)?;
                    o.lines += n;
                    o.min_ts = chunk.min_ts;
                    o.max_ts = chunk.max_ts;
                    o.bytes += v.len();
                    o.sources.push(seq);
                }
                _ => {
                    let (min_ts, max_ts) = (view.min_ts, view.max_ts);
                    outs.push(Out {
                        first: seq,
                        sources: vec![seq],
                        chunk: None,
                        lines: n,
                        min_ts,
                        max_ts,
                        bytes: v.len(),
                        raw: Some(v.clone()),
                        big,
                    })
                }
            }
        }
        let segments = self.inner.segments.get().filter(|_| !outs.is_empty());
        // Every produced chunk's stored bytes (a merge encoded anew) and index.
        let mut writes = Vec::with_capacity(outs.len());
        let mut packed: Vec<(u64, Vec<u8>)> = Vec::new();
        for o in &outs {
            let merged = o.sources.len() > 1;
            let has_summary = !merged
                && self
                    .inner
                    .logs
                    .contains_key(keys::log_summary(session, o.first))?;
            let index = match (&o.chunk, &o.raw) {
                (Some(c), _) => Some(ChunkIndex::of(c)?),
                (None, Some(raw)) if !has_summary => {
                    Some(ChunkIndex::of(&codec::decode::<LogChunk>(raw)?)?)
                }
                _ => None,
            };
            let bytes = match (&o.chunk, &o.raw) {
                (Some(c), _) => Some(codec::encode(c)?),
                (None, Some(raw)) if segments.is_some() => Some(raw.to_vec()),
                _ => None,
            };
            if segments.is_some() {
                packed.push((o.first, bytes.unwrap_or_default()));
                writes.push(Write {
                    first: o.first,
                    sources: o.sources.clone(),
                    bytes: None,
                    index,
                    location: None,
                });
            } else if merged || index.is_some() {
                writes.push(Write {
                    first: o.first,
                    sources: o.sources[1..].to_vec(),
                    bytes,
                    index,
                    location: None,
                });
            }
        }
        // The segment, written before any record points at it.
        let mut segment = None;
        if let (Some(segs), Some(first), Some(last)) = (segments, outs.first(), last) {
            let Some(project) = self.get_id(&keys::session_project(session))? else {
                return Ok(Err(SealSkipped::Gone));
            };
            let refs: Vec<(u64, &[u8])> = packed.iter().map(|(s, b)| (*s, b.as_slice())).collect();
            let (body, entries) = crate::segments::pack(&refs)?;
            let key = segment_key(project, session, first.first, last, crate::clock::now_ms());
            if !segs.put(&key, body)? {
                return Ok(Err(SealSkipped::Busy));
            }
            crate::failpoints::hit("seal:after-put");
            for ((w, o), (_, offset, len, crc)) in writes.iter_mut().zip(&outs).zip(entries) {
                w.location = Some(ChunkLocation {
                    segment: key.clone(),
                    offset,
                    len,
                    crc,
                    min_ts: o.min_ts,
                    max_ts: o.max_ts,
                });
            }
            segment = Some(key);
        }
        let encoded: Vec<Option<Vec<u8>>> = writes
            .iter()
            .map(|w| w.location.as_ref().map(codec::encode).transpose())
            .collect::<Result<_>>()?;
        let next = last.map_or(cursor, |l| l + 1);
        let counters_key = keys::session_counters(session);
        let cursor_key = keys::log_seal_cursor(session);
        let pending_key = keys::log_pending(session);
        let cursor_bytes = codec::encode(&next)?;
        let gone = |segment: &Option<String>| {
            if let (Some(key), Some(segs)) = (segment, self.inner.segments.get())
                && let Err(e) = segs.delete(key)
            {
                tracing::warn!(key, error = %e, "could not delete an unused log segment");
            }
        };
        let Some(_commit) = self.inner.log_pins.commit(session, plan.commit_wait) else {
            gone(&segment);
            return Ok(Err(SealSkipped::Busy));
        };
        // Other servers' readers of the session hold its advisory lock shared.
        let Some(_across) = self.seal_across(session, plan.commit_wait)? else {
            gone(&segment);
            return Ok(Err(SealSkipped::Busy));
        };
        let gate = self.inner.gate.shared();
        let more = self
            .inner
            .logs
            .transaction_held(&self.inner.records, &gate, |logs, records| {
                let Some(c) = records.get(counters_key.as_slice())? else {
                    return Err(TxError::Abort(()));
                };
                let counters: SessionCounters =
                    codec::decode(&c).map_err(|_| TxError::Abort(()))?;
                // Another server sealed from the same cursor meanwhile: its chunks are the
                // session's now, and this seal's are dropped.
                let stored_cursor = match logs.get(cursor_key.as_slice())? {
                    Some(v) => codec::decode::<u64>(&v).map_err(|_| TxError::Abort(()))?,
                    None => 0,
                };
                if stored_cursor != cursor {
                    return Err(TxError::Abort(()));
                }
                for (w, location) in writes.iter().zip(&encoded) {
                    for &s in &w.sources {
                        logs.remove(keys::log_chunk(session, s))?;
                        if s != w.first {
                            logs.remove(keys::log_summary(session, s))?;
                            logs.remove(keys::log_text_filter(session, s))?;
                        }
                    }
                    if let Some(bytes) = &w.bytes {
                        logs.insert(keys::log_chunk(session, w.first), bytes.as_slice())?;
                    }
                    if let Some(loc) = location {
                        logs.insert(keys::log_location(session, w.first), loc.as_slice())?;
                    }
                    if let Some(index) = &w.index {
                        logs.insert(keys::log_summary(session, w.first), index.summary_bytes())?;
                        match index.filter_bytes() {
                            Some(f) => logs.insert(keys::log_text_filter(session, w.first), f)?,
                            None => logs.remove(keys::log_text_filter(session, w.first))?,
                        };
                    }
                }
                logs.insert(cursor_key.as_slice(), cursor_bytes.as_slice())?;
                let more = counters.next_chunk > next;
                if !more {
                    logs.remove(pending_key.as_slice())?;
                }
                Ok(more)
            });
        if more.is_ok() && segment.is_some() {
            crate::failpoints::hit("seal:after-commit");
        }
        match more {
            Ok(more) => Ok(Ok(Sealed {
                sources,
                chunks: outs.len(),
                lines,
                more,
                offloaded: segment.is_some(),
            })),
            Err(TxOutcome::Abort(())) => {
                gone(&segment);
                Ok(Err(SealSkipped::Gone))
            }
            Err(TxOutcome::Storage(e)) => {
                // Whether it committed is unknown: the segment stays for the sweep to judge.
                Err(e)
            }
        }
    }
}

/// Seals on a temporary store: merged chunks keep every entry in arrival order with rebuilt
/// summaries and filters, a pinned session is not touched, a deleted one leaves no seal keys.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::testing::on_each_engine;
    use crate::{Session, SessionStatus};

    const PLAN: SealPlan = SealPlan {
        chunk_lines: 100,
        chunk_bytes: 1 << 20,
        max_source_bytes: 1 << 30,
        commit_wait: Duration::from_millis(50),
    };

    fn session(store: &Store, id: u64) -> Session {
        let s = Session {
            id,
            project_id: 7,
            device_id: 1,
            device_name: "d".into(),
            status: SessionStatus::Active,
            started_at: 1,
            ended_at: None,
            tags: vec![],
            package_id: None,
        };
        store.put_session(&s).unwrap();
        s
    }

    /// Appends `batches` batches of `n` lines, numbered in arrival order across batches.
    fn append(store: &Store, sid: u64, batches: u64, n: u64) {
        let mut counters = store.session_counters(sid).unwrap();
        for _ in 0..batches {
            let mut c = LogChunk::default();
            let mods = ["nav".to_string(), format!("m{}", counters.next_chunk % 3)];
            c.modules = mods.to_vec();
            for i in 0..n {
                let k = counters.log_count + i;
                c.push(
                    1000 - k as i64,
                    (k % 4) as u8,
                    (k % 2) as u32,
                    &format!("line {k:05}"),
                    b"{}",
                )
                .unwrap();
            }
            let seq = counters.next_chunk;
            counters.log_count += n;
            counters.next_chunk += 1;
            store.append_chunk(sid, &c, &counters, seq).unwrap();
        }
    }

    /// Every (message, module, level, ts) in storage order.
    fn lines(store: &Store, sid: u64) -> Vec<(String, String, u8, i64)> {
        let mut out = Vec::new();
        for item in store.log_chunks(sid) {
            let (_, c) = item.unwrap();
            for i in 0..c.len() {
                let m = c.module_name(c.module_at(i).unwrap()).unwrap().to_string();
                out.push((
                    c.message(i).unwrap().into(),
                    m,
                    c.level_at(i).unwrap(),
                    c.ts_at(i).unwrap(),
                ));
            }
        }
        out
    }

    fn sealing_merges_small_chunks_keeping_every_entry_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        session(&store, 3);
        append(&store, 3, 35, 10);
        let before = lines(&store, 3);
        assert_eq!(store.sessions_owed_seal(i64::MAX, 10).unwrap(), vec![3]);
        let done = store.seal_logs(3, PLAN).unwrap().unwrap();
        assert_eq!(
            done,
            Sealed {
                sources: 35,
                chunks: 4,
                lines: 350,
                more: false,
                offloaded: false,
            }
        );
        assert_eq!(lines(&store, 3), before);
        let summaries = store.log_summaries(3).unwrap();
        assert_eq!(
            summaries
                .iter()
                .map(|(seq, s)| (*seq, s.len()))
                .collect::<Vec<_>>(),
            vec![(0, 100), (10, 100), (20, 100), (30, 50)]
        );
        // The rebuilt filter rules out what the merged chunk lacks, and keeps what it holds.
        assert_eq!(
            store.log_chunks_without(3, "line 00349").unwrap(),
            vec![0, 10, 20]
        );
        assert!(store.log_chunk_may_hold(3, 10, "line 00150").unwrap());
        assert_eq!(store.log_seal_cursor(3).unwrap(), 35);
        assert!(store.sessions_owed_seal(i64::MAX, 10).unwrap().is_empty());
        // Later batches are sealed from the cursor on, never merged into sealed chunks.
        append(&store, 3, 3, 10);
        assert_eq!(store.sessions_owed_seal(i64::MAX, 10).unwrap(), vec![3]);
        let done = store.seal_logs(3, PLAN).unwrap().unwrap();
        assert_eq!((done.sources, done.chunks), (3, 1));
        assert_eq!(store.log_summaries(3).unwrap().len(), 5);
        assert_eq!(lines(&store, 3).len(), 380);
    }
    on_each_engine!(sealing_merges_small_chunks_keeping_every_entry_in_order);

    fn an_append_decided_on_stale_counters_or_after_completion_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        session(&store, 3);
        let stale = store.session_counters(3).unwrap();
        // Another server appends first.
        append(&store, 3, 1, 10);
        let mut c = LogChunk {
            modules: vec!["nav".into()],
            ..LogChunk::default()
        };
        c.push(1, 1, 0, "late", b"{}").unwrap();
        let next = SessionCounters {
            log_count: stale.log_count + 1,
            next_chunk: stale.next_chunk + 1,
            ..stale
        };
        let index = crate::sessions::ChunkIndex::of(&c).unwrap();
        let r = store.append_indexed_chunk(7, 3, &c, &index, (&stale, &next), stale.next_chunk);
        assert!(matches!(r, Err(StorageError::Conflict(_))), "{r:?}");
        assert_eq!(lines(&store, 3).len(), 10);
        assert_eq!(store.session_counters(3).unwrap().log_count, 10);
        // Decided on what is stored now, it goes in after the other's batch.
        let now = store.session_counters(3).unwrap();
        let next = SessionCounters {
            log_count: now.log_count + 1,
            next_chunk: now.next_chunk + 1,
            ..now
        };
        store
            .append_indexed_chunk(7, 3, &c, &index, (&now, &next), now.next_chunk)
            .unwrap();
        assert_eq!(lines(&store, 3).last().unwrap().0, "late");
        // Completed by another server: refused, nothing written.
        let mut done = session(&store, 3);
        done.status = SessionStatus::Completed;
        store.put_session(&done).unwrap();
        let now = store.session_counters(3).unwrap();
        let next = SessionCounters {
            log_count: now.log_count + 1,
            next_chunk: now.next_chunk + 1,
            ..now
        };
        let r = store.append_indexed_chunk(7, 3, &c, &index, (&now, &next), now.next_chunk);
        assert!(
            matches!(&r, Err(StorageError::Conflict(w)) if w == crate::sessions::SESSION_NOT_ACTIVE),
            "{r:?}"
        );
        assert_eq!(lines(&store, 3).len(), 11);
    }
    on_each_engine!(
        an_append_decided_on_stale_counters_or_after_completion_is_refused_and_writes_nothing
    );

    fn a_seal_reads_at_most_its_source_budget_and_says_more_remain() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        session(&store, 3);
        append(&store, 3, 20, 10);
        let one = store.log_chunks(3).next().unwrap().unwrap().1;
        let size = codec::encode(&one).unwrap().len();
        let plan = SealPlan {
            max_source_bytes: size * 5,
            ..PLAN
        };
        let first = store.seal_logs(3, plan).unwrap().unwrap();
        assert_eq!((first.sources, first.more), (5, true));
        assert_eq!(store.sessions_owed_seal(i64::MAX, 10).unwrap(), vec![3]);
        let mut seals = 1;
        loop {
            seals += 1;
            if !store.seal_logs(3, plan).unwrap().unwrap().more {
                break;
            }
        }
        assert_eq!(seals, 4);
        assert_eq!(lines(&store, 3).len(), 200);
        assert!(store.sessions_owed_seal(i64::MAX, 10).unwrap().is_empty());
    }
    on_each_engine!(a_seal_reads_at_most_its_source_budget_and_says_more_remain);

    fn a_pinned_session_is_not_sealed_until_its_reader_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        session(&store, 3);
        append(&store, 3, 4, 10);
        let pin = store.log_pin(3);
        assert_eq!(store.seal_logs(3, PLAN).unwrap(), Err(SealSkipped::Busy));
        assert_eq!(store.log_summaries(3).unwrap().len(), 4);
        drop(pin);
        assert_eq!(store.seal_logs(3, PLAN).unwrap().unwrap().chunks, 1);
    }
    on_each_engine!(a_pinned_session_is_not_sealed_until_its_reader_lets_go);

    /// Servers sharing a database: a reader on one holds off the seals of the others.
    #[test]
    fn a_session_read_on_one_server_is_not_sealed_by_another_until_the_reader_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = crate::testing::two_servers(dir.path());
        let wait = Duration::from_millis(200);
        let pin = a.log_pin(7);
        assert!(b.seal_across(7, wait).unwrap().is_none());
        // Another session is not held.
        assert!(b.seal_across(8, wait).unwrap().is_some());
        drop(pin);
        let t = Instant::now();
        let sealing = loop {
            if let Some(s) = b.seal_across(7, wait).unwrap() {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the pin was never let go"
            );
        };
        // A reader waits for the seal's commit to end.
        let reading = std::thread::spawn(move || {
            let _pin = a.log_pin(7);
            Instant::now()
        });
        std::thread::sleep(Duration::from_millis(300));
        let committed = Instant::now();
        drop(sealing);
        assert!(reading.join().unwrap() >= committed);
    }

    /// A store whose seals write segments to a local blob store under `dir/blobs`.
    fn offloading(dir: &std::path::Path) -> (Store, tokio::runtime::Runtime) {
        let store = crate::testing::open(&dir.join("data"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let blobs = crate::BlobStore::local(&dir.join("blobs")).unwrap();
        store.attach_segments(blobs, rt.handle().clone(), 1 << 20);
        (store, rt)
    }

    fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files(&p));
            } else {
                out.push(p);
            }
        }
        out
    }

    fn families(store: &Store) -> Vec<String> {
        store
            .key_snapshot()
            .unwrap()
            .iter()
            .map(|k| crate::purge::key_family(k))
            .collect()
    }

    #[test]
    fn sealed_chunks_move_into_one_segment_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _rt) = offloading(dir.path());
        session(&store, 3);
        append(&store, 3, 35, 10);
        let before = lines(&store, 3);
        let done = store.seal_logs(3, PLAN).unwrap().unwrap();
        assert!(done.offloaded);
        assert_eq!((done.sources, done.chunks), (35, 4));
        // Local disk holds the summaries, filters and locations; the chunks are in one segment.
        let fams = families(&store);
        assert_eq!(fams.iter().filter(|f| *f == "logs:l").count(), 0);
        assert_eq!(fams.iter().filter(|f| *f == "logs:lo").count(), 4);
        assert_eq!(fams.iter().filter(|f| *f == "logs:ls").count(), 4);
        let segs = files(&dir.path().join("blobs/logs"));
        assert_eq!(segs.len(), 1, "{segs:?}");
        let footer = crate::segments::footer(&std::fs::read(&segs[0]).unwrap()).unwrap();
        assert_eq!(
            footer.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![0, 10, 20, 30]
        );
        assert_eq!(store.segment_stats().segments_written, 1);
        // Read back cold: one ranged GET per chunk, then from the cache.
        store.clear_segment_cache();
        assert_eq!(lines(&store, 3), before);
        assert_eq!(store.segment_stats().fetches, 4);
        assert_eq!(lines(&store, 3), before);
        assert_eq!(store.segment_stats().fetches, 4);
        // Heads come from the locations, without a fetch.
        store.clear_segment_cache();
        assert_eq!(store.log_chunk_heads(3).unwrap().len(), 4);
        assert_eq!(store.segment_stats().fetches, 4);
        // Later batches append locally and are sealed into a segment of their own.
        append(&store, 3, 2, 10);
        assert_eq!(lines(&store, 3).len(), 370);
        assert!(store.seal_logs(3, PLAN).unwrap().unwrap().offloaded);
        assert_eq!(files(&dir.path().join("blobs/logs")).len(), 2);
        assert_eq!(lines(&store, 3).len(), 370);
    }

    #[test]
    fn a_segment_whose_bytes_changed_is_an_error_not_a_wrong_answer() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _rt) = offloading(dir.path());
        session(&store, 3);
        append(&store, 3, 4, 10);
        store.seal_logs(3, PLAN).unwrap().unwrap();
        let seg = files(&dir.path().join("blobs/logs")).remove(0);
        let mut bytes = std::fs::read(&seg).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&seg, bytes).unwrap();
        store.clear_segment_cache();
        let err = store.log_chunks(3).next().unwrap().unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn deleting_a_sealed_session_lists_its_segments_for_deletion_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _rt) = offloading(dir.path());
        let before = store.key_snapshot().unwrap();
        let s = session(&store, 3);
        append(&store, 3, 4, 10);
        store.seal_logs(3, PLAN).unwrap().unwrap();
        append(&store, 3, 4, 10);
        store.seal_logs(3, PLAN).unwrap().unwrap();
        append(&store, 3, 1, 10);
        let blobs = store.delete_session(&s).unwrap();
        assert_eq!(blobs.len(), 2);
        let doomed = store.doomed_segments(10).unwrap();
        assert_eq!(doomed.len(), 2);
        assert!(store.segments_referenced(3).unwrap().is_empty());
        assert!(store.segment_doomed(&doomed[0]).unwrap());
        assert!(!store.segment_doomed("logs/7/3/other.seg").unwrap());
        for k in &doomed {
            store.delete_doomed_segment(k).unwrap();
        }
        assert!(files(&dir.path().join("blobs/logs")).is_empty());
        let after = store.key_snapshot().unwrap();
        let left: Vec<_> = after
            .difference(&before)
            .map(|k| crate::purge::key_family(k))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    fn a_deleted_session_leaves_no_seal_keys_and_is_not_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let before = store.key_snapshot().unwrap();
        let s = session(&store, 3);
        append(&store, 3, 4, 10);
        store.seal_logs(3, PLAN).unwrap().unwrap();
        append(&store, 3, 2, 10);
        store.delete_session(&s).unwrap();
        let after = store.key_snapshot().unwrap();
        let left: Vec<_> = after
            .difference(&before)
            .map(|k| crate::purge::key_family(k))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(store.seal_logs(3, PLAN).unwrap(), Err(SealSkipped::Gone));
    }
    on_each_engine!(a_deleted_session_leaves_no_seal_keys_and_is_not_sealed);
}
