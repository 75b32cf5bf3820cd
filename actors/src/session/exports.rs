//! Log query pages and the streamed exports (JSON, CSV, NDJSON) and artifact ZIPs, each
//! written on a blocking thread into a bounded channel the response streams from.

use crate::clock::write_ms;
use crate::error::{Error, Result};
use crate::logs::{self, LogFilter};
use crate::views::LogPage;
use fleetops_storage::{Artifact, BlobStore, Columns, Store};
use std::collections::BTreeMap;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Json,
    Csv,
}

/// Pieces of an export body, each about 64 KiB.
/// A download streamed from a blocking thread: its pieces, and whether the last was sent (a
/// stream that ends without it was cut short, and its response must not end cleanly).
pub struct ExportStream {
    pub rx: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    pub done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

const EXPORT_PIECE: usize = 64 * 1024;

/// One chunk open during a time-ordered merge: its matches sorted by (timestamp, index).
/// The decoded chunk itself is not kept here but in a small cache, so chunks that all
/// overlap in time cost their sort keys, not their text.
struct Open {
    matches: Vec<(i64, u32)>,
    pos: usize,
}

/// Decoded chunks kept while merging (least recently used goes first); in time-ordered data
/// every read is a hit, and up to this many chunks may interleave before re-reads start.
const MERGE_CHUNK_CACHE: usize = 32;

/// Calls `emit` for every match in (timestamp, chunk, index) order, until it returns false.
///
/// A k-way merge over chunks sorted by their first timestamp: a chunk is opened only once
/// the merge reaches its first timestamp, and dropped when its last match is out. Memory is
/// the sort keys of the chunks overlapping in time (one or two chunks when devices send in
/// time order) and at most `MERGE_CHUNK_CACHE` decoded chunks, not the session: the only
/// whole-session state is one (seq, min, max) per chunk, about 24 bytes per thousand lines
/// (and, for a search, the ids of the chunks its text filters rule out, 8 bytes each).
/// Chunks that all overlap (a device whose clock jumps) cost 16 bytes a match, as a full
/// sort would, and are re-read as the merge moves between them.
fn merged(
    store: &Store,
    session: u64,
    f: &LogFilter,
    mut emit: impl FnMut(&fleetops_storage::LogChunk, usize) -> Result<bool>,
) -> Result<()> {
    use std::cmp::Reverse;
    let mut heads = store.log_chunk_heads(session)?;
    let ruled_out = match f.search.as_deref() {
        Some(needle) => store.log_chunks_without(session, needle)?,
        None => Vec::new(),
    };
    heads.retain(|&(seq, min, max)| {
        f.since.is_none_or(|s| max >= s)
            && f.until.is_none_or(|u| min < u)
            && ruled_out.binary_search(&seq).is_err()
    });
    heads.sort_unstable_by_key(|&(seq, min, _)| (min, seq));
    let mut open: Vec<Option<Open>> = Vec::new();
    let mut heap: std::collections::BinaryHeap<Reverse<(i64, u64, u32, usize)>> =
        std::collections::BinaryHeap::new();
    let mut next = heads.iter().peekable();
    let mut cache: std::collections::VecDeque<(u64, std::rc::Rc<fleetops_storage::LogChunk>)> =
        std::collections::VecDeque::with_capacity(MERGE_CHUNK_CACHE);
    let mut chunk_of = |seq: u64| -> Result<Option<std::rc::Rc<fleetops_storage::LogChunk>>> {
        if let Some(i) = cache.iter().position(|(s, _)| *s == seq) {
            let hit = cache.remove(i);
            if let Some((s, c)) = hit {
                cache.push_back((s, c.clone()));
                return Ok(Some(c));
            }
        }
        let Some(c) = store.log_chunk(session, seq)? else {
            return Ok(None);
        };
        let c = std::rc::Rc::new(c);
        if cache.len() >= MERGE_CHUNK_CACHE {
            cache.pop_front();
        }
        cache.push_back((seq, c.clone()));
        Ok(Some(c))
    };
    loop {
        // Open every chunk that may hold something at or before the merge's next entry.
        while let Some(&&(seq, min, _)) = next.peek() {
            if heap.peek().is_some_and(|Reverse(top)| top.0 < min) {
                break;
            }
            next.next();
            let Some(chunk) = chunk_of(seq)? else {
                continue;
            };
            let mut matches: Vec<(i64, u32)> = f
                .matches(chunk.as_ref())
                .into_iter()
                .filter_map(|i| chunk.ts_at(i).map(|ts| (ts, i as u32)))
                .collect();
            matches.sort_unstable();
            let Some(&(ts, i)) = matches.first() else {
                continue;
            };
            let slot = match open.iter().position(Option::is_none) {
                Some(s) => s,
                None => {
                    open.push(None);
                    open.len() - 1
                }
            };
            if let Some(o) = open.get_mut(slot) {
                *o = Some(Open { matches, pos: 0 });
            }
            heap.push(Reverse((ts, seq, i, slot)));
        }
        let Some(Reverse((_, seq, i, slot))) = heap.pop() else {
            return Ok(());
        };
        let Some(Some(o)) = open.get_mut(slot) else {
            continue;
        };
        let Some(chunk) = chunk_of(seq)? else {
            continue;
        };
        if !emit(&chunk, i as usize)? {
            return Ok(());
        }
        o.pos += 1;
        match o.matches.get(o.pos) {
            Some(&(ts, i)) => heap.push(Reverse((ts, seq, i, slot))),
            None => {
                if let Some(x) = open.get_mut(slot) {
                    *x = None;
                }
            }
        }
    }
}

/// The sending half of a stream, used from its blocking thread: each piece waits at most
/// `stall` (`[sessions] stalled_reader_seconds`) for room, so a download nobody reads does
/// not hold a blocking thread for ever, and once one could not be sent (the reader went away or
/// stalled) nothing more is: the stream is cut short, and the reader's side, told by `done`
/// staying unset, ends the response with an error instead of a clean end.
pub(crate) struct Pieces {
    tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
    broken: std::cell::Cell<bool>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stall: std::time::Duration,
}

impl Pieces {
    /// A stream's two ends.
    pub(crate) fn new(stall: std::time::Duration) -> (Self, ExportStream) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        (
            Self {
                tx,
                broken: std::cell::Cell::new(false),
                done: done.clone(),
                stall,
            },
            ExportStream { rx, done },
        )
    }

