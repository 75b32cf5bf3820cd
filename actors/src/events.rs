//! Events leave their writer only once the write is on disk. The actor that applied a write
//! hands the event to its [`Outbox`] in the same handler, so an event is never lost with a
//! caller that went away (a dropped connection, a cancelled request) and never published for
//! a write that failed. The outbox waits for the group commit that covers everything handed
//! to it so far, then broadcasts in the order the writers published.
//!
//! Bounds and limits: at most 4,096 events wait for their fsync (a writer waits when the
//! outbox is full, so memory stays bounded); a subscriber more than 1,024 events behind is
//! told it lagged and misses those; the outbox is in memory, so a kill -9 between the fsync and
//! the broadcast loses the event while its write stays stored. The only kind of event is a
//! device's rollout result, for the alert evaluators, which reconcile from the stored results
//! after a restart or a lag.
//!
//! Tested through the real server: a rollout result is published by its writer even when the
//! caller hung up before the answer (`tests/api/deployments/`).

use fleetops_storage::Store;
use tokio::sync::{broadcast, mpsc};

/// Events waiting for their write's fsync, at most (a writer waits when it is full).
const PENDING: usize = 4096;
/// Events a subscriber may fall behind by before it is told it lagged.
const FANOUT: usize = 1024;

/// One kind of event, published after the write that made it is durable.
pub struct Outbox<E: Clone + Send + 'static> {
    pending: mpsc::Sender<E>,
    bus: broadcast::Sender<E>,
}

impl<E: Clone + Send + 'static> Clone for Outbox<E> {
    fn clone(&self) -> Self {
        Self {
            pending: self.pending.clone(),
            bus: self.bus.clone(),
        }
    }
}

impl<E: Clone + Send + 'static> Outbox<E> {
    /// Starts the task that publishes what is on disk; it ends when every outbox is dropped.
    pub(crate) fn start(store: Store) -> Self {
        let (pending, mut rx) = mpsc::channel::<E>(PENDING);
        let bus = broadcast::channel(FANOUT).0;
        let out = bus.clone();
        tokio::spawn(async move {
            let mut batch = Vec::new();
            while rx.recv_many(&mut batch, PENDING).await > 0 {
                // Everything in the batch was written before this wait began.
                let mut delay = std::time::Duration::from_millis(10);
                while let Err(e) = store.durable().await {
                    tracing::error!(error = %e, "flush failed; events wait for the next one");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                for e in batch.drain(..) {
                    // Nobody listening is not an error.
                    let _ = out.send(e);
                }
            }
        });
        Self { pending, bus }
    }

    /// Called by the writer right after its write is applied. Waits only when the outbox is
    /// full (the disk is behind), which bounds its memory.
    pub(crate) async fn publish(&self, e: E) {
        let _ = self.pending.send(e).await;
    }

    pub fn subscribe(&self) -> broadcast::Receiver<E> {
        self.bus.subscribe()
    }
}

/// What the alert evaluator hears: a device reported a rollout result.
#[derive(Debug, Clone)]
pub struct RolloutEvent {
    pub project_id: u64,
    pub deployment_id: u64,
    pub device_id: u64,
    pub status: fleetops_storage::RolloutStatus,
    /// The device's previous status for this deployment (a change of state resolves alerts).
    pub previous: Option<fleetops_storage::RolloutStatus>,
    pub at: i64,
}
