//! IntakeActor: this process's writer of delivery ids. It claims an id and stores the
//! delivery (and, for subscribed events, its payload and a place in the worker's queue) in
//! one atomic write, so concurrent deliveries of one id are accepted exactly once. The store
//! decides each claim with the write, so another process on the same database cannot take
//! the id too (that delivery is answered as a duplicate). Callers are answered 202 once their
//! batch is durable: on sled, in the payload log's journal (one `fdatasync`), which the store
//! replays after a crash; on PostgreSQL, committed. It also owns the webhook secret's
//! rotation.

use std::collections::HashSet;

use bytes::Bytes;
use fleetops_storage::{Delivery, StorageError, Store, accounts::Seq};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::worker::WorkerFeed;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mailbox::{CallState, Envelope, MailboxSlot};

type Reply<T> = RpcReplyPort<Result<T>>;

/// The webhook secret: the current one, since when, and the ones it replaced, each during
/// its own grace period.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SecretState {
    pub current: String,
    pub created_at: i64,
    /// The newest of `earlier`, kept as the state was written before there could be several
    /// (a record written then holds only these two).
    pub previous: Option<String>,
    pub previous_valid_until: Option<i64>,
    /// Every replaced secret still in its grace period, newest first (at most
    /// [`SecretState::EARLIER_MAX`]).
    #[serde(default)]
    pub earlier: Vec<EarlierSecret>,
}

/// A replaced webhook secret and the moment it stops verifying.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EarlierSecret {
    pub secret: String,
    pub valid_until: i64,
}

impl SecretState {
    /// Replaced secrets kept at most (a bad signature costs one HMAC of its body per secret
    /// that still verifies): past it, the oldest stops verifying early.
    pub const EARLIER_MAX: usize = 8;

    /// The replaced secrets that verify at `now`, newest first (a record written before
    /// there could be several holds its one in `previous`).
    pub fn live_earlier(&self, now: i64) -> Vec<EarlierSecret> {
        let mut out: Vec<EarlierSecret> = self.earlier.clone();
        if let (Some(p), Some(t)) = (&self.previous, self.previous_valid_until)
            && !out.iter().any(|e| &e.secret == p)
        {
            out.insert(
                0,
                EarlierSecret {
                    secret: p.clone(),
                    valid_until: t,
                },
            );
        }
        out.retain(|e| now < e.valid_until && !e.secret.is_empty());
        out
    }

    /// This state with `fresh` current: the one it replaces verifies for `grace_ms` more,
    /// and every earlier one until its own end.
    pub fn rotated(&self, fresh: String, now: i64, grace_ms: i64) -> SecretState {
        let mut earlier = self.live_earlier(now);
        if !self.current.is_empty() {
            earlier.retain(|e| e.secret != self.current);
            earlier.insert(
                0,
                EarlierSecret {
                    secret: self.current.clone(),
                    valid_until: now.saturating_add(grace_ms),
                },
            );
        }
        earlier.truncate(Self::EARLIER_MAX);
        SecretState {
            current: fresh,
            created_at: now,
            previous: earlier.first().map(|e| e.secret.clone()),
            previous_valid_until: earlier.first().map(|e| e.valid_until),
            earlier,
        }
    }
}

/// The meta key of the webhook secret state.
pub(crate) const SECRET_META: &str = "scm_webhook_secret";

pub(crate) enum IntakeMsg {
    /// Replies with the delivery's seq when it was queued, `None` when it was ignored (an
    /// unsubscribed event), `Rejected` when its id was already claimed.
    Accept {
        delivery_id: String,
        event: String,
        subscribed: bool,
        body: Bytes,
        reply: Reply<Option<u64>>,
    },
    /// Writes the deliveries accepted since the last flush.
    Flush,
    /// Makes `fresh` the current secret (rotation), from the stored state, so two
    /// rotations at once both count; replies with the state stored.
    Rotate {
        fresh: String,
        now: i64,
        grace_ms: i64,
        reply: Reply<SecretState>,
    },
    /// Expires the delivery log (and the ids it holds) received before `before`: the intake
    /// owns delivery ids, so expiry cannot interleave with a claim.
    Expire { before: i64, reply: Reply<()> },
    /// Fault injection: the next batch write takes this much longer, as on a slow disk
    /// (deadline tests).
    #[cfg(feature = "fault-injection")]
    StallNextWrite(std::time::Duration),
    /// Fault injection: the next batch write waits until the test releases it.
    #[cfg(feature = "fault-injection")]
    HoldNextWrite(Arc<super::WriteHold>),
    /// Fault injection: the intake panics in its handler (supervision tests).
    #[cfg(feature = "fault-injection")]
    Panic,
}

