//! The live log stream: what a session actor broadcasts and what a subscriber receives.
//!
//! The actor broadcasts each stored batch once (an `Arc`, with its frames serialized once for
//! all subscribers) on a tokio broadcast channel. A subscriber that falls more than
//! `subscriber_queue` batches behind loses the oldest ones and learns how many entries it
//! missed from the arrival sequence numbers; ingestion and other subscribers never wait for it.

use std::sync::Arc;

use bytes::Bytes;
use fleetops_storage::LogChunk;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::logs::{LogFilter, entry};

/// One stored batch as the live stream sees it.
pub struct LiveBatch {
    /// Arrival index of the batch's first entry in the session.
    pub first_seq: u64,
    pub chunk: Arc<LogChunk>,
    /// `{"type":"log",...}` per entry, serialized once.
    pub frames: Vec<Bytes>,
}

#[derive(Clone)]
pub enum LiveEvent {
    Batch(Arc<LiveBatch>),
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
    let hits = f.matches(&b.chunk);
    hits.into_iter().filter_map(move |i| b.frames.get(i))
}

/// The last `n` matching entries of `chunks` (oldest first), as frames.
pub fn replay_frames(chunks: &[Arc<LogChunk>], f: &LogFilter, n: usize) -> Vec<Bytes> {
    let mut out: Vec<Bytes> = Vec::new();
    for c in chunks.iter().rev() {
        if out.len() >= n {
            break;
        }
        let hits = f.matches(c);
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
    pub feed: Option<tokio::sync::broadcast::Receiver<LiveEvent>>,
    /// Set when the session is not active: send the replay, this status, and close.
    pub ended: Option<&'static str>,
}
