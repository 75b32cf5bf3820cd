//! The replay side of a session: the ring of recent batches, catching up what was
//! stored while a subscriber lagged, fan-out to subscribers, and batches other nodes stored.

use super::*;

/// A status named by another node, as this build names it.
pub(super) fn ended_status(s: &str) -> &'static str {
    match s {
        "failed" => SessionStatus::Failed.as_str(),
        _ => SessionStatus::Completed.as_str(),
    }
}

pub(super) type Ring = VecDeque<(u64, Arc<LogChunk>)>;

/// The replay buffer as `remember` would have left it: the newest chunks, the newest always,
/// older ones within `buffer_entries` and `buffer_bytes`; with its entries and bytes.
pub(super) fn rebuild_ring(
    store: &Store,
    id: u64,
    cfg: &SessionsConfig,
    log_count: u64,
) -> fleetops_storage::Result<(Ring, usize, usize)> {
    // No seal rewrites the chunks while the newest are read back.
    let _pin = store.log_pin(id);
    let mut ring = VecDeque::new();
    let (mut ring_entries, mut ring_bytes) = (0, 0);
    let mut next = log_count;
    for item in store.log_chunks_rev(id) {
        if ring_entries >= cfg.buffer_entries {
            break;
        }
        let (_, chunk) = item?;
        let bytes = ring_bytes_of(&chunk);
        if !ring.is_empty() && ring_bytes + bytes > cfg.buffer_bytes {
            break;
        }
        next = next.saturating_sub(chunk.len() as u64);
        ring_entries += chunk.len();
        ring_bytes += bytes;
        ring.push_front((next, Arc::new(chunk)));
    }
    Ok((ring, ring_entries, ring_bytes))
}

/// What a batch kept for replay holds in memory, about: its text, its metadata and 16 bytes
/// an entry of fixed columns.
pub(super) fn ring_bytes_of(chunk: &LogChunk) -> usize {
    chunk.text.len() + chunk.meta.len() + chunk.len() * 16
}

impl SessionState {
    /// Starts taking the other nodes' messages about this session (a first live subscriber
    /// here), and fans out what they stored before.
    pub(super) async fn listen(&mut self, myself: &ActorRef<Envelope<SessionMsg>>) {
        match self.bus.subscribe(&remote::subject(self.id)).await {
            Err(e) => {
                // Subscribers here get the other nodes' batches from the store, every second.
                tracing::warn!(session = self.id, error = %e, "not listening to the other nodes");
            }
            Ok(mut sub) => {
                let (me, queued) = (myself.clone(), self.remote_bytes.clone());
                self.listening = Some(crate::bus::Listener::spawn(async move {
                    use std::sync::atomic::Ordering::Relaxed;
                    while let Some(m) = sub.next().await {
                        let len = m.payload.len();
                        if queued.fetch_add(len, Relaxed) + len > MAX_REMOTE_BYTES {
                            // Dropped: the gap is read back from the store.
                            queued.fetch_sub(len, Relaxed);
                            continue;
                        }
                        if me
                            .cast(Envelope::cast(SessionMsg::Remote(m.payload)))
                            .is_err()
                        {
                            break;
                        }
                    }
                }));
            }
        }
        self.catch_up_stored();
    }

    /// A message from the same session's actor on another node.
    pub(super) fn remote(&mut self, myself: &ActorRef<Envelope<SessionMsg>>, m: &bytes::Bytes) {
        match remote::parse(m) {
            Some(remote::Remote::Batch(first_seq, chunk_seq, chunk)) => {
                self.deliver(first_seq, chunk_seq, Arc::new(*chunk));
            }
            Some(remote::Remote::Notice(first_seq, n, chunk_seq)) => {
                self.catch_up(first_seq + n, chunk_seq + 1);
            }
            Some(remote::Remote::End(status)) => {
                self.catch_up_stored();
                self.live.end(status.as_deref().map(ended_status));
                myself.stop(None);
            }
            None => {}
        }
    }

    /// Fans out every stored batch past `seen` (several nodes: what the bus did not bring).
    pub(super) fn catch_up_stored(&mut self) {
        if !self.bus.is_shared() {
            return;
        }
        if let Ok(c) = self.store.session_counters(self.id) {
            self.catch_up(c.log_count, u64::MAX);
        }
    }