pub(crate) struct IntakeActor;

/// The store, and the worker's wake-up: the actor itself wakes the worker for what it
/// stored, so a caller that goes away (a host that hangs up before its 202) cannot leave a
/// delivery stored but never worked.
pub(crate) type IntakeArgs = (Store, WorkerFeed, i64, crate::clock::Clock);

/// A delivery accepted into the current batch, waiting for the batch's write.
struct Pending {
    call: Option<Arc<CallState>>,
    /// Its place in the bounded mailbox, given back with the answer.
    _slot: MailboxSlot,
    delivery_id: String,
    event: String,
    subscribed: bool,
    body: Bytes,
    reply: Reply<Option<u64>>,
}

pub(crate) struct IntakeState {
    store: Store,
    /// Wakes the worker, which reads the queued deliveries written with each batch.
    queue: WorkerFeed,
    /// Group commit through the mailbox: deliveries accepted since the last `Flush`; the
    /// `Flush` the first of them sent to itself runs after every message already queued.
    pending: Vec<Pending>,
    pending_ids: HashSet<String>,
    /// Payload bytes of `pending`.
    pending_bytes: usize,
    /// The dedup window.
    window_ms: i64,
    /// Injected delay of the next batch write (tests).
    #[cfg(feature = "fault-injection")]
    stall: Option<std::time::Duration>,
    #[cfg(feature = "fault-injection")]
    hold: Option<Arc<super::WriteHold>>,
    clock: crate::clock::Clock,
}

impl Actor for IntakeActor {
    type Msg = Envelope<IntakeMsg>;
    type State = IntakeState;
    type Arguments = IntakeArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (store, queue, window_seconds, clock): IntakeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(IntakeState {
            store,
            queue,
            window_ms: window_seconds * 1000,
            pending: Vec::new(),
            pending_ids: HashSet::new(),
            pending_bytes: 0,
            #[cfg(feature = "fault-injection")]
            stall: None,
            #[cfg(feature = "fault-injection")]
            hold: None,
            clock,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // An accepted delivery is taken on when its batch is written (`flush`), so a caller
        // whose deadline passes while it waits for the batch claims nothing.
        let (msg, call, slot) = msg.defer();
        match msg {
            IntakeMsg::Accept {
                delivery_id,
                event,
                subscribed,
                body,
                reply,
            } => {
                // Its caller already gave up (503, or hung up): it claims nothing.
                if reply.is_closed() || call.as_ref().is_some_and(|c| c.abandoned()) {
                    return Ok(());
                }
                let since = st.clock.now_ms() - st.window_ms;
                // A repeat of a delivery waiting in this batch is not refused yet: the first
                // one's caller may still give up before the write, and then this one is the
                // delivery (`flush` decides, in arrival order).
                let claimed = !st.pending_ids.contains(&delivery_id)
                    && match st.store.is_claimed(&delivery_id, since) {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = reply.send(Err(unavailable(&e)));
                            return Ok(());
                        }
                    };
                if claimed {
                    let _ = reply.send(Err(Error::Rejected("Duplicate delivery".into())));
                    return Ok(());
                }
                if st.pending.is_empty() {
                    let _ = myself.cast(Envelope::cast(IntakeMsg::Flush));
                }
                st.pending_ids.insert(delivery_id.clone());
                st.pending_bytes = st.pending_bytes.saturating_add(body.len());
                st.pending.push(Pending {
                    call,
                    _slot: slot,
                    delivery_id,
                    event,
                    subscribed,
                    body,
                    reply,
                });
                if st.pending.len() >= MAX_BATCH || st.pending_bytes >= MAX_BATCH_BYTES {
                    st.flush().await;
                }
            }
            IntakeMsg::Flush => st.flush().await,
            #[cfg(feature = "fault-injection")]
            IntakeMsg::StallNextWrite(d) => st.stall = Some(d),
            #[cfg(feature = "fault-injection")]
            IntakeMsg::HoldNextWrite(n) => st.hold = Some(n),
            #[cfg(feature = "fault-injection")]
            IntakeMsg::Panic => panic!("injected fault in the webhook intake"),
            IntakeMsg::Expire { before, reply } => {
                if call.is_some_and(|c| !c.start()) {
                    return Ok(());
                }
                let store = st.store.clone();
                let r = tokio::task::spawn_blocking(move || store.expire_deliveries(before))
                    .await
                    .map_err(|e| Error::Internal(e.to_string()))
                    .and_then(|r| r.map_err(Error::from));
                let _ = reply.send(r);
            }
            IntakeMsg::Rotate {
                fresh,
                now,
                grace_ms,
                reply,
            } => {
                if call.is_some_and(|c| !c.start()) {
                    return Ok(());
                }
                let r = (|| {
                    let old: SecretState = match st.store.meta_get(SECRET_META)? {
                        Some(v) => serde_json::from_slice(&v)
                            .map_err(|e| Error::Internal(e.to_string()))?,
                        None => SecretState::default(),
                    };
                    let next = old.rotated(fresh, now, grace_ms);
                    let v =
                        serde_json::to_vec(&next).map_err(|e| Error::Internal(e.to_string()))?;
                    st.store.meta_put(SECRET_META, &v)?;
                    Ok(next)
                })();
                let _ = reply.send(r);
            }
        }
        Ok(())
    }
}

