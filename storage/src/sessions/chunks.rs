//! Reading a session's log chunks, wherever each is: local bytes in the `logs` tree, or a
//! location in a sealed segment (read ahead a window at a time).

use super::*;

/// Where a chunk's bytes are.
pub(super) enum Place {
    Local(Bytes),
    /// Its encoded [`crate::sessions::segments::ChunkLocation`].
    Remote(Bytes),
}

/// A chunk's stored bytes, however they were read.
pub(super) enum ChunkBytes {
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
pub(super) struct Places {
    local: KvIter,
    remote: KvIter,
    next_local: Option<(u64, Bytes)>,
    next_remote: Option<(u64, Bytes)>,
    rev: bool,
}

pub(super) fn next_of(it: &mut KvIter) -> Result<Option<(u64, Bytes)>> {
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

impl Store {
    /// Every chunk of the session with where it is (its local bytes, or its location in a
    /// segment), in sequence order (`rev`: newest first), read lazily.
    pub(super) fn places(&self, session: u64, rev: bool) -> Places {
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
    pub(super) fn load(&self, place: &Place) -> Result<ChunkBytes> {
        match place {
            Place::Local(v) => Ok(ChunkBytes::Local(v.clone())),
            Place::Remote(v) => {
                let loc: crate::sessions::segments::ChunkLocation = codec::decode(v)?;
                let segs = self.inner.segments.get().ok_or_else(|| {
                    StorageError::Config("sealed log chunks need the blob store attached".into())
                })?;
                Ok(ChunkBytes::Remote(segs.fetch(&loc)?))
            }
        }
    }

    /// Several chunks' stored bytes, in order; the sealed ones not cached fetched together.
    pub(super) fn load_many(&self, places: &[(u64, Place)]) -> Result<Vec<ChunkBytes>> {
        let mut locs = Vec::new();
        for (_, p) in places {
            if let Place::Remote(v) = p {
                locs.push(codec::decode::<crate::sessions::segments::ChunkLocation>(
                    v,
                )?);
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
        for window in seqs.chunks(crate::sessions::segments::READ_AHEAD) {
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
    pub(super) fn place(&self, session: u64, seq: u64) -> Result<Option<Place>> {
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
        let mut window = Vec::with_capacity(crate::sessions::segments::READ_AHEAD);
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
                if window.len() == crate::sessions::segments::READ_AHEAD {
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
                    let loc: crate::sessions::segments::ChunkLocation = codec::decode(v)?;
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
                && !crate::sessions::text_filter::may_contain(&v, needle.as_bytes())
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
                Some(v) => crate::sessions::text_filter::may_contain(&v, needle.as_bytes()),
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
}
