//! Sealed log chunks in the blob store: segments, their chunks' locations, a read cache.
//!
//! A seal ([`crate::sessions::seal`]) packs the chunks it produces into one **segment**, an object
//! under `logs/{project}/{session}/{first}-{last}-{ms}.seg` (the sequence numbers of its
//! first and last chunk, and when it was written): the chunks' stored bytes one after the
//! other, then a footer (every chunk's sequence number, offset, length and CRC-32, postcard),
//! the footer's length (`u32` LE) and the magic `FOSEG001`. The segment is written with a
//! create-only put; only then does one transaction record each chunk's [`ChunkLocation`]
//! (`v1/lo/{session}/{seq}` in the `logs` tree, beside its summary and text filter) and drop
//! its local bytes. A crash between the two leaves an object no location points at, which the
//! sweep removes; nothing is ever read from it.
//!
//! A reader fetches one chunk with a ranged GET of its location and checks its CRC. Fetched
//! chunks are kept in a cache bounded in bytes (`[logs] cache_bytes`), oldest out first.
//! Readers run on blocking threads (queries, exports, replays, backtests), where the fetch
//! waits on the runtime's handle.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{BlobStore, Result, StorageError};

/// Ranged GETs one reader has in flight at once.
const FETCH_CONCURRENCY: usize = 16;
/// Chunks a scan fetches ahead of the one it reads.
pub(crate) const READ_AHEAD: usize = 16;

/// Where every segment lives in the blob store.
pub const SEGMENT_PREFIX: &str = "logs/";
const MAGIC: &[u8; 8] = b"FOSEG001";

/// Where a sealed chunk is: its segment, its bytes' range and checksum, and its time range
/// (what a time-ordered merge needs without fetching it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkLocation {
    pub segment: String,
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
    pub min_ts: i64,
    pub max_ts: i64,
}

/// One footer entry: (sequence number, offset, length, CRC-32).
pub type FooterEntry = (u64, u64, u32, u32);

/// The segment key of a session's chunks `first..=last`, written at `ms`.
pub fn segment_key(project: u64, session: u64, first: u64, last: u64, ms: i64) -> String {
    format!("{SEGMENT_PREFIX}{project}/{session}/{first:020}-{last:020}-{ms}.seg")
}

/// The session a segment key names.
pub fn segment_session(key: &str) -> Option<u64> {
    key.strip_prefix(SEGMENT_PREFIX)?
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

/// When a segment key says it was written (Unix ms).
pub fn segment_written_ms(key: &str) -> Option<i64> {
    key.rsplit('-').next()?.strip_suffix(".seg")?.parse().ok()
}

/// A segment of `chunks` (sequence number, stored bytes), and each chunk's footer entry.
pub fn pack(chunks: &[(u64, &[u8])]) -> Result<(Vec<u8>, Vec<FooterEntry>)> {
    let total: usize = chunks.iter().map(|(_, b)| b.len()).sum();
    let mut out = Vec::with_capacity(total + 64 + chunks.len() * 24);
    let mut entries = Vec::with_capacity(chunks.len());
    for (seq, bytes) in chunks {
        let len = u32::try_from(bytes.len())
            .map_err(|_| StorageError::Corrupt("a log chunk over 4 GiB".into()))?;
        entries.push((*seq, out.len() as u64, len, crc32fast::hash(bytes)));
        out.extend_from_slice(bytes);
    }
    let footer = postcard::to_stdvec(&entries).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    let footer_len = u32::try_from(footer.len())
        .map_err(|_| StorageError::Corrupt("a segment footer over 4 GiB".into()))?;
    out.extend_from_slice(&footer);
    out.extend_from_slice(&footer_len.to_le_bytes());
    out.extend_from_slice(MAGIC);
    Ok((out, entries))
}

/// A whole segment's footer (what a reader without the index would use).
pub fn footer(segment: &[u8]) -> Result<Vec<FooterEntry>> {
    let bad = || StorageError::Corrupt("not a log segment".into());
    let n = segment.len();
    if n < 12 || &segment[n - 8..] != MAGIC {
        return Err(bad());
    }
    let len = u32::from_le_bytes(segment[n - 12..n - 8].try_into().map_err(|_| bad())?) as usize;
    let start = (n - 12).checked_sub(len).ok_or_else(bad)?;
    postcard::from_bytes(&segment[start..n - 12]).map_err(|e| StorageError::Corrupt(e.to_string()))
}

/// Fetched chunks, bounded in bytes, the oldest fetched going first.
struct ChunkCache {
    inner: Mutex<CacheInner>,
    max: usize,
}

#[derive(Default)]
struct CacheInner {
    map: HashMap<(String, u64), Bytes>,
    order: VecDeque<(String, u64)>,
    bytes: usize,
}

impl ChunkCache {
    fn get(&self, key: &(String, u64)) -> Option<Bytes> {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        c.map.get(key).cloned()
    }

    fn put(&self, key: (String, u64), bytes: Bytes) {
        if bytes.len() > self.max {
            return;
        }
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if c.map.contains_key(&key) {
            return;
        }
        while c.bytes + bytes.len() > self.max {
            let Some(old) = c.order.pop_front() else {
                break;
            };
            if let Some(b) = c.map.remove(&old) {
                c.bytes -= b.len();
            }
        }
        c.bytes += bytes.len();
        c.order.push_back(key.clone());
        c.map.insert(key, bytes);
    }

    fn clear(&self) {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        *c = CacheInner::default();
    }
}

/// What reading sealed chunks has cost since start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentStats {
    /// Ranged GETs of chunks (cache misses).
    pub fetches: u64,
    pub fetched_bytes: u64,
    /// Chunks served from the cache.
    pub cache_hits: u64,
    /// Segments written, and their bytes.
    pub segments_written: u64,
    pub segment_bytes_written: u64,
}

