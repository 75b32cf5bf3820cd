//! The live log stream: what a session actor broadcasts and what a subscriber receives.
//!
//! The actor sends each stored batch once (an `Arc`, with its frames serialized once for all
//! subscribers) to every subscriber's own queue. A queue is bounded in batches
//! (`subscriber_queue`) and in bytes (`subscriber_queue_bytes`): a subscriber that does not
//! read is skipped (the batch is not queued for it) and learns how many entries it missed from
//! the arrival sequence numbers, so one stalled viewer holds a bounded amount of memory and
//! ingestion and other subscribers never wait for it.
//!
//! A batch larger than the byte bound alone still goes to an empty queue. A subscriber that was
//! skipped is told how far (`lagged`, with the number of entries) once its queue is empty,
//! and before the end; the end (the session completed, failed or deleted) is never skipped.
//! `fleetops_live_batches_skipped` counts the batches not queued. When the session's actor
//! restarts, each feed ends and the edge picks it up again from the next arrival index
//! (`SessionsHandle::resume`), so a subscriber misses nothing the replay buffer still holds.
//!
//! With several nodes, a session's actor on each node also fans out the batches the other
//! nodes stored (`session::remote`), in arrival order, filling a gap from the store.
//!
//! Tested through the WebSocket (`tests/api/live.rs`: replay, order and filters, a stalled
//! subscriber bounded in batches and in bytes while others go on, a resume after the actor
//! restarts).

use fleetops_storage::Columns;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use fleetops_storage::LogChunk;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::logs::{LogFilter, entry};

/// One stored batch as the live stream sees it.
pub struct LiveBatch {
    /// Arrival index of the batch's first entry in the session.
    pub first_seq: u64,
    pub chunk: Arc<LogChunk>,
    /// `{"type":"log",...}` per entry, serialized once.
    pub frames: Vec<Bytes>,
}

impl LiveBatch {
    /// Arrival index just past the batch's last entry.
    pub fn end_seq(&self) -> u64 {
        self.first_seq + self.chunk.len() as u64
    }

    /// What the batch holds in memory, about.
    pub fn bytes(&self) -> usize {
        self.frames.iter().map(|f| f.len() + 32).sum::<usize>()
            + self.chunk.text.len()
            + self.chunk.meta.len()
            + self.chunk.len() * 16
    }
}

/// One subscriber's queue, as the actor sees it.
struct Sink {
    tx: mpsc::UnboundedSender<(LiveEvent, usize)>,
    queued: Arc<Queued>,
}

#[derive(Default)]
struct Queued {
    bytes: AtomicUsize,
    batches: AtomicUsize,
    /// The end of the newest batch skipped (0: none since last told).
    skipped_to: AtomicU64,
}

/// The receiving end of one subscriber's queue.
pub struct LiveFeed {
    rx: mpsc::UnboundedReceiver<(LiveEvent, usize)>,
    queued: Arc<Queued>,
}

impl LiveFeed {
    /// The next event; `None` once the actor is gone (it restarted or stopped). Once the
    /// queue is empty, batches skipped for this subscriber are told before waiting.
    pub async fn recv(&mut self) -> Option<LiveEvent> {
        let (ev, bytes) = match self.rx.try_recv() {
            Ok(x) => x,
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) => {
                let to = self.queued.skipped_to.swap(0, Ordering::Relaxed);
                if to > 0 {
                    return Some(LiveEvent::Skipped(to));
                }
                self.rx.recv().await?
            }
        };
        self.queued.bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.queued.batches.fetch_sub(1, Ordering::Relaxed);
        Some(ev)
    }
}

/// The live subscribers of one session and their bounded queues.
pub struct Fanout {
    sinks: Vec<Sink>,
    max_batches: usize,
    max_bytes: usize,
    /// Batches not queued for a subscriber that was too far behind (for `/metrics`).
    skipped: Arc<AtomicU64>,
}

impl Fanout {
    pub fn new(max_batches: usize, max_bytes: usize, skipped: Arc<AtomicU64>) -> Self {
        Self {
            sinks: Vec::new(),
            max_batches: max_batches.max(1),
            max_bytes: max_bytes.max(1),
            skipped,
        }
    }

    pub fn subscribe(&mut self) -> LiveFeed {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(Queued::default());
        self.sinks.push(Sink {
            tx,
            queued: queued.clone(),
        });
        LiveFeed { rx, queued }
    }

    /// Whether anyone listens (subscribers that left are forgotten here).
    pub fn listening(&mut self) -> bool {
        self.sinks.retain(|s| !s.tx.is_closed());
        !self.sinks.is_empty()
    }

