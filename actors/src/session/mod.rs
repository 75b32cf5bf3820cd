//! SessionActor: one per active session, started on first use (an append, an artifact, a live
//! subscriber) and again after a restart or an idle stop. It is the single writer of the
//! session's log chunks, counters and artifact records: each appended batch is one chunk,
//! written with its counters in one transaction and acknowledged once durable (the handle
//! waits for the group commit, so concurrent batches share fsyncs). It also keeps the replay
//! buffer (the last `buffer_entries` entries, within `buffer_bytes`, the newest batch always)
//! and fans each stored batch out to the live subscribers (`live`).
//!
//! Invariants a change must keep:
//! - An append is answered as soon as its write is applied, before the replay buffer and the
//!   fan-out: a panic in those leaves the caller with the truth and never writes twice.
//! - Completion and deletion seal the actor first (later appends are 409). Seals are counted,
//!   and one whose completion failed is taken back: appends resume only once no seal is left
//!   and the stored session is still active.
//! - Its state is rebuilt from storage in `pre_start` (counters, the replay buffer from the
//!   newest chunks, whether the session is still active), so a restart after a panic loses
//!   nothing that was acknowledged, and live subscribers resume from the next entry.
//! - With no append, artifact or subscriber for `[sessions] idle_seconds` it stops: all its
//!   state is in storage, and the next use starts it again.
//!
//! Tested by the unit tests below (through its mailbox on a temporary store, no HTTP), through
//! the API tests of sessions, artifacts and the live stream, and with panics injected, one of
//! them right after a write (`tests/api/supervision.rs`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use fleetops_storage::sessions::ChunkIndex;
use fleetops_storage::{Artifact, Columns, LogChunk, SessionCounters, SessionStatus, Store};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

mod artifacts;
mod exports;
pub mod handle;
mod remote;
pub(crate) mod sealer;

use crate::config::SessionsConfig;
use crate::error::{Error, Result};
use crate::live::{self, LiveBatch, Subscription};
use crate::logs::LogFilter;
use crate::mailbox::Envelope;

type Reply<T> = RpcReplyPort<Result<T>>;