/// The blob store sealed chunks go to, with the runtime its calls wait on and the cache.
pub(crate) struct Segments {
    pub(crate) blobs: BlobStore,
    rt: tokio::runtime::Handle,
    cache: ChunkCache,
    fetches: AtomicU64,
    fetched_bytes: AtomicU64,
    hits: AtomicU64,
    written: AtomicU64,
    written_bytes: AtomicU64,
}

impl Segments {
    pub(crate) fn new(blobs: BlobStore, rt: tokio::runtime::Handle, cache_bytes: usize) -> Self {
        Self {
            blobs,
            rt,
            cache: ChunkCache {
                inner: Mutex::default(),
                max: cache_bytes,
            },
            fetches: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            written: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        }
    }

    /// Runs a blob call to completion from a blocking thread.
    fn wait<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// What a failed read of `segment` means for its reader: gone from the store, the chunk
    /// is damaged (it will not come back by asking again); any other failure of the store (a
    /// timeout, a refused connection, a 5xx) may pass, so the read is answered 503.
    fn read_failure(segment: &str, e: StorageError) -> StorageError {
        match e {
            StorageError::Blob(object_store::Error::NotFound { .. }) => StorageError::Damaged(
                format!("log segment {segment} is missing from the object store"),
            ),
            StorageError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => {
                StorageError::Damaged(format!(
                    "log segment {segment} is missing from the object store"
                ))
            }
            StorageError::Blob(e) => {
                StorageError::Unavailable(format!("the object store did not answer: {e}"))
            }
            StorageError::Io(e) => {
                StorageError::Unavailable(format!("the object store did not answer: {e}"))
            }
            other => other,
        }
    }

    fn damaged(loc: &ChunkLocation) -> StorageError {
        StorageError::Damaged(format!(
            "the log chunk at bytes {}..{} of segment {} fails its checksum",
            loc.offset,
            loc.offset + u64::from(loc.len),
            loc.segment
        ))
    }

    /// Writes a segment, create-only; `false` if its key was taken.
    pub(crate) fn put(&self, key: &str, bytes: Vec<u8>) -> Result<bool> {
        let n = bytes.len() as u64;
        let fresh = self.wait(self.blobs.put_new(key, Bytes::from(bytes)))?;
        if fresh {
            self.written.fetch_add(1, Ordering::Relaxed);
            self.written_bytes.fetch_add(n, Ordering::Relaxed);
        }
        Ok(fresh)
    }

    /// Deletes a segment (absent is fine).
    pub(crate) fn delete(&self, key: &str) -> Result<()> {
        self.wait(self.blobs.delete(key))
    }

