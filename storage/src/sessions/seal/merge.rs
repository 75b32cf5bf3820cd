//! The seal itself: consecutive chunks merged into larger ones, packed into a segment when a
//! blob store is attached, and the rewrite committed in one transaction.

use super::*;

/// One chunk a seal produces: its first source's sequence number, the sources it takes, its
/// lines and time range, and either its merged entries or (while it merged with nothing) the
/// first source's stored bytes.
pub(super) struct Out {
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
pub(super) fn extend(dst: &mut LogChunk, src: &impl Columns) -> Option<()> {
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
pub(super) struct Write {
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
            let (body, entries) = crate::sessions::segments::pack(&refs)?;
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
