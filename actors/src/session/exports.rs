//! The streamed exports of a session's lines (JSON, CSV) and artifact ZIPs, each
//! written on a blocking thread into a bounded channel the response streams from. Log search
//! (a page of matches) is `search`.

use crate::clock::write_ms;
use crate::error::{Error, Result};
use crate::logs::{self, LogFilter};
use fleetops_storage::{Artifact, BlobStore, Columns, Store};

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Json,
    Csv,
}

/// A download streamed from a blocking thread: its pieces, and whether the last was sent (a
/// stream that ends without it was cut short, and its response must not end cleanly).
pub struct ExportStream {
    pub rx: tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>,
    pub done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Pieces of an export body, each about 64 KiB.
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

#[cfg(test)]
mod tests;
