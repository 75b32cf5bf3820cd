//! Sealing a session's log chunks: small appended batches merged into chunks of a target size.
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
//! then index) is unchanged. A chunk that would merge with nothing is left as it is. The
//! rewrite (new chunks, their indexes, the removal of the old ones, the new cursor) is one
//! transaction, refused if the session was deleted meanwhile.
//!
//! Readers that look at a session's chunks in more than one read (a query reads summaries,
//! then chunks by sequence number; an export scans) hold a [`LogPin`] for the session: a seal
//! only starts while no pin is held, and a pin taken while a seal runs waits for it (a few
//! milliseconds: a seal's sources are bounded by `max_source_bytes`).
//!
//! Which sessions have unsealed chunks is kept in the `logs` tree (`v1/lp/{session}`, the
//! time its oldest unsealed batch arrived), written by the append that finds none, and removed
//! by the seal that leaves none, so a pass over sessions owed a seal reads only those.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

use crate::sessions::ChunkIndex;
use crate::{Columns, LogChunk, Result, SessionCounters, StorageError, Store, codec, keys};

/// How chunks are merged when sealed.
#[derive(Debug, Clone, Copy)]
pub struct SealPlan {
    /// A merged chunk holds at most this many lines ...
    pub chunk_lines: usize,
    /// ... and about this many bytes (encoded).
    pub chunk_bytes: usize,
    /// Bytes of unsealed chunks one seal reads at most; a session with more is sealed again.
    pub max_source_bytes: usize,
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
}

/// Why a seal did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealSkipped {
    /// A reader holds the session's chunks; try later.
    Busy,
    /// The session is gone.
    Gone,
}

#[derive(Default)]
struct PinState {
    readers: u32,
    sealing: bool,
}

/// Readers and seals of each session's chunks (see the module header).
#[derive(Default)]
pub(crate) struct LogPins {
    state: Mutex<HashMap<u64, PinState>>,
    sealed: Condvar,
}

/// A reader's hold on a session's chunks: no seal rewrites them while it lives.
pub struct LogPin {
    store: Store,
    session: u64,
}

impl Drop for LogPin {
    fn drop(&mut self) {
        let pins = &self.store.inner.log_pins;
        let mut st = pins.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = st.get_mut(&self.session) {
            p.readers = p.readers.saturating_sub(1);
            if p.readers == 0 && !p.sealing {
                st.remove(&self.session);
            }
        }
    }
}

/// A seal's exclusive hold on a session's chunks.
struct SealHold<'a> {
    pins: &'a LogPins,
    session: u64,
}

impl Drop for SealHold<'_> {
    fn drop(&mut self) {
        let mut st = self.pins.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = st.get_mut(&self.session) {
            p.sealing = false;
            if p.readers == 0 {
                st.remove(&self.session);
            }
        }
        drop(st);
        self.pins.sealed.notify_all();
    }
}

impl LogPins {
    fn try_seal(&self, session: u64) -> Option<SealHold<'_>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let p = st.entry(session).or_default();
        if p.readers > 0 || p.sealing {
            return None;
        }
        p.sealing = true;
        Some(SealHold {
            pins: self,
            session,
        })
    }
}

/// One merged chunk being built: its first source's sequence number, the sources it takes.
struct Out {
    first: u64,
    sources: Vec<u64>,
    chunk: LogChunk,
    bytes: usize,
}