    /// Sends one piece; false once the stream is cut short.
    pub(crate) fn send(&self, item: std::io::Result<bytes::Bytes>) -> bool {
        if self.broken.get() {
            return false;
        }
        use tokio::sync::mpsc::error::TrySendError;
        let sent = match self.tx.try_send(item) {
            Ok(()) => true,
            Err(TrySendError::Closed(_)) => false,
            Err(TrySendError::Full(item)) => match tokio::runtime::Handle::try_current() {
                Ok(rt) => matches!(
                    rt.block_on(tokio::time::timeout(self.stall, self.tx.send(item))),
                    Ok(Ok(()))
                ),
                Err(_) => self.tx.blocking_send(item).is_ok(),
            },
        };
        if !sent {
            self.broken.set(true);
        }
        sent
    }

    /// Marks the stream whole: every piece was sent.
    pub(crate) fn finish(&self) {
        if !self.broken.get() {
            self.done.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// A `Write` that sends what it is given down the channel in pieces.
struct ChannelWriter<'a> {
    buf: Vec<u8>,
    tx: &'a Pieces,
}

impl std::io::Write for ChannelWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= EXPORT_PIECE {
            self.flush()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = bytes::Bytes::from(std::mem::take(&mut self.buf));
        if self.tx.send(Ok(piece)) {
            Ok(())
        } else {
            Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the client went away or stopped reading",
            ))
        }
    }
}

pub(super) fn zip_into(
    rt: &tokio::runtime::Handle,
    blobs: &BlobStore,
    artifacts: &[Artifact],
    tx: &Pieces,
) -> Result<()> {
    use futures::StreamExt;
    use std::io::Write;
    let io = |e: &dyn std::fmt::Display| Error::Internal(e.to_string());
    let out = ChannelWriter {
        buf: Vec::with_capacity(EXPORT_PIECE * 2),
        tx,
    };
    let mut zip = zip::ZipWriter::new_stream(out);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    for a in artifacts {
        zip.start_file(a.path.as_str(), opts).map_err(|e| io(&e))?;
        let mut stream = rt.block_on(blobs.stream(&a.blob_key, None))?;
        while let Some(piece) = rt.block_on(stream.next()) {
            let piece = piece.map_err(|e| io(&e))?;
            zip.write_all(&piece).map_err(|e| io(&e))?;
        }
    }
    let mut out = zip.finish().map_err(|e| io(&e))?;
    out.flush().map_err(|e| io(&e))?;
    tx.finish();
    Ok(())
}