pub(crate) enum SessionMsg {
    /// Store a validated batch; replies with the number of entries accepted.
    /// A batch with its index, built before it reaches the actor (off the runtime's threads
    /// for a large one).
    /// With its sender's batch number, if it gave one; answered `None` for a number the
    /// session already stored (nothing is written).
    Append(
        Arc<LogChunk>,
        Arc<ChunkIndex>,
        Option<u64>,
        Reply<Option<usize>>,
    ),
    /// Record an uploaded artifact; replies with the blob key it replaced, if any.
    PutArtifact(Artifact, Reply<Option<String>>),
    /// Refuse every later append (completion or deletion is under way).
    Seal(Reply<()>),
    /// The completion or deletion that sealed it failed: take appends again while the stored
    /// session is active.
    Unseal,
    /// A live subscriber: its replay (the last `n` matching entries, or every buffered entry
    /// from a sequence number on, after a restart of this actor) and the feed.
    Subscribe {
        replay: Replay,
        filter: LogFilter,
        reply: Reply<Subscription>,
    },
    /// The session ended with this status (`None`: deleted): tell subscribers and stop.
    End(Option<&'static str>),
    /// A message from the same session's actor on another node (`remote`).
    Remote(bytes::Bytes),
    /// Fan out what other nodes stored that the bus did not bring (several nodes).
    CatchUp,
    /// Stops the actor if nothing happened for `[sessions] idle_seconds` and nobody
    /// listens (passivation; the next append or subscriber starts it again from storage).
    IdleCheck,
    /// Fault injection for supervision tests.
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Fault injection: the next append panics after its write, while fanning it out.
    #[cfg(feature = "fault-injection")]
    PanicAfterNextWrite,
}

/// Which entries a new subscriber is sent first.
#[derive(Debug, Clone, Copy)]
pub enum Replay {
    Last(usize),
    Since(u64),
}

#[derive(Default)]
pub(crate) struct SessionActor;

impl crate::keyed::KeyedChild for SessionActor {
    type Req = SessionMsg;
    /// The store, the settings, the count of live batches skipped for slow subscribers, and
    /// the sealer its batches are handed to.
    type Ctx = (
        Store,
        SessionsConfig,
        Arc<AtomicU64>,
        sealer::LogSealer,
        crate::bus::Bus,
    );
    const KIND: &'static str = "session";
}

pub(crate) struct SessionState {
    id: u64,
    /// Its project (0 when the session does not exist).
    project_id: u64,
    store: Store,
    /// Counters as stored after the last acknowledged append.
    counters: SessionCounters,
    /// False once the session is not active (or gone): appends are refused.
    open: bool,
    /// Completions and deletions under way (each sealed it); it opens again only when none
    /// is left and the stored session is active.
    seals: u32,
    /// The session no longer exists (deleted): appends are 404, not 409.
    gone: bool,
    /// The status when not active, for subscribers that arrive late.
    ended: Option<&'static str>,
    /// The most recent batches with the arrival index of their first entry, holding at least
    /// `cfg.buffer_entries` entries once the session has that many.
    ring: VecDeque<(u64, Arc<LogChunk>)>,
    ring_entries: usize,
    /// What the ring holds in memory, about (`ring_bytes_of`).
    ring_bytes: usize,
    cfg: SessionsConfig,
    live: live::Fanout,
    /// Injected fault (tests): the next fan-out panics.
    #[cfg(feature = "fault-injection")]
    panic_after_write: bool,
    /// When the last append, artifact or subscriber came.
    last_active: std::time::Instant,
    sealer: sealer::LogSealer,
    /// Lines and bytes appended since the last seal this actor asked for.
    unsealed: (usize, usize),
    /// Arrival index just past the last entry fanned out (kept for replay and sent to
    /// subscribers), this node's batches and the other nodes' alike.
    seen: u64,
    /// Where this node tells the others of its batches.
    bus: crate::bus::Bus,
    /// Forwards the other nodes' messages about this session here, while it has live
    /// subscribers (several nodes).
    listening: Option<crate::bus::Listener>,
    /// Bytes of those messages waiting in the mailbox; past [`MAX_REMOTE_BYTES`] the
    /// forwarder drops them, and the gap is read back from the store.
    remote_bytes: Arc<std::sync::atomic::AtomicUsize>,
}

/// How often a session with live subscribers looks in the store for batches of other nodes
/// that the bus did not bring (several nodes).
const CATCH_UP_EVERY: Duration = Duration::from_secs(1);
/// Bytes of other nodes' messages one session's mailbox holds at most.
const MAX_REMOTE_BYTES: usize = 8 << 20;

/// How many times a write decided against stale counters is tried again (another node
/// wrote the session meanwhile) before it is answered 503 with `Retry-After` (nothing
/// written, so the sender tries again).
const STALE_TRIES: u32 = 100;

impl Actor for SessionActor {
    type Msg = Envelope<SessionMsg>;
    type State = SessionState;
    type Arguments = (
        (
            Store,
            SessionsConfig,
            Arc<AtomicU64>,
            sealer::LogSealer,
            crate::bus::Bus,
        ),
        u64,
    );

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        ((store, cfg, skipped, sealer, bus), id): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let session = store.session_by_id(id)?;
        let counters = store.session_counters(id)?;
        // Rebuild the replay buffer from the newest stored batches, on a blocking thread (a
        // sealed chunk is fetched from the blob store).
        // A session whose newest chunks cannot be read now (a blob store down) starts with an
        // empty buffer rather than not at all, so appends, completion and deletion still work.
        let (ring, ring_entries, ring_bytes) = if session.is_some() {
            let (store, cfg) = (store.clone(), cfg.clone());
            let log_count = counters.log_count;
            match tokio::task::spawn_blocking(move || rebuild_ring(&store, id, &cfg, log_count))
                .await
            {
                Ok(Ok(r)) => r,
                failed => {
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => e.to_string(),
                        Ok(Ok(_)) => String::new(),
                    };
                    tracing::warn!(
                        session = id,
                        error,
                        "the replay buffer could not be rebuilt; it starts empty"
                    );
                    (VecDeque::new(), 0, 0)
                }
            }
        } else {
            (VecDeque::new(), 0, 0)
        };
        let active = session
            .as_ref()
            .is_some_and(|s| s.status == SessionStatus::Active);
        if bus.is_shared() && active {
            // While it has subscribers, what the other nodes stored and the bus lost is read
            // back from the store every second.
            myself.send_interval(CATCH_UP_EVERY, || Envelope::cast(SessionMsg::CatchUp));
        }
        let live = live::Fanout::new(cfg.subscriber_queue, cfg.subscriber_queue_bytes, skipped);
        let idle = Duration::from_secs(cfg.idle_seconds.max(1));
        myself.send_after(idle, || Envelope::cast(SessionMsg::IdleCheck));
        Ok(SessionState {
            id,
            project_id: session.as_ref().map_or(0, |s| s.project_id),
            seen: counters.log_count,
            counters,
            open: active,
            seals: 0,
            gone: session.is_none(),
            ended: session
                .as_ref()
                .filter(|s| s.status != SessionStatus::Active)
                .map(|s| s.status.as_str()),
            store,
            ring,
            ring_entries,
            ring_bytes,
            cfg,
            live,
            #[cfg(feature = "fault-injection")]
            panic_after_write: false,
            last_active: std::time::Instant::now(),
            sealer,
            unsealed: (0, 0),
            bus,
            listening: None,
            remote_bytes: Arc::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        match msg {
            SessionMsg::Append(chunk, index, batch, reply) => {
                match st.append(&chunk, &index, batch) {
                    Ok(None) => {
                        st.last_active = std::time::Instant::now();
                        let _ = reply.send(Ok(None));
                    }
                    Ok(Some((first_seq, chunk_seq))) => {
                        // Only an accepted append keeps the actor in memory: one sealed by a
                        // completion whose caller went away mid-write (no unseal came) idles
                        // out, and its next start reads the stored status.
                        st.last_active = std::time::Instant::now();
                        // Answered as soon as the write is applied, before the replay buffer and
                        // the fan-out: a panic in those cannot leave the caller without the truth,
                        // so a request lost to a panic never wrote anything.
                        let _ = reply.send(Ok(Some(chunk.len())));
                        if st.bus.is_shared() {
                            st.bus.publish(
                                remote::subject(st.id),
                                &remote::batch(first_seq, chunk_seq, &chunk),
                            );
                        }
                        st.deliver(first_seq, chunk_seq, chunk);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            SessionMsg::PutArtifact(a, reply) => {
                st.last_active = std::time::Instant::now();
                let _ = reply.send(st.put_artifact(a));
            }
            SessionMsg::Seal(reply) => {
                st.open = false;
                st.seals = st.seals.saturating_add(1);
                let _ = reply.send(Ok(()));
            }
            SessionMsg::Unseal => {
                st.seals = st.seals.saturating_sub(1);
                st.open = st.seals == 0
                    && matches!(
                        st.store.session_by_id(st.id),
                        Ok(Some(s)) if s.status == SessionStatus::Active
                    );
            }
            SessionMsg::Subscribe {
                replay,
                filter,
                reply,
            } => {
                st.last_active = std::time::Instant::now();
                if st.open && st.bus.is_shared() && st.listening.is_none() {
                    st.listen(&myself).await;
                }
                let _ = reply.send(Ok(st.subscribe(replay, &filter)));
                if !st.open {
                    // Started only to answer a late subscriber: nothing more to do.
                    myself.stop(None);
                }
            }
            SessionMsg::End(status) => {
                // Lines other nodes stored before the end reach subscribers first.
                st.catch_up_stored();
                st.live.end(status);
                myself.stop(None);
            }
            SessionMsg::CatchUp => {
                if st.live.listening() {
                    st.catch_up_stored();
                    // Ended on another node, and the bus lost the word: end here too.
                    if let Ok(Some(s)) = st.store.session_by_id(st.id)
                        && s.status != SessionStatus::Active
                    {
                        st.live.end(Some(s.status.as_str()));
                        myself.stop(None);
                    }
                }
            }
            SessionMsg::Remote(m) => {
                st.remote_bytes
                    .fetch_sub(m.len(), std::sync::atomic::Ordering::Relaxed);
                st.remote(&myself, &m);
            }

            SessionMsg::IdleCheck => {
                let idle = Duration::from_secs(st.cfg.idle_seconds.max(1));
                let quiet = st.last_active.elapsed();
                if !st.live.listening() {
                    // Nobody listens here: the other nodes' batches are not needed.
                    st.listening = None;
                }
                if quiet >= idle && !st.live.listening() {
                    // Its state is all in storage; the ring and the actor go.
                    myself.stop(Some("idle".into()));
                } else {
                    let next = idle.saturating_sub(quiet).max(Duration::from_millis(100));
                    myself.send_after(next, || Envelope::cast(SessionMsg::IdleCheck));
                }
            }
            #[cfg(feature = "fault-injection")]
            SessionMsg::Panic => panic!("injected fault in SessionActor {}", st.id),
            #[cfg(feature = "fault-injection")]
            SessionMsg::PanicAfterNextWrite => st.panic_after_write = true,
        }
        Ok(())
    }
}

impl SessionState {
    fn check_open(&self) -> Result<()> {
        // Its organization deleted: being purged, never written again.
        if self.gone || self.store.project_retired(self.project_id) {
            return Err(Error::not_found("Session"));
        }
        if !self.open {
            return Err(Error::Conflict("Session is not active".into()));
        }
        Ok(())
    }

    /// Another server completed or deleted the session: appends are refused from now on.
    fn ended_elsewhere(&mut self) -> Error {
        self.open = false;
        Error::Conflict("Session is not active".into())
    }

    fn put_artifact(&mut self, a: Artifact) -> Result<Option<String>> {
        self.check_open()?;
        let mut tries = 0;
        loop {
            match self.try_put_artifact(&a) {
                Err(Error::Conflict(w)) if w == fleetops_storage::sessions::SESSION_NOT_ACTIVE => {
                    return Err(self.ended_elsewhere());
                }
                Err(Error::Conflict(_)) if tries < STALE_TRIES => {
                    tries += 1;
                    self.reload_counters()?;
                }
                Err(Error::Conflict(_)) => {
                    return Err(Error::Unavailable {
                        retry_after_secs: 1,
                    });
                }
                other => return other,
            }
        }
    }

    /// Reads the counters again: another server wrote the session's logs or artifacts.
    fn reload_counters(&mut self) -> Result<()> {
        self.counters = self.store.session_counters(self.id)?;
        Ok(())
    }

    fn try_put_artifact(&mut self, a: &Artifact) -> Result<Option<String>> {
        let old = self.store.artifact(self.id, &a.path)?;
        let mut next = self.counters;
        match &old {
            Some(o) => {
                next.artifact_size_bytes = next.artifact_size_bytes
                    - o.size_bytes.min(next.artifact_size_bytes)
                    + a.size_bytes
            }
            None => {
                next.artifact_count += 1;
                next.artifact_size_bytes += a.size_bytes;
            }
        }
        self.store
            .put_artifact(self.project_id, a, &self.counters, &next)?;
        self.counters = next;
        Ok(old.map(|o| o.blob_key))
    }

    /// Writes the batch with its counters; returns the arrival index of its first entry.
    /// Returns the arrival index of the batch's first entry and the chunk's sequence number.
    /// The write is decided against the stored counters, so two servers appending to one
    /// session never take the same chunk number or arrival index: the one that lost reads the
    /// counters again and appends after the other's batch.
    /// `None` for a batch number the session already stored.
    fn append(
        &mut self,
        chunk: &LogChunk,
        index: &ChunkIndex,
        batch: Option<u64>,
    ) -> Result<Option<(u64, u64)>> {
        self.check_open()?;
        let n = chunk.len();
        let mut tries = 0;
        let seq = loop {
            let seq = self.counters.next_chunk;
            let next = SessionCounters {
                log_count: self.counters.log_count + n as u64,
                next_chunk: seq + 1,
                ..self.counters
            };
            match self.store.append_batch(
                self.project_id,
                self.id,
                chunk,
                index,
                (&self.counters, &next),
                seq,
                batch,
            ) {
                Ok(()) => break seq,
                Err(fleetops_storage::StorageError::Conflict(w))
                    if w == fleetops_storage::sessions::DUPLICATE_BATCH =>
                {
                    return Ok(None);
                }
                Err(fleetops_storage::StorageError::Conflict(w))
                    if w == fleetops_storage::sessions::SESSION_NOT_ACTIVE =>
                {
                    return Err(self.ended_elsewhere());
                }
                Err(fleetops_storage::StorageError::Conflict(_)) if tries < STALE_TRIES => {
                    tries += 1;
                    self.reload_counters()?;
                }
                Err(fleetops_storage::StorageError::Conflict(_)) => {
                    return Err(Error::Unavailable {
                        retry_after_secs: 1,
                    });
                }
                Err(e) => return Err(e.into()),
            }
        };
        let next = SessionCounters {
            log_count: self.counters.log_count + n as u64,
            next_chunk: seq + 1,
            ..self.counters
        };
        let first_seq = self.counters.log_count;
        self.counters = next;
        self.unsealed.0 += n;
        self.unsealed.1 += ring_bytes_of(chunk);
        if self.sealer.due(self.unsealed.0, self.unsealed.1) && self.sealer.request(self.id) {
            self.unsealed = (0, 0);
        }
        Ok(Some((first_seq, seq)))
    }

    /// Starts taking the other nodes' messages about this session (a first live subscriber
    /// here), and fans out what they stored before.
    async fn listen(&mut self, myself: &ActorRef<Envelope<SessionMsg>>) {
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
    fn remote(&mut self, myself: &ActorRef<Envelope<SessionMsg>>, m: &bytes::Bytes) {
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
    fn catch_up_stored(&mut self) {
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
    fn deliver(&mut self, first_seq: u64, chunk_seq: u64, chunk: Arc<LogChunk>) {
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
    fn catch_up(&mut self, to: u64, below: u64) {
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
    fn fan_out(&mut self, first_seq: u64, chunk: Arc<LogChunk>) {
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
    fn remember(&mut self, first_seq: u64, chunk: Arc<LogChunk>) {
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

    fn subscribe(&mut self, replay: Replay, filter: &LogFilter) -> Subscription {
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

/// A status named by another node, as this build names it.
fn ended_status(s: &str) -> &'static str {
    match s {
        "failed" => SessionStatus::Failed.as_str(),
        _ => SessionStatus::Completed.as_str(),
    }
}

type Ring = VecDeque<(u64, Arc<LogChunk>)>;

/// The replay buffer as `remember` would have left it: the newest chunks, the newest always,
/// older ones within `buffer_entries` and `buffer_bytes`; with its entries and bytes.
fn rebuild_ring(
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
fn ring_bytes_of(chunk: &LogChunk) -> usize {
    chunk.text.len() + chunk.meta.len() + chunk.len() * 16
}

/// The SessionActor driven through its mailbox on a temporary store, with no HTTP: appends
/// count in arrival order, a sealed session refuses appends, a replacement actor rebuilds its
/// counters and replay buffer from storage, and a subscriber's replay holds the last entries.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use fleetops_storage::Session;

    use super::*;
    use crate::logs::{RawEntry, build_chunk};
    use crate::mailbox::ask;

    const SID: u64 = 5;

    fn batch(tag: &str, n: usize) -> Arc<LogChunk> {
        let entries = (0..n)
            .map(|i| RawEntry {
                timestamp: None,
                level: "info".into(),
                module: Some("nav".into()),
                message: format!("{tag}-{i}"),
                metadata: None,
            })
            .collect();
        Arc::new(build_chunk(entries).unwrap())
    }

    fn index(tag: &str, n: usize) -> Arc<ChunkIndex> {
        Arc::new(ChunkIndex::of(&batch(tag, n)).unwrap())
    }

    async fn spawn(store: &Store) -> ActorRef<Envelope<SessionMsg>> {
        let sealer = sealer::LogSealer::new(store.clone(), Default::default(), Arc::default());
        let ctx = (
            store.clone(),
            SessionsConfig::default(),
            Arc::default(),
            sealer,
            crate::bus::Bus::local(),
        );
        Actor::spawn(None, SessionActor, (ctx, SID))
            .await
            .unwrap()
            .0
    }

    /// A store holding session `SID`, active (keep the directory while the store is used).
    fn active_session() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .put_session(&Session {
                id: SID,
                project_id: 1,
                device_id: 2,
                device_name: "r1".into(),
                status: SessionStatus::Active,
                started_at: 0,
                ended_at: None,
                tags: Vec::new(),
                package_id: None,
            })
            .unwrap();
        (dir, store)
    }

    /// The replay buffer is bounded in bytes as well as entries: a few large entries do not
    /// stay, live or rebuilt from storage, past `buffer_bytes` (the newest batch always does).
    #[tokio::test]
    async fn the_replay_buffer_keeps_at_most_buffer_bytes() {
        let (_dir, store) = active_session();
        let cfg = SessionsConfig {
            buffer_bytes: 10_000,
            ..SessionsConfig::default()
        };
        let big = |tag: &str| {
            let entries = (0..2)
                .map(|i| RawEntry {
                    timestamp: None,
                    level: "info".into(),
                    module: None,
                    message: format!("{tag}-{i}-{}", "x".repeat(4_000)),
                    metadata: None,
                })
                .collect();
            Arc::new(build_chunk(entries).unwrap())
        };
        let replayed = |a: ActorRef<Envelope<SessionMsg>>| async move {
            let sub = ask(&a, |reply| SessionMsg::Subscribe {
                replay: Replay::Last(100),
                filter: LogFilter::default(),
                reply,
            })
            .await
            .unwrap();
            a.stop(None);
            sub.replay
                .iter()
                .map(|f| String::from_utf8(f.to_vec()).unwrap())
                .map(|f| f.split("-x").next().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        };
        let start = |cfg: SessionsConfig| {
            let store = store.clone();
            async move {
                let sealer =
                    sealer::LogSealer::new(store.clone(), Default::default(), Arc::default());
                Actor::spawn(
                    None,
                    SessionActor,
                    (
                        (store, cfg, Arc::default(), sealer, crate::bus::Bus::local()),
                        SID,
                    ),
                )
                .await
                .unwrap()
                .0
            }
        };
        let a = start(cfg.clone()).await;
        for tag in ["a", "b", "c"] {
            let chunk = big(tag);
            let idx = Arc::new(ChunkIndex::of(&chunk).unwrap());
            ask(&a, |r| {
                SessionMsg::Append(chunk.clone(), idx.clone(), None, r)
            })
            .await
            .unwrap();
        }
        // Each batch holds about 8 KB: only the newest fits in 10,000 bytes.
        let live = replayed(a).await;
        assert_eq!(live.len(), 2, "{live:?}");
        assert!(
            live[0].ends_with("c-0") && live[1].ends_with("c-1"),
            "{live:?}"
        );
        // Rebuilt from storage: the same bound.
        assert_eq!(replayed(start(cfg).await).await, live);
        // With the default bound, all three batches.
        assert_eq!(
            replayed(start(SessionsConfig::default()).await).await.len(),
            6
        );
    }

    #[tokio::test]
    async fn appends_count_seal_refuses_and_a_replacement_rebuilds_from_storage() {
        let (_dir, store) = active_session();
        let a = spawn(&store).await;
        assert_eq!(
            ask(&a, |r| SessionMsg::Append(
                batch("a", 3),
                index("a", 3),
                None,
                r
            ))
            .await
            .unwrap(),
            Some(3)
        );
        assert_eq!(
            ask(&a, |r| SessionMsg::Append(
                batch("b", 2),
                index("b", 2),
                None,
                r
            ))
            .await
            .unwrap(),
            Some(2)
        );
        assert_eq!(store.session_counters(SID).unwrap().log_count, 5);

        // A replacement rebuilds its counters and replay buffer from storage.
        a.stop(None);
        let a = spawn(&store).await;
        let sub = ask(&a, |reply| SessionMsg::Subscribe {
            replay: Replay::Last(2),
            filter: LogFilter::default(),
            reply,
        })
        .await
        .unwrap();
        assert_eq!(sub.next_seq, 5);
        assert_eq!(sub.replay.len(), 2);
        let last = String::from_utf8(sub.replay[1].to_vec()).unwrap();
        assert!(last.contains("b-1"), "{last}");
        assert!(sub.feed.is_some() && sub.ended.is_none());

        // Sealed (completion under way): appends are refused, nothing more is counted.
        ask(&a, SessionMsg::Seal).await.unwrap();
        let r = ask(&a, |r| {
            SessionMsg::Append(batch("c", 1), index("c", 1), None, r)
        })
        .await;
        assert!(matches!(r, Err(Error::Conflict(_))));
        assert_eq!(store.session_counters(SID).unwrap().log_count, 5);
        // Two completions under way; one fails: still sealed, the other may yet write.
        ask(&a, SessionMsg::Seal).await.unwrap();
        a.cast(Envelope::cast(SessionMsg::Unseal)).unwrap();
        let r = ask(&a, |r| {
            SessionMsg::Append(batch("c", 1), index("c", 1), None, r)
        })
        .await;
        assert!(matches!(r, Err(Error::Conflict(_))));
        // The other fails too (the session is still active as stored): appends again.
        a.cast(Envelope::cast(SessionMsg::Unseal)).unwrap();
        let r = ask(&a, |r| {
            SessionMsg::Append(batch("c", 1), index("c", 1), None, r)
        })
        .await;
        assert_eq!(r.unwrap(), Some(1));
        assert_eq!(store.session_counters(SID).unwrap().log_count, 6);
        // A numbered batch is stored once: sent again, it is answered as a duplicate.
        let r = ask(&a, |r| {
            SessionMsg::Append(batch("d", 2), index("d", 2), Some(7), r)
        })
        .await;
        assert_eq!(r.unwrap(), Some(2));
        let r = ask(&a, |r| {
            SessionMsg::Append(batch("d", 2), index("d", 2), Some(7), r)
        })
        .await;
        assert_eq!(r.unwrap(), None);
        assert_eq!(store.session_counters(SID).unwrap().log_count, 8);
        a.stop(None);
    }
}