/// Appends `src`'s entries to `dst`, mapping its modules onto `dst`'s.
fn extend(dst: &mut LogChunk, src: &LogChunk) -> Option<()> {
    let map: Vec<u32> = src
        .modules
        .iter()
        .map(|m| match dst.modules.iter().position(|x| x == m) {
            Some(i) => u32::try_from(i).ok(),
            None => {
                dst.modules.push(m.clone());
                u32::try_from(dst.modules.len() - 1).ok()
            }
        })
        .collect::<Option<_>>()?;
    for i in 0..src.len() {
        let module = *map.get(src.module_at(i)? as usize)?;
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

impl Store {
    /// Holds `session`'s chunks against a seal while the pin lives (waiting for one under way).
    pub fn log_pin(&self, session: u64) -> LogPin {
        let pins = &self.inner.log_pins;
        let mut st = pins.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let p = st.entry(session).or_default();
            if !p.sealing {
                p.readers += 1;
                break;
            }
            st = pins.sealed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        LogPin {
            store: self.clone(),
            session,
        }
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
        let Some(_hold) = self.inner.log_pins.try_seal(session) else {
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
            let chunk: LogChunk = codec::decode(&v)?;
            sources += 1;
            lines += chunk.len() as u64;
            last = Some(seq);
            let fits = outs.last().is_some_and(|o| {
                o.chunk.len() + chunk.len() <= plan.chunk_lines
                    && o.bytes + v.len() <= plan.chunk_bytes
            });
            match outs.last_mut() {
                Some(o) if fits => {
                    extend(&mut o.chunk, &chunk).ok_or_else(|| {
                        StorageError::Corrupt(format!("log chunk {session}/{seq} unreadable"))
                    })?;
                    o.bytes += v.len();
                    o.sources.push(seq);
                }
                _ => outs.push(Out {
                    first: seq,
                    sources: vec![seq],
                    chunk,
                    bytes: v.len(),
                }),
            }
        }
        // What each merged chunk is written as; a chunk that merged with nothing stays.
        let mut writes = Vec::new();
        for o in outs.iter().filter(|o| o.sources.len() > 1) {
            let index = ChunkIndex::of(&o.chunk)?;
            writes.push((o, codec::encode(&o.chunk)?, index));
        }
        let next = last.map_or(cursor, |l| l + 1);
        let counters_key = keys::session_counters(session);
        let cursor_key = keys::log_seal_cursor(session);
        let pending_key = keys::log_pending(session);
        let cursor_bytes = codec::encode(&next)?;
        let gate = self.inner.gate.shared();
        let more =
            self.inner
                .logs
                .transaction_held(&self.inner.records, &gate, |(logs, records)| {
                    let Some(c) = records.get(counters_key.as_slice())? else {
                        return Err(sled::transaction::ConflictableTransactionError::Abort(()));
                    };
                    let counters: SessionCounters = codec::decode(&c)
                        .map_err(|_| sled::transaction::ConflictableTransactionError::Abort(()))?;
                    for (o, bytes, index) in &writes {
                        for &s in &o.sources[1..] {
                            logs.remove(keys::log_chunk(session, s))?;
                            logs.remove(keys::log_summary(session, s))?;
                            logs.remove(keys::log_text_filter(session, s))?;
                        }
                        logs.insert(keys::log_chunk(session, o.first), bytes.as_slice())?;
                        logs.insert(keys::log_summary(session, o.first), index.summary_bytes())?;
                        match index.filter_bytes() {
                            Some(f) => logs.insert(keys::log_text_filter(session, o.first), f)?,
                            None => logs.remove(keys::log_text_filter(session, o.first))?,
                        };
                    }
                    logs.insert(cursor_key.as_slice(), cursor_bytes.as_slice())?;
                    let more = counters.next_chunk > next;
                    if !more {
                        logs.remove(pending_key.as_slice())?;
                    }
                    Ok(more)
                });
        match more {
            Ok(more) => Ok(Ok(Sealed {
                sources,
                chunks: outs.len(),
                lines,
                more,
            })),
            Err(sled::transaction::TransactionError::Abort(())) => Ok(Err(SealSkipped::Gone)),
            Err(sled::transaction::TransactionError::Storage(e)) => Err(StorageError::Sled(e)),
        }
    }
}

/// Seals on a temporary store: merged chunks keep every entry in arrival order with rebuilt
/// summaries and filters, a pinned session is not touched, a deleted one leaves no seal keys.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{Session, SessionStatus};

    const PLAN: SealPlan = SealPlan {
        chunk_lines: 100,
        chunk_bytes: 1 << 20,
        max_source_bytes: 1 << 30,
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

    #[test]
    fn sealing_merges_small_chunks_keeping_every_entry_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
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
                more: false
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

    #[test]
    fn a_seal_reads_at_most_its_source_budget_and_says_more_remain() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
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

    #[test]
    fn a_pinned_session_is_not_sealed_until_its_reader_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        session(&store, 3);
        append(&store, 3, 4, 10);
        let pin = store.log_pin(3);
        assert_eq!(store.seal_logs(3, PLAN).unwrap(), Err(SealSkipped::Busy));
        assert_eq!(store.log_summaries(3).unwrap().len(), 4);
        drop(pin);
        assert_eq!(store.seal_logs(3, PLAN).unwrap().unwrap().chunks, 1);
    }

    #[test]
    fn a_deleted_session_leaves_no_seal_keys_and_is_not_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
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
}