    /// Queues the batch for every subscriber with room for it.
    pub fn batch(&mut self, b: Arc<LiveBatch>) {
        let bytes = b.bytes();
        for s in &self.sinks {
            let q = &s.queued;
            let full = q.batches.load(Ordering::Relaxed) >= self.max_batches
                || q.bytes.load(Ordering::Relaxed) + bytes > self.max_bytes;
            // A batch alone larger than the byte bound still goes to an empty queue.
            if full && q.batches.load(Ordering::Relaxed) > 0 {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                q.skipped_to
                    .fetch_max(b.first_seq + b.chunk.len() as u64, Ordering::Relaxed);
                continue;
            }
            q.bytes.fetch_add(bytes, Ordering::Relaxed);
            q.batches.fetch_add(1, Ordering::Relaxed);
            if s.tx.send((LiveEvent::Batch(b.clone()), bytes)).is_err() {
                q.bytes.fetch_sub(bytes, Ordering::Relaxed);
                q.batches.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The end, to every subscriber (never skipped), after telling a subscriber that was
    /// skipped how far (an end queued behind its batches would otherwise hide the gap).
    pub fn end(&mut self, status: Option<&'static str>) {
        for s in &self.sinks {
            let to = s.queued.skipped_to.swap(0, Ordering::Relaxed);
            if to > 0 {
                s.queued.batches.fetch_add(1, Ordering::Relaxed);
                let _ = s.tx.send((LiveEvent::Skipped(to), 0));
            }
            s.queued.batches.fetch_add(1, Ordering::Relaxed);
            let _ = s.tx.send((LiveEvent::Ended(status), 0));
        }
    }
}

#[derive(Clone)]
pub enum LiveEvent {
    Batch(Arc<LiveBatch>),
    /// Batches up to this arrival index were not queued for this subscriber (it was too far
    /// behind); told once its queue is empty.
    Skipped(u64),
    /// The session ended with this status (`None`: it was deleted).
    Ended(Option<&'static str>),
}

#[derive(Serialize)]
struct LogFrame<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    timestamp: &'a str,
    level: &'a str,
    module: &'a str,
    message: &'a str,
    metadata: &'a RawValue,
}

/// The frames of every entry of a chunk.
pub fn frames(chunk: &LogChunk) -> Vec<Bytes> {
    let all: Vec<usize> = (0..chunk.len()).collect();
    frames_of(chunk, &all)
}

pub fn lagged_frame(dropped: u64) -> Bytes {
    Bytes::from(format!("{{\"type\":\"lagged\",\"dropped\":{dropped}}}"))
}

pub fn ended_frame(status: &str) -> Bytes {
    Bytes::from(format!(
        "{{\"type\":\"session_ended\",\"status\":\"{status}\"}}"
    ))
}

/// The frames of the batch's entries that pass the subscriber's filter.
pub fn matching_frames<'a>(b: &'a LiveBatch, f: &LogFilter) -> impl Iterator<Item = &'a Bytes> {
    let hits = f.matches(b.chunk.as_ref());
    hits.into_iter().filter_map(move |i| b.frames.get(i))
}

/// The last `n` matching entries of `chunks` (oldest first), as frames.
pub fn replay_frames(chunks: &[Arc<LogChunk>], f: &LogFilter, n: usize) -> Vec<Bytes> {
    let mut out: Vec<Bytes> = Vec::new();
    for c in chunks.iter().rev() {
        if out.len() >= n {
            break;
        }
        let hits = f.matches(c.as_ref());
        let fr = frames_of(c, &hits);
        for frame in fr.into_iter().rev() {
            if out.len() >= n {
                break;
            }
            out.push(frame);
        }
    }
    out.reverse();
    out
}

/// The frames of the entries `idx` of a chunk.
pub fn frames_of(c: &LogChunk, idx: &[usize]) -> Vec<Bytes> {
    idx.iter()
        .filter_map(|&i| {
            let e = entry(c, i)?;
            serde_json::to_vec(&LogFrame {
                kind: "log",
                timestamp: &e.timestamp,
                level: e.level,
                module: &e.module,
                message: &e.message,
                metadata: &e.metadata,
            })
            .ok()
            .map(Bytes::from)
        })
        .collect()
}

/// What a new subscriber gets: its replay, then the live feed (or the end).
pub struct Subscription {
    pub replay: Vec<Bytes>,
    /// Arrival index of the next entry the feed will carry.
    pub next_seq: u64,
    pub feed: Option<LiveFeed>,
    /// Set when the session is not active: send the replay, this status, and close.
    pub ended: Option<&'static str>,
}