/// At most this many deliveries in one write.
const MAX_BATCH: usize = 512;
/// Payload bytes past which a batch is written at once: a batch is one write (on PostgreSQL,
/// one transaction holding its payloads), so its size is bounded in bytes too.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024;

impl IntakeState {
    /// Writes the batch (ids claimed, deliveries, payloads) and answers every
    /// caller: an answer means durable. On sled the store makes the batch durable in the
    /// payload log (payloads and a journal of the deliveries, one `fdatasync`) and then
    /// applies it without waiting for sled's flush: after a crash the store replays the
    /// journal (`Store::recover_deliveries`). On PostgreSQL the batch is one committed
    /// transaction. When the write fails every caller gets 503; if only sled's part failed,
    /// the journaled batch is replayed at the next start unless its ids were claimed again
    /// meanwhile (a 503 means its durability is unknown). A delivery whose id the store
    /// found taken (by another process on the same database) is answered as a duplicate.
    ///
    /// The write runs on a blocking thread, so the runtime's threads keep serving requests;
    /// meanwhile the mailbox fills with the next batch (the actor handles one message at a
    /// time, so this process never claims one id twice across batches).
    async fn flush(&mut self) {
        // A caller that gave up (its deadline passed: it answered 503, or it hung up) claims
        // nothing; the others are taken on here, so from now on their callers wait for the
        // truth instead of timing out. Of several deliveries of one id, the first still
        // waiting is the delivery and the later ones are its duplicates.
        let mut taken = HashSet::new();
        let mut batch = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            if taken.contains(&p.delivery_id) {
                let _ = p
                    .reply
                    .send(Err(Error::Rejected("Duplicate delivery".into())));
                continue;
            }
            if p.reply.is_closed() || !p.call.as_ref().is_none_or(|c| c.start()) {
                continue;
            }
            taken.insert(p.delivery_id.clone());
            batch.push(p);
        }
        self.pending_ids.clear();
        self.pending_bytes = 0;
        if batch.is_empty() {
            return;
        }
        let first = match self.store.new_ids(Seq::Delivery, batch.len() as u64) {
            Ok(f) => f,
            Err(e) => {
                let _ = unavailable(&e);
                for p in batch {
                    let _ = p.reply.send(Err(Error::Unavailable {
                        retry_after_secs: 1,
                    }));
                }
                return;
            }
        };
        let now = self.clock.now_ms();
        let since = now - self.window_ms;
        let mut items: Vec<_> = batch
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (
                    Delivery::received(
                        first + i as u64,
                        p.delivery_id.clone(),
                        p.event.clone(),
                        now,
                        p.subscribed,
                        p.body.len() as u64,
                    ),
                    p.subscribed.then(|| p.body.clone()),
                )
            })
            .collect();
        let store = self.store.clone();
        #[cfg(feature = "fault-injection")]
        if let Some(d) = self.stall.take() {
            tokio::time::sleep(d).await;
        }
        #[cfg(feature = "fault-injection")]
        if let Some(h) = self.hold.take() {
            h.wait().await;
        }
        let written = tokio::task::spawn_blocking(move || {
            let taken = store.claim_deliveries(&mut items, since)?;
            Ok((items, taken))
        })
        .await
        .unwrap_or_else(|e| Err(StorageError::Io(std::io::Error::other(e.to_string()))));
        match written {
            Ok((items, taken)) => {
                if batch.iter().zip(&taken).any(|(p, &t)| t && p.subscribed) {
                    self.queue.stored();
                }
                for ((p, (d, _)), t) in batch.into_iter().zip(items).zip(taken) {
                    // Not taken: another process claimed the id meanwhile.
                    let _ = p.reply.send(if t {
                        Ok(p.subscribed.then_some(d.seq))
                    } else {
                        Err(Error::Rejected("Duplicate delivery".into()))
                    });
                }
            }
            Err(e) => {
                let _ = unavailable(&e);
                for p in batch {
                    let _ = p.reply.send(Err(Error::Unavailable {
                        retry_after_secs: 1,
                    }));
                }
            }
        }
    }
}

