//! Log query pages and the streamed exports (JSON, CSV, NDJSON) and artifact ZIPs, each
//! written on a blocking thread into a bounded channel the response streams from.

use crate::clock::write_ms;
use crate::error::{Error, Result};
use crate::logs::{self, LogFilter};
use crate::views::LogPage;
use fleetops_storage::{Artifact, BlobStore, Store};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Json,
    Csv,
}

/// Pieces of an export body, each about 64 KiB.
pub type ExportStream = tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>;

const EXPORT_PIECE: usize = 64 * 1024;

/// Chunks decoded and kept while exporting (timestamps out of arrival order revisit chunks).
const EXPORT_CHUNK_CACHE: usize = 32;

/// The sort keys (timestamp, chunk, index) of every match, ascending.
fn sorted_hits(store: &Store, session: u64, f: &LogFilter) -> Result<Vec<(i64, u64, u32)>> {
    let mut hits: Vec<(i64, u64, u32)> = Vec::new();
    for item in store.log_chunks(session) {
        let (seq, chunk) = item?;
        for i in f.matches(&chunk) {
            if let Some(ts) = chunk.ts_at(i) {
                hits.push((ts, seq, i as u32));
            }
        }
    }
    hits.sort_unstable();
    Ok(hits)
}

/// A `Write` that sends what it is given down the channel in pieces.
struct ChannelWriter<'a> {
    buf: Vec<u8>,
    tx: &'a tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
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
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))
    }
}

pub(super) fn zip_into(
    rt: &tokio::runtime::Handle,
    blobs: &BlobStore,
    artifacts: &[Artifact],
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
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

pub(super) fn export_into(
    store: &Store,
    session: u64,
    f: &LogFilter,
    format: ExportFormat,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) -> Result<()> {
    let internal = |e: &dyn std::fmt::Display| Error::Internal(e.to_string());
    let hits = sorted_hits(store, session, f)?;
    let mut cache: Vec<(u64, Arc<fleetops_storage::LogChunk>)> = Vec::new();
    let mut ts_buf = String::with_capacity(24);
    let buf = Shared::default();
    let mut out = csv::WriterBuilder::new().from_writer(buf.clone());
    if format == ExportFormat::Csv {
        out.write_record(["timestamp", "level", "module", "message", "metadata"])
            .map_err(|e| internal(&e))?;
    } else {
        buf.0.borrow_mut().push(b'[');
    }
    for (n, (_, seq, i)) in hits.iter().enumerate() {
        let chunk = match cache.iter().find(|(s, _)| s == seq) {
            Some((_, c)) => c.clone(),
            None => {
                let Some(c) = store.log_chunk(session, *seq)? else {
                    continue;
                };
                let c = Arc::new(c);
                if cache.len() >= EXPORT_CHUNK_CACHE {
                    cache.remove(0);
                }
                cache.push((*seq, c.clone()));
                c
            }
        };
        let i = *i as usize;
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
            continue;
        };
        ts_buf.clear();
        write_ms(&mut ts_buf, ts);
        if format == ExportFormat::Csv {
            out.write_record([
                ts_buf.as_bytes(),
                level.as_bytes(),
                module.as_bytes(),
                message.as_bytes(),
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
            if tx.blocking_send(Ok(bytes::Bytes::from(piece))).is_err() {
                return Ok(()); // the client went away
            }
        }
    }
    out.flush().map_err(|e| internal(&e))?;
    if format == ExportFormat::Json {
        buf.0.borrow_mut().push(b']');
    }
    let rest = std::mem::take(&mut *buf.0.borrow_mut());
    let _ = tx.blocking_send(Ok(bytes::Bytes::from(rest)));
    Ok(())
}

pub(super) fn query(
    store: &Store,
    session: u64,
    f: &LogFilter,
    limit: usize,
    offset: usize,
) -> Result<LogPage> {
    // The first `offset + limit` matches in time order, kept in a bounded max-heap: memory
    // grows with the page asked for, not with the number of matches.
    let keep = offset.saturating_add(limit);
    let mut heap: std::collections::BinaryHeap<(i64, u64, u32)> =
        std::collections::BinaryHeap::with_capacity(keep.min(1 << 16) + 1);
    let mut total = 0usize;
    for item in store.log_chunks(session) {
        let (seq, chunk) = item?;
        for i in f.matches(&chunk) {
            let Some(ts) = chunk.ts_at(i) else { continue };
            total += 1;
            let key = (ts, seq, i as u32);
            if heap.len() < keep {
                heap.push(key);
            } else if heap.peek().is_some_and(|top| key < *top) {
                heap.pop();
                heap.push(key);
            }
        }
    }
    let page: Vec<(i64, u64, u32)> = heap
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
