//! Log search: a page of a session's lines matching a filter, read from the chunks'
//! summaries and text filters first, so only the chunks that may hold a match are read
//! (`query`); `query_scan` reads every chunk, the reference it is tested against (the tests
//! are beside the k-way merge's, in `exports/tests.rs`).

use crate::error::Result;
use crate::logs::{self, LogFilter};
use crate::views::LogPage;
use fleetops_storage::{Columns, Store};
use std::collections::BTreeMap;

/// Candidates fewer than one chunk in this many are read by key rather than in a pass over
/// the session's chunks.
const FEW_CHUNKS: usize = 8;

pub(super) fn query(
    store: &Store,
    session: u64,
    f: &LogFilter,
    limit: usize,
    offset: usize,
) -> Result<LogPage> {
    // Summaries, filters and chunks are read by sequence number: no seal may rewrite them
    // in between.
    let _pin = store.log_pin(session);
    // The chunks that can hold a match, by their summaries, in order of their first entry.
    let module = f.module.as_deref();
    let (mut summarized, mut chunks) = (0u64, 0usize);
    let mut candidates: Vec<(i64, u64, i64, u64)> = Vec::new();
    store.visit_log_summaries(session, |seq, s| {
        summarized += s.len();
        chunks += 1;
        if f.since.is_some_and(|x| s.max_ts < x) || f.until.is_some_and(|u| s.min_ts >= u) {
            return;
        }
        let n = s.count(f.levels, module);
        if n > 0 {
            candidates.push((s.min_ts, seq, s.max_ts, n));
        }
    })?;
    if summarized != store.session_counters(session)?.log_count {
        // Chunks written before summaries existed (or one appended while these were read).
        return scan_pinned(store, session, f, limit, offset);
    }
    candidates.sort_unstable();
    let mut first = Smallest::new(offset.saturating_add(limit));
    let mut total = 0u64;
    if let Some(needle) = f.search.as_deref() {
        // A text search reads every candidate (`total` counts them all): the chunks that
        // neither the summaries nor the text filters rule out. A few are read one by one;
        // many in one sequential pass that does not decode the others.
        if candidates.len().saturating_mul(FEW_CHUNKS) < chunks {
            // Few left by the summaries: their filters read by key.
            let mut kept = Vec::with_capacity(candidates.len());
            for c in candidates {
                if store.log_chunk_may_hold(session, c.1, needle)? {
                    kept.push(c);
                }
            }
            candidates = kept;
        } else {
            let ruled_out = store.log_chunks_without(session, needle)?;
            candidates.retain(|c| ruled_out.binary_search(&c.1).is_err());
        }
        let mut count = |seq: u64, chunk: &fleetops_storage::LogChunkView<'_>| {
            total += first.offer_matches(f, seq, chunk);
        };
        if candidates.len().saturating_mul(FEW_CHUNKS) < chunks {
            let mut seqs: Vec<u64> = candidates.iter().map(|c| c.1).collect();
            seqs.sort_unstable();
            store.visit_log_chunks_by_seq(session, &seqs, &mut count)?;
        } else {
            let wanted: std::collections::HashSet<u64> = candidates.iter().map(|c| c.1).collect();
            store.visit_log_chunks(session, |seq| wanted.contains(&seq), &mut count)?;
        }
        return page(store, session, first, offset, limit, total as usize);
    }
    // Otherwise a chunk wholly inside the time range counts from its summary, and only the
    // chunks a page can draw from are read.
    let counted =
        |min: i64, max: i64| f.since.is_none_or(|x| min >= x) && f.until.is_none_or(|u| max < u);
    for &(min, seq, max, n) in &candidates {
        // Once the page is full, a chunk that starts after its last entry adds nothing to it.
        let for_page = first.admits_from(min);
        let from_summary = counted(min, max);
        if from_summary {
            total += n;
        }
        if !for_page && from_summary {
            continue;
        }
        let Some(chunk) = store.log_chunk(session, seq)? else {
            continue;
        };
        let n = first.offer_matches(f, seq, &chunk);
        if !from_summary {
            total += n;
        }
    }
    page(store, session, first, offset, limit, total as usize)
}

