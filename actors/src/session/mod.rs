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
//! Tested by the unit tests in `tests.rs` (through its mailbox on a temporary store, no HTTP), through
//! the API tests of sessions, artifacts and the live stream, and with panics injected, one of
//! them right after a write (`tests/api/supervision/`).

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
mod replay;
pub(crate) mod sealer;
mod search;

use crate::config::SessionsConfig;
use crate::error::{Error, Result};
use crate::live::{self, LiveBatch, Subscription};
use crate::logs::LogFilter;
use crate::mailbox::Envelope;
use replay::{rebuild_ring, ring_bytes_of};

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
}

#[cfg(test)]
mod tests;