    /// The stored bytes of the chunk at `loc`, from the cache or one ranged GET, checked
    /// against its CRC.
    pub(crate) fn fetch(&self, loc: &ChunkLocation) -> Result<Bytes> {
        let key = (loc.segment.clone(), loc.offset);
        if let Some(b) = self.cache.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(b);
        }
        let range = loc.offset..loc.offset + u64::from(loc.len);
        let bytes = self
            .wait(self.blobs.get_range(&loc.segment, range))
            .map_err(|e| Self::read_failure(&loc.segment, e))?;
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if bytes.len() != loc.len as usize || crc32fast::hash(&bytes) != loc.crc {
            return Err(Self::damaged(loc));
        }
        self.cache.put(key, bytes.clone());
        Ok(bytes)
    }

    /// As [`Segments::fetch`] for several chunks, the ones not cached fetched
    /// `FETCH_CONCURRENCY` at a time; in the order asked.
    pub(crate) fn fetch_many(&self, locs: &[ChunkLocation]) -> Result<Vec<Bytes>> {
        use futures::StreamExt;
        let mut out: Vec<Option<Bytes>> = locs
            .iter()
            .map(|l| self.cache.get(&(l.segment.clone(), l.offset)))
            .collect();
        let hits = out.iter().filter(|b| b.is_some()).count() as u64;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        // The chunks missing, by segment: one call per segment, whose nearby ranges the
        // store coalesces into one GET; segments fetched `FETCH_CONCURRENCY` at a time.
        let mut by_segment: Vec<(&str, Vec<usize>)> = Vec::new();
        for i in (0..locs.len()).filter(|&i| out[i].is_none()) {
            match by_segment.iter_mut().find(|(s, _)| *s == locs[i].segment) {
                Some((_, v)) => v.push(i),
                None => by_segment.push((&locs[i].segment, vec![i])),
            }
        }
        if !by_segment.is_empty() {
            let fetched: Vec<Result<Vec<Bytes>>> = self.wait(
                futures::stream::iter(by_segment.iter().map(|(segment, idx)| {
                    let ranges: Vec<std::ops::Range<u64>> = idx
                        .iter()
                        .map(|&i| locs[i].offset..locs[i].offset + u64::from(locs[i].len))
                        .collect();
                    async move { self.blobs.get_ranges(segment, &ranges).await }
                }))
                .buffered(FETCH_CONCURRENCY)
                .collect(),
            );
            let pairs = by_segment
                .iter()
                .zip(fetched)
                .map(|((segment, idx), r)| {
                    r.map(|b| idx.iter().copied().zip(b).collect::<Vec<_>>())
                        .map_err(|e| Self::read_failure(segment, e))
                })
                .collect::<Result<Vec<_>>>()?;
            for (i, bytes) in pairs.into_iter().flatten() {
                let loc = &locs[i];
                self.fetches.fetch_add(1, Ordering::Relaxed);
                self.fetched_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if bytes.len() != loc.len as usize || crc32fast::hash(&bytes) != loc.crc {
                    return Err(Self::damaged(loc));
                }
                // A slice of a coalesced GET holds that whole buffer: the cache keeps a copy of
                // the chunk's own bytes, so what it counts is what it holds.
                let bytes = Bytes::copy_from_slice(&bytes);
                self.cache
                    .put((loc.segment.clone(), loc.offset), bytes.clone());
                out[i] = Some(bytes);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    pub(crate) fn stats(&self) -> SegmentStats {
        SegmentStats {
            fetches: self.fetches.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            cache_hits: self.hits.load(Ordering::Relaxed),
            segments_written: self.written.load(Ordering::Relaxed),
            segment_bytes_written: self.written_bytes.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn clear_cache(&self) {
        self.cache.clear();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_segments_footer_names_every_chunk_it_packs() {
        let chunks: Vec<(u64, Vec<u8>)> = (0..5u64)
            .map(|i| (i * 3, vec![i as u8; 10 + i as usize]))
            .collect();
        let refs: Vec<(u64, &[u8])> = chunks.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        let (seg, entries) = pack(&refs).unwrap();
        assert_eq!(footer(&seg).unwrap(), entries);
        for ((seq, bytes), (fseq, off, len, crc)) in chunks.iter().zip(&entries) {
            assert_eq!(seq, fseq);
            let got = &seg[*off as usize..*off as usize + *len as usize];
            assert_eq!(got, bytes.as_slice());
            assert_eq!(crc32fast::hash(got), *crc);
        }
        assert!(footer(&seg[..seg.len() - 1]).is_err());
        assert!(footer(b"short").is_err());
    }

    #[test]
    fn a_segment_key_names_its_session_and_when_it_was_written() {
        let k = segment_key(7, 42, 3, 99, 1_700_000_000_123);
        assert_eq!(
            k,
            "logs/7/42/00000000000000000003-00000000000000000099-1700000000123.seg"
        );
        assert_eq!(segment_session(&k), Some(42));
        assert_eq!(segment_written_ms(&k), Some(1_700_000_000_123));
    }
}