/// The query by reading every chunk, under its own pin: the reference the summary path is
/// tested against.
#[cfg(test)]
pub(super) fn query_scan(
    store: &Store,
    session: u64,
    f: &LogFilter,
    limit: usize,
    offset: usize,
) -> Result<LogPage> {
    let _pin = store.log_pin(session);
    scan_pinned(store, session, f, limit, offset)
}

/// The query by reading every chunk, under a pin its caller holds (a second pin of the same
/// reader could wait behind a seal that waits for the first): the answer for a store whose
/// older chunks have no summaries.
fn scan_pinned(
    store: &Store,
    session: u64,
    f: &LogFilter,
    limit: usize,
    offset: usize,
) -> Result<LogPage> {
    let mut first = Smallest::new(offset.saturating_add(limit));
    let mut total = 0usize;
    for item in store.log_chunks(session) {
        let (seq, chunk) = item?;
        total += first.offer_matches(f, seq, &chunk) as usize;
    }
    page(store, session, first, offset, limit, total)
}

/// The first `keep` matches in time order (timestamp, chunk, index), kept in a bounded
/// max-heap: memory grows with the page asked for, not with the number of matches.
struct Smallest {
    heap: std::collections::BinaryHeap<(i64, u64, u32)>,
    keep: usize,
}

impl Smallest {
    fn new(keep: usize) -> Self {
        Self {
            heap: std::collections::BinaryHeap::with_capacity(keep.min(1 << 16) + 1),
            keep,
        }
    }

    fn offer(&mut self, key: (i64, u64, u32)) {
        if self.heap.len() < self.keep {
            self.heap.push(key);
        } else if self.heap.peek().is_some_and(|top| key < *top) {
            self.heap.pop();
            self.heap.push(key);
        }
    }

    /// Offers every match of `f` in chunk `seq`; returns how many there were.
    fn offer_matches(&mut self, f: &LogFilter, seq: u64, chunk: &impl Columns) -> u64 {
        let mut n = 0;
        for i in f.matches(chunk) {
            let Some(ts) = chunk.ts_at(i) else { continue };
            n += 1;
            self.offer((ts, seq, i as u32));
        }
        n
    }

    /// Whether an entry at `ts` or later could still be kept.
    fn admits_from(&self, ts: i64) -> bool {
        self.heap.len() < self.keep || self.heap.peek().is_some_and(|top| ts <= top.0)
    }
}

/// The page of the `offset + limit` first matches: its entries decoded from only the chunks
/// that hold them.
fn page(
    store: &Store,
    session: u64,
    first: Smallest,
    offset: usize,
    limit: usize,
    total: usize,
) -> Result<LogPage> {
    let page: Vec<(i64, u64, u32)> = first
        .heap
        .into_sorted_vec()
        .into_iter()
        .skip(offset)
        .take(limit)
        .collect();
    // Pass 2: decode only the chunks that hold the page.
    let mut wanted: BTreeMap<u64, Vec<(usize, u32)>> = BTreeMap::new();
    for (pos, (_, seq, i)) in page.iter().enumerate() {
        wanted.entry(*seq).or_default().push((pos, *i));
    }
    let mut items: Vec<Option<logs::LogEntryView>> = vec![None; page.len()];
    for (seq, entries) in wanted {
        let Some(chunk) = store.log_chunk(session, seq)? else {
            continue;
        };
        for (pos, i) in entries {
            if let Some(slot) = items.get_mut(pos) {
                *slot = logs::entry(&chunk, i as usize);
            }
        }
    }
    Ok(LogPage {
        items: items.into_iter().flatten().collect(),
        total,
    })
}
