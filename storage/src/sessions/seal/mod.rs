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
//! seal's chunks (merged or not) are packed into one segment ([`crate::sessions::segments`]), written
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
use crate::sessions::ChunkIndex;
use crate::sessions::segments::{ChunkLocation, segment_key};
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
            .set(crate::sessions::segments::Segments::new(
                blobs,
                rt,
                cache_bytes,
            ));
    }

    /// What reading and writing segments has cost since start-up.
    pub fn segment_stats(&self) -> crate::sessions::segments::SegmentStats {
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
}

mod merge;
mod pins;

pub use pins::LogPin;
pub(crate) use pins::LogPins;

#[cfg(test)]
mod tests;