/// A storage failure while claiming: nothing was claimed, so the host may retry (the webhook
/// route answers 503 for it). The cause goes to the log, not to the host.
fn unavailable(e: &fleetops_storage::StorageError) -> Error {
    tracing::error!(error = %e, "webhook intake could not store deliveries");
    Error::Unavailable {
        retry_after_secs: 1,
    }
}

/// The intake driven through its mailbox on a temporary store, with no HTTP: an id is claimed
/// once within the window (also inside one batch), again once the window has passed on a
/// moved clock; a subscribed delivery is queued for the worker and wakes it; an unsubscribed
/// one is logged, never queued.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::clock::Clock;

    async fn accept(
        a: &ActorRef<Envelope<IntakeMsg>>,
        id: &str,
        subscribed: bool,
    ) -> tokio::sync::oneshot::Receiver<Result<Option<u64>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        a.cast(Envelope::cast(IntakeMsg::Accept {
            delivery_id: id.into(),
            event: if subscribed { "push" } else { "star" }.into(),
            subscribed,
            body: Bytes::from_static(b"{}"),
            reply: tx.into(),
        }))
        .unwrap();
        rx
    }

    #[tokio::test]
    async fn ids_are_claimed_once_per_window_and_queued_deliveries_wake_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let clock = Clock::default();
        let feed = WorkerFeed::default();
        let (a, _) = Actor::spawn(
            None,
            IntakeActor,
            (store.clone(), feed.clone(), 60, clock.clone()),
        )
        .await
        .unwrap();

        // Two deliveries of one id in one batch: the first is the delivery, the second its
        // duplicate; an unsubscribed event is logged but not queued.
        let first = accept(&a, "d-1", true).await;
        let again = accept(&a, "d-1", true).await;
        let star = accept(&a, "d-2", false).await;
        let seq = first.await.unwrap().unwrap().expect("queued");
        assert!(matches!(again.await.unwrap(), Err(Error::Rejected(_))));
        assert_eq!(star.await.unwrap().unwrap(), None);
        assert_eq!(store.queued_after(0, 10).unwrap(), vec![seq]);
        let d = store.delivery_by_id("d-2").unwrap().unwrap();
        assert_eq!(d.outcome, fleetops_storage::DeliveryOutcome::Ignored);
        // The worker was woken: a permit is waiting.
        tokio::time::timeout(std::time::Duration::from_secs(1), feed.wake.notified())
            .await
            .expect("the worker is woken for a queued delivery");

        // Still within the window: refused; past it (the clock moved): claimed again.
        let r = accept(&a, "d-1", true).await.await.unwrap();
        assert!(matches!(r, Err(Error::Rejected(_))));
        clock.advance(std::time::Duration::from_secs(61));
        let r = accept(&a, "d-1", true).await.await.unwrap();
        assert!(matches!(r, Ok(Some(s)) if s > seq));
        a.stop(None);
    }
}

#[cfg(test)]
mod secret_state_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_state_written_with_one_previous_secret_reads_and_rotates() {
        let legacy = br#"{"current":"c","created_at":0,"previous":"p","previous_valid_until":100}"#;
        let s: SecretState = serde_json::from_slice(legacy).unwrap();
        let live: Vec<String> = s.live_earlier(50).into_iter().map(|e| e.secret).collect();
        assert_eq!(live, ["p"]);
        assert!(s.live_earlier(100).is_empty(), "ends at its valid_until");
        let next = s.rotated("d".into(), 50, 1000);
        let ends: Vec<(&str, i64)> = next
            .earlier
            .iter()
            .map(|e| (e.secret.as_str(), e.valid_until))
            .collect();
        assert_eq!(ends, [("c", 1050), ("p", 100)]);
        assert_eq!(
            (next.previous.as_deref(), next.previous_valid_until),
            (Some("c"), Some(1050)),
            "an older binary reads the newest"
        );
    }

    #[test]
    fn rotations_keep_at_most_the_newest_earlier_secrets() {
        let mut s = SecretState {
            current: "s0".into(),
            ..SecretState::default()
        };
        for i in 1..=20 {
            s = s.rotated(format!("s{i}"), i, 1_000_000);
        }
        assert_eq!(s.earlier.len(), SecretState::EARLIER_MAX);
        assert_eq!(s.earlier[0].secret, "s19");
        // Expired ones are dropped at the next rotation.
        let later = s.rotated("late".into(), 2_000_000, 10);
        assert_eq!(later.earlier.len(), 1);
    }
}