    /// A stored batch, this node's or another's, in arrival order: one already fanned out is
    /// passed over; one past a gap (the bus lost a batch, or this node's append came after
    /// another node's) first brings the missing batches back from the store.
    pub(super) fn deliver(&mut self, first_seq: u64, chunk_seq: u64, chunk: Arc<LogChunk>) {
        let end = first_seq + chunk.len() as u64;
        if end <= self.seen {
            return;
        }
        if first_seq > self.seen {
            self.catch_up(first_seq, chunk_seq);
        }
        self.fan_out(first_seq, chunk);
        self.seen = self.seen.max(end);
        // Another node's batch right after what this actor last wrote or read: the next
        // append here starts after it without a lost race.
        if self.counters.log_count == first_seq && self.counters.next_chunk <= chunk_seq {
            self.counters.log_count = end;
            self.counters.next_chunk = chunk_seq + 1;
        }
    }

    /// Fans out the stored batches from `seen` up to arrival index `to`, which ends with the
    /// chunk before `below` (at most `buffer_entries` entries, the newest: a subscriber told
    /// of a larger gap sees it as lagged).
    pub(super) fn catch_up(&mut self, to: u64, below: u64) {
        if to <= self.seen {
            return;
        }
        let mut missing = Vec::new();
        let mut entries = 0;
        let mut end = to;
        let _pin = self.store.log_pin(self.id);
        // Sealed chunks may be merged, so their entries no longer count back from `to`: a gap
        // reaching them is left for the subscriber to see as lagged.
        let sealed_below = self.store.log_seal_cursor(self.id).unwrap_or(u64::MAX);
        for item in self.store.log_chunks_rev(self.id) {
            let Ok((seq, c)) = item else { break };
            if seq >= below {
                continue;
            }
            if seq < sealed_below {
                break;
            }
            if end <= self.seen || entries >= self.cfg.buffer_entries {
                break;
            }
            let first = end.saturating_sub(c.len() as u64);
            entries += c.len();
            missing.push((first, Arc::new(c)));
            end = first;
        }
        drop(_pin);
        for (first, c) in missing.into_iter().rev() {
            let n = c.len() as u64;
            if first >= self.seen {
                self.fan_out(first, c);
            }
            self.seen = self.seen.max(first + n);
        }
        self.seen = self.seen.max(to);
    }

    /// After a written batch: keep it for replay and send it to live subscribers.
    pub(super) fn fan_out(&mut self, first_seq: u64, chunk: Arc<LogChunk>) {
        #[cfg(feature = "fault-injection")]
        if std::mem::take(&mut self.panic_after_write) {
            panic!("injected fault in SessionActor {} after a write", self.id);
        }
        self.remember(first_seq, chunk.clone());
        if self.live.listening() {
            let frames = live::frames(&chunk);
            self.live.batch(Arc::new(LiveBatch {
                first_seq,
                chunk,
                frames,
            }));
        }
    }

    /// Keeps the batch for replay, dropping the oldest while enough entries remain without
    /// it, or while the ring holds more than `buffer_bytes` (the newest batch always stays:
    /// a few large entries must not hold gigabytes a session).
    pub(super) fn remember(&mut self, first_seq: u64, chunk: Arc<LogChunk>) {
        self.ring_entries += chunk.len();
        self.ring_bytes += ring_bytes_of(&chunk);
        self.ring.push_back((first_seq, chunk));
        while let Some((_, oldest)) = self.ring.front() {
            let enough = self.ring_entries - oldest.len() >= self.cfg.buffer_entries;
            let too_big = self.ring_bytes > self.cfg.buffer_bytes && self.ring.len() > 1;
            if !enough && !too_big {
                break;
            }
            self.ring_entries -= oldest.len();
            self.ring_bytes = self.ring_bytes.saturating_sub(ring_bytes_of(oldest));
            self.ring.pop_front();
        }
    }

    pub(super) fn subscribe(&mut self, replay: Replay, filter: &LogFilter) -> Subscription {
        let frames = match replay {
            Replay::Last(n) => {
                let chunks: Vec<Arc<LogChunk>> = self.ring.iter().map(|(_, c)| c.clone()).collect();
                live::replay_frames(&chunks, filter, n)
            }
            Replay::Since(from) => self
                .ring
                .iter()
                .filter(|(first, c)| first + c.len() as u64 > from)
                .flat_map(|(first, c)| {
                    // Only the entries from `from` on that pass the filter are serialized.
                    let skip = from.saturating_sub(*first) as usize;
                    let wanted: Vec<usize> = filter
                        .matches(c.as_ref())
                        .into_iter()
                        .filter(|i| *i >= skip)
                        .collect();
                    live::frames_of(c, &wanted)
                })
                .collect(),
        };
        Subscription {
            replay: frames,
            next_seq: self.seen,
            feed: if self.open {
                Some(self.live.subscribe())
            } else {
                None
            },
            ended: if self.open {
                None
            } else {
                self.ended.or(Some("completed"))
            },
        }
    }
}