/// The export's output buffer, shared between the CSV writer and the sender.
#[derive(Clone, Default)]
struct Shared(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A text cell as a CSV export writes it: one that a spreadsheet would read as a formula
/// (starting with `=`, `+`, `-`, `@`, a tab or a carriage return, OWASP's rule) gets a
/// leading `'`, so a device's log line cannot run in the reader's spreadsheet. Only such a
/// cell is copied. The JSON export keeps every value as logged.
fn csv_cell(cell: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match cell.first() {
        Some(b'=' | b'+' | b'-' | b'@' | b'\t' | b'\r') => {
            let mut v = Vec::with_capacity(cell.len() + 1);
            v.push(b'\'');
            v.extend_from_slice(cell);
            std::borrow::Cow::Owned(v)
        }
        _ => std::borrow::Cow::Borrowed(cell),
    }
}

pub(super) fn export_into(
    store: &Store,
    session: u64,
    f: &LogFilter,
    format: ExportFormat,
    tx: &Pieces,
) -> Result<()> {
    // No seal rewrites the session's chunks while they are read.
    let _pin = store.log_pin(session);
    let internal = |e: &dyn std::fmt::Display| Error::Internal(e.to_string());
    let mut n = 0usize;
    let mut ts_buf = String::with_capacity(24);
    let buf = Shared::default();
    let mut out = csv::WriterBuilder::new().from_writer(buf.clone());
    if format == ExportFormat::Csv {
        out.write_record(["timestamp", "level", "module", "message", "metadata"])
            .map_err(|e| internal(&e))?;
    } else {
        buf.0.borrow_mut().push(b'[');
    }
    merged(store, session, f, |chunk, i| {
        // Written straight from the chunk's columns: no allocation per entry.
        let (Some(ts), Some(level), Some(module), Some(message), Some(meta)) = (
            chunk.ts_at(i),
            chunk.level_at(i).and_then(|l| logs::LEVELS.get(l as usize)),
            chunk
                .module_at(i)
                .and_then(|m| chunk.modules.get(m as usize)),
            chunk.message(i),
            chunk.metadata(i),
        ) else {
            return Ok(true);
        };
        ts_buf.clear();
        write_ms(&mut ts_buf, ts);
        if format == ExportFormat::Csv {
            out.write_record([
                ts_buf.as_bytes(),
                level.as_bytes(),
                &csv_cell(module.as_bytes()),
                &csv_cell(message.as_bytes()),
                meta,
            ])
            .map_err(|e| internal(&e))?;
            // The CSV writer buffers; move its output along every so often.
            if n % 256 == 255 {
                out.flush().map_err(|e| internal(&e))?;
            }
        } else {
            let mut b = buf.0.borrow_mut();
            if n > 0 {
                b.push(b',');
            }
            b.extend_from_slice(b"{\"timestamp\":\"");
            b.extend_from_slice(ts_buf.as_bytes());
            b.extend_from_slice(b"\",\"level\":\"");
            b.extend_from_slice(level.as_bytes());
            b.extend_from_slice(b"\",\"module\":");
            serde_json::to_writer(&mut *b, module).map_err(|e| internal(&e))?;
            b.extend_from_slice(b",\"message\":");
            serde_json::to_writer(&mut *b, message).map_err(|e| internal(&e))?;
            b.extend_from_slice(b",\"metadata\":");
            b.extend_from_slice(meta);
            b.push(b'}');
        }
        if buf.0.borrow().len() >= EXPORT_PIECE {
            let piece = std::mem::take(&mut *buf.0.borrow_mut());
            if !tx.send(Ok(bytes::Bytes::from(piece))) {
                return Ok(false); // the client went away or stopped reading
            }
        }
        n += 1;
        Ok(true)
    })?;
    out.flush().map_err(|e| internal(&e))?;
    if format == ExportFormat::Json {
        buf.0.borrow_mut().push(b']');
    }
    let rest = std::mem::take(&mut *buf.0.borrow_mut());
    if tx.send(Ok(bytes::Bytes::from(rest))) {
        tx.finish();
    }
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use fleetops_storage::{LogChunk, SessionCounters};

    #[test]
    fn csv_cells_that_a_spreadsheet_would_run_are_quoted() {
        for (cell, out) in [
            ("=1+1", "'=1+1"),
            ("+cmd", "'+cmd"),
            ("-2", "'-2"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tx", "'\tx"),
            ("\rx", "'\rx"),
            ("motor =hot", "motor =hot"),
            ("", ""),
        ] {
            assert_eq!(&*csv_cell(cell.as_bytes()), out.as_bytes(), "{cell:?}");
        }
        assert!(matches!(csv_cell(b"plain"), std::borrow::Cow::Borrowed(_)));
    }

    /// The merge emits exactly what a full sort of every match would, in the same order,
    /// with chunks in and out of time order, overlapping, and tied timestamps.
    #[test]
    fn the_merge_matches_a_full_sort() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut x: u64 = 9;
        let mut rand = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let mut all = Vec::new();
        for seq in 1..=60u64 {
            let mut c = LogChunk::default();
            // Mostly advancing time, some chunks reaching far back or spanning widely.
            let base = seq as i64 * 100 - if seq % 7 == 0 { 3000 } else { 0 };
            for i in 0..(1 + rand(40)) {
                let ts = base + rand(if seq % 11 == 0 { 5000 } else { 150 }) as i64;
                let level = rand(4) as u8;
                c.push(ts, level, 0, &format!("m{seq}-{i}"), b"{}").unwrap();
                all.push((ts, seq, i as u32, level));
            }
            c.modules.push("core".into());
            store
                .append_chunk(7, &c, &SessionCounters::default(), seq)
                .unwrap();
        }
        // A tie where a chunk opened early (62, from 5) meets one not yet open (61, from
        // 1,000,000) at the latter's first timestamp: the lower chunk number goes first.
        for (seq, stamps) in [(61u64, vec![1_000_000i64]), (62, vec![5, 1_000_000])] {
            let mut c = LogChunk::default();
            for (i, ts) in stamps.into_iter().enumerate() {
                c.push(ts, 1, 0, &format!("m{seq}-{i}"), b"{}").unwrap();
                all.push((ts, seq, i as u32, 1));
            }
            c.modules.push("core".into());
            store
                .append_chunk(7, &c, &SessionCounters::default(), seq)
                .unwrap();
        }
        for f in [
            LogFilter::default(),
            LogFilter {
                levels: 1 << 2 | 1 << 3,
                since: Some(1500),
                until: Some(4000),
                ..LogFilter::default()
            },
        ] {
            let mut want: Vec<(i64, u64, u32)> = all
                .iter()
                .filter(|(ts, _, _, lv)| {
                    (f.levels == 0 || f.levels & (1 << lv) != 0)
                        && f.since.is_none_or(|s| *ts >= s)
                        && f.until.is_none_or(|u| *ts < u)
                })
                .map(|&(ts, seq, i, _)| (ts, seq, i))
                .collect();
            want.sort_unstable();
            let mut got = Vec::new();
            merged(&store, 7, &f, |chunk, i| {
                let msg = chunk.message(i).unwrap();
                let (seq, idx) = msg[1..].split_once('-').unwrap();
                got.push((
                    chunk.ts_at(i).unwrap(),
                    seq.parse().unwrap(),
                    idx.parse().unwrap(),
                ));
                Ok(true)
            })
            .unwrap();
            assert_eq!(got, want, "{f:?}");
        }
    }

    const MODULES: [&str; 3] = ["drive", "nav", "arm"];

    /// A session of 6 to 45 random chunks (levels, modules, words, some clocks jumping back);
    /// its entry count and every timestamp stored.
    fn random_session(
        store: &Store,
        sid: u64,
        narrow: bool,
        rand: &mut impl FnMut(u64) -> u64,
    ) -> (u64, Vec<i64>) {
        let modules = MODULES;
        let mut count = 0u64;
        let mut stamps = Vec::new();
        for seq in 1..=(5 + rand(40)) {
            let mut c = LogChunk::default();
            let base = seq as i64 * 100 - if rand(5) == 0 { 2_000 } else { 0 };
            let used = 1 + rand(3) as usize;
            c.modules = modules[..used].iter().map(|m| m.to_string()).collect();
            for i in 0..(1 + rand(60)) {
                let span = if rand(9) == 0 { 4_000 } else { 150 };
                let ts = if narrow {
                    rand(12) as i64
                } else {
                    base + rand(span) as i64
                };
                stamps.push(ts);
                let word =
                    ["motor", "tick", "Battery low", "stall", "Ställ ΟΔΟΣ"][rand(5) as usize];
                c.push(
                    ts,
                    rand(4) as u8,
                    rand(used as u64) as u32,
                    &format!("{word} {seq}-{i}"),
                    b"{}",
                )
                .unwrap();
            }
            count += c.len() as u64;
            let counters = SessionCounters {
                log_count: count,
                next_chunk: seq + 1,
                ..SessionCounters::default()
            };
            store.append_chunk(sid, &c, &counters, seq).unwrap();
        }
        (count, stamps)
    }

    /// A random query: levels, a module, a search (frequent, absent, one line's own text),
    /// time bounds on and off stored timestamps.
    fn random_filter(stamps: &[i64], rand: &mut impl FnMut(u64) -> u64) -> LogFilter {
        let modules = MODULES;
        let bound = |r: &mut dyn FnMut(u64) -> u64| match r(3) {
            0 => None,
            1 => Some(r(5_000) as i64),
            _ => Some(stamps[r(stamps.len() as u64) as usize]),
        };
        let since = bound(&mut *rand);
        let until = bound(&mut *rand);
        LogFilter {
            levels: if rand(2) == 0 { 0 } else { rand(16) as u8 },
            module: (rand(2) == 0).then(|| modules[rand(4).min(2) as usize].to_string()),
            // Frequent words, absent ones, and one stored line's own text (found in one
            // chunk: what the text filters rule the others out for).
            search: (rand(3) == 0).then(|| {
                let seq = 1 + rand(45);
                let line = format!("{seq}-{} ", rand(30));
                [
                    "motor".to_string(),
                    "battery".into(),
                    "nothing".into(),
                    "ΟΔΟΣ".into(),
                    "äll".into(),
                    line.trim_end().into(),
                    format!("y low {line}"),
                ][rand(7) as usize]
                    .to_lowercase()
            }),
            since,
            until,
        }
    }

    /// Every answer to `f`: the page's (timestamp, message) and total, and the merge's order.
    fn answer(
        store: &Store,
        sid: u64,
        f: &LogFilter,
        limit: usize,
        offset: usize,
    ) -> (usize, Vec<(String, String)>, Vec<String>) {
        let page = query(store, sid, f, limit, offset).unwrap();
        let mut all = Vec::new();
        merged(store, sid, f, |c, i| {
            all.push(c.message(i).unwrap().to_string());
            Ok(true)
        })
        .unwrap();
        (
            page.total,
            page.items
                .iter()
                .map(|e| (e.timestamp.clone(), e.message.clone()))
                .collect(),
            all,
        )
    }

    #[test]
    fn sealed_chunks_answer_as_the_batches_did() {
        let mut x: u64 = 4242;
        let mut rand = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let (mut merges, mut offloaded) = (0, 0);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        for round in 0..12u64 {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(&dir.path().join("data")).unwrap();
            // Every other round seals into segments of a blob store, read back with a cache
            // that holds two chunks at most (most reads are fetches).
            if round % 2 == 1 {
                let blobs = BlobStore::local(&dir.path().join("blobs")).unwrap();
                store.attach_segments(blobs, rt.handle().clone(), 2_000);
            }
            let sid = 7;
            store
                .put_session(&fleetops_storage::Session {
                    id: sid,
                    project_id: 1,
                    device_id: 1,
                    device_name: "d".into(),
                    status: fleetops_storage::SessionStatus::Active,
                    started_at: 0,
                    ended_at: None,
                    tags: vec![],
                    package_id: None,
                })
                .unwrap();
            let (_, stamps) = random_session(&store, sid, round % 3 == 0, &mut rand);
            let asks: Vec<(LogFilter, usize, usize)> = (0..40)
                .map(|_| {
                    let f = random_filter(&stamps, &mut rand);
                    (
                        f,
                        1 + rand(120) as usize,
                        rand(3) as usize * rand(50) as usize,
                    )
                })
                .collect();
            let before: Vec<_> = asks
                .iter()
                .map(|(f, l, o)| answer(&store, sid, f, *l, *o))
                .collect();
            // Sealed in a few rounds of a random size, into chunks of a random size.
            let plan = fleetops_storage::sessions::seal::SealPlan {
                chunk_lines: 50 + rand(450) as usize,
                chunk_bytes: 1 << 20,
                max_source_bytes: 500 + rand(20_000) as usize,
                commit_wait: std::time::Duration::from_secs(1),
            };
            loop {
                let done = store.seal_logs(sid, plan).unwrap().unwrap();
                merges += done.sources - done.chunks;
                offloaded += usize::from(done.offloaded);
                if !done.more {
                    break;
                }
            }
            for ((f, l, o), want) in asks.iter().zip(&before) {
                assert_eq!(
                    &answer(&store, sid, f, *l, *o),
                    want,
                    "round {round}: {f:?} {plan:?}"
                );
            }
        }
        assert!(merges > 50, "{merges} batches merged");
        assert!(offloaded >= 6, "{offloaded} seals wrote segments");
    }

    /// The answer from summaries equals the answer from reading every chunk (the page, in
    /// order, and `total`), over random sessions and random filters; a session whose
    /// summaries do not account for every entry is answered by the full read, and an empty
    /// one by neither.
    #[test]
    fn summaries_answer_as_a_full_scan_would() {
        let mut x: u64 = 77;
        let mut rand = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let mut ruled_out = 0;
        for round in 0..12u64 {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let sid = 7;
            // Some rounds on a narrow clock, so that equal timestamps across chunks are common.
            let (count, stamps) = random_session(&store, sid, round % 3 == 0, &mut rand);
            // The summary path is the one under test: the summaries account for every entry.
            let summarized: u64 = store
                .log_summaries(sid)
                .unwrap()
                .iter()
                .map(|(_, s)| s.len())
                .sum();
            assert_eq!(summarized, count);
            for _ in 0..60 {
                let f = random_filter(&stamps, &mut rand);
                let (limit, offset) =
                    (1 + rand(120) as usize, rand(3) as usize * rand(50) as usize);
                if let Some(needle) = f.search.as_deref() {
                    ruled_out += store.log_chunks_without(sid, needle).unwrap().len();
                }
                let got = query(&store, sid, &f, limit, offset).unwrap();
                let want = query_scan(&store, sid, &f, limit, offset).unwrap();
                let key = |p: &LogPage| {
                    p.items
                        .iter()
                        .map(|e| (e.timestamp.clone(), e.message.clone()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(got.total, want.total, "round {round}: {f:?}");
                // The exports' merge (which the text filters prune too) yields every match
                // in the same order.
                let mut merged_all = Vec::new();
                merged(&store, sid, &f, |c, i| {
                    merged_all.push((c.ts_at(i).unwrap(), c.message(i).unwrap().to_string()));
                    Ok(true)
                })
                .unwrap();
                let every = query_scan(&store, sid, &f, 1 << 20, 0).unwrap();
                assert_eq!(merged_all.len(), every.total, "round {round}: {f:?}");
                let msgs: Vec<&str> = merged_all.iter().map(|m| m.1.as_str()).collect();
                let want_msgs: Vec<&str> = every.items.iter().map(|e| e.message.as_str()).collect();
                assert_eq!(msgs, want_msgs, "round {round}: {f:?}");
                assert_eq!(
                    key(&got),
                    key(&want),
                    "round {round}: {f:?} {limit} {offset}"
                );
            }
        }
        // The text filters took part: they ruled chunks out, and no answer changed.
        assert!(ruled_out > 100, "{ruled_out} chunks ruled out");
    }

    #[test]
    fn an_empty_session_and_one_without_whole_summaries() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let f = LogFilter::default();
        let p = query(&store, 9, &f, 10, 0).unwrap();
        assert_eq!((p.total, p.items.len()), (0, 0));
        // Counters that claim more than the summaries hold (as for chunks stored before
        // summaries existed): the full read answers, and answers the same.
        let mut c = LogChunk::default();
        c.modules.push("core".into());
        for i in 0..5 {
            c.push(100 - i, 1, 0, &format!("m{i}"), b"{}").unwrap();
        }
        let counters = SessionCounters {
            log_count: 6,
            ..SessionCounters::default()
        };
        store.append_chunk(9, &c, &counters, 1).unwrap();
        let p = query(&store, 9, &f, 2, 1).unwrap();
        let want = query_scan(&store, 9, &f, 2, 1).unwrap();
        assert_eq!(p.total, 5);
        let msgs: Vec<&str> = p.items.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(msgs, ["m3", "m2"]);
        assert_eq!(want.total, 5);
    }
}
