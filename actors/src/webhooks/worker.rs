//! WebhookWorker: works accepted webhook deliveries in batches, in arrival order, under the
//! root supervisor: a batch is read and parsed off the runtime's threads, and each run of one
//! installation's deliveries in it is one message to that installation. The store is the
//! queue: the intake stores each subscribed delivery `queued`, which puts it in the list of
//! queued deliveries, and wakes the worker, which reads that list a page at a time past the
//! last seq it took, so a long backlog (a worker left down past its restart budget, a burst)
//! costs a page of memory, not an entry per delivery. On every (re)start the worker reads from
//! the beginning, so it first takes what a crash left queued, or the batch it was working when
//! it panicked. Working a delivery
//! twice is harmless: the installation actor and the dispatcher act on a delivery only while
//! it is still queued.
//!
//! Several nodes: the queue is worked in arrival order (one installation's events must apply
//! in the order the host sent them), so one node works it at a time, under the lease
//! `webhook-worker`, renewed before each batch and every third of its time while one is
//! worked. The others' workers stand by, looking every second, and take it once it lapses
//! (its node died or stalled), reading the queue from its start, so a dead node's deliveries
//! are worked within `[bus] lease_ttl_ms`. Every node's intake wakes every node's worker over
//! the bus; an idle holder also looks every second, in case the bus lost a wake. Every write
//! a delivery's working makes (its outcome, its runs, an installation's changes) carries the
//! lease's fence, as taken when the delivery was read: a node that stalled past its lease (a
//! frozen VM) and then resumes has the rest of its batch refused by the store, and leaves
//! those deliveries to the new holder, so one installation's events apply in order.

use std::sync::Arc;
#[cfg(feature = "fault-injection")]
use std::sync::atomic::{AtomicBool, Ordering};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::Notify;

use super::WebhooksHandle;
use super::work::ReadAhead;
use super::work::limits::PAGE;
use crate::mailbox::Envelope;

pub(crate) enum WorkerMsg {
    /// Work the next batch of deliveries (the actor sends this to itself after each one).
    Next,
}

pub(crate) struct WebhookWorker;

/// What the intake and the worker share; it outlives any one incarnation of the worker.
#[derive(Clone, Default)]
pub(crate) struct WorkerFeed {
    /// Stored deliveries are waiting (a permit is kept when the worker is not waiting).
    pub wake: Arc<Notify>,
    /// Several nodes: wakes the other nodes' workers too.
    pub bus: Option<crate::bus::Bus>,
    /// Fault injection for tests: the worker panics when it next wakes.
    #[cfg(feature = "fault-injection")]
    pub panic_next: Arc<AtomicBool>,
}

impl WorkerFeed {
    pub(crate) fn stored(&self) {
        self.wake.notify_one();
        if let Some(b) = &self.bus {
            b.publish(WAKE_SUBJECT.into(), &[]);
        }
    }
}

/// Takes or renews the worker's lease: whether this node holds it (a database out of reach
/// counts as not). Held, its fence becomes the one the deliveries read from now on carry;
/// lost, the last one stays, so what this node still works is refused by the store rather
/// than written unfenced.
async fn renew(
    webhooks: &WebhooksHandle,
    bus: &crate::bus::Bus,
    clock: &crate::clock::Clock,
    ttl: i64,
) -> bool {
    let (store, node, now) = (webhooks.store.clone(), bus.node_id(), clock.now_ms());
    match tokio::task::spawn_blocking(move || store.take_lease(LEASE, node, now, ttl)).await {
        Ok(Ok(Some(fence))) => {
            *webhooks
                .worker_fence
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(fence);
            true
        }
        _ => false,
    }
}

/// The bus subject on which a node's intake wakes every node's worker.
pub(crate) const WAKE_SUBJECT: &str = "fleetops.webhooks";
/// The worker's lease (several nodes).
const LEASE: &str = "webhook-worker";
/// How long a worker without the lease, or with an empty queue, waits for a wake before it
/// looks again (several nodes).
const STAND_BY: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct WorkerArgs {
    pub webhooks: WebhooksHandle,
    pub feed: WorkerFeed,
    /// Several nodes: the lease every batch is worked under, and its length.
    pub lease: Option<(crate::bus::Bus, crate::clock::Clock, i64)>,
}

pub(crate) struct WorkerState {
    webhooks: WebhooksHandle,
    feed: WorkerFeed,
    /// The page being worked, in arrival order.
    page: std::collections::VecDeque<u64>,
    /// The last seq taken from the store.
    after: u64,
    /// The next batch of the page, read while the current one is worked.
    ahead: Option<ReadAhead>,
    lease: Option<(crate::bus::Bus, crate::clock::Clock, i64)>,
    /// Whether this worker held the lease at its last look.
    holding: bool,
}

impl Actor for WebhookWorker {
    type Msg = Envelope<WorkerMsg>;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WorkerArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let _ = myself.cast(Envelope::cast(WorkerMsg::Next));
        Ok(WorkerState {
            webhooks: args.webhooks,
            feed: args.feed,
            page: std::collections::VecDeque::new(),
            after: 0,
            ahead: None,
            lease: args.lease,
            holding: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(WorkerMsg::Next) = msg.open() else {
            return Ok(());
        };
        loop {
            #[cfg(feature = "fault-injection")]
            if st.feed.panic_next.swap(false, Ordering::SeqCst) {
                panic!("injected fault in the webhook worker");
            }
            if let Some((bus, clock, ttl)) = st.lease.clone() {
                if !renew(&st.webhooks, &bus, &clock, ttl).await {
                    // Another node works the queue (or the database is out of reach): look
                    // again in a second.
                    st.holding = false;
                    tokio::time::sleep(STAND_BY).await;
                    continue;
                }
                if !st.holding {
                    // Newly taken: whatever the last holder left queued, from the start.
                    st.holding = true;
                    st.page.clear();
                    if let Some(r) = st.ahead.take() {
                        r.discard().await;
                    }
                    st.after = 0;
                }
            }
            if !st.page.is_empty() {
                break;
            }
            // A read-ahead belongs to the page it was read from.
            if let Some(r) = st.ahead.take() {
                r.discard().await;
            }
            let (store, after) = (st.webhooks.store.clone(), st.after);
            let page =
                tokio::task::spawn_blocking(move || store.queued_after(after, PAGE)).await??;
            if page.is_empty() {
                // Everything stored so far is taken; the intake wakes us for more. After a
                // wake the queue is read from its start again (worked entries have left it),
                // so one a failed outcome write left behind is retried, once per wake rather
                // than in a loop.
                if st.lease.is_some() {
                    let _ = tokio::time::timeout(STAND_BY, st.feed.wake.notified()).await;
                } else {
                    st.feed.wake.notified().await;
                }
                st.after = 0;
                continue;
            }
            st.after = page.last().copied().unwrap_or(after);
            st.page = page.into();
        }
        let page: Vec<u64> = st.page.iter().copied().collect();
        // The lease is renewed while the batch is worked, however long it takes.
        let _renewing = st.lease.clone().map(|(bus, clock, ttl)| {
            let webhooks = st.webhooks.clone();
            crate::bus::Listener::spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis((ttl / 3).max(1) as u64))
                        .await;
                    renew(&webhooks, &bus, &clock, ttl).await;
                }
            })
        });
        let taken = st.webhooks.process_batch(&page, &mut st.ahead).await;
        st.page.drain(..taken.min(st.page.len()));
        let _ = myself.cast(Envelope::cast(WorkerMsg::Next));
        Ok(())
    }
}
