//! A delivery as the writers work it (the worker hands it to its installation's actor and the
//! dispatcher), and the two writes both of them may make to it. Writer-side, so the actors
//! never import the handle's files.

use fleetops_storage::webhooks::WebhookBatch;
use fleetops_storage::{Delivery, DeliveryOutcome, Store};

use super::payload::Payload;
use crate::error::Result;

/// How much the worker takes at a time, in one place: a page of the queue holds several
/// batches, and a batch is cut into messages to the dispatcher. At most two batches are in
/// memory (one worked, one read ahead), so the worker's payload memory is about
/// 2 × `BATCH_BYTES` (each batch may pass it by the one delivery that crosses it).
pub(crate) mod limits {
    /// Queued deliveries' seqs read from the queue at a time.
    pub(crate) const PAGE: usize = 256;
    /// Deliveries read, parsed and worked as one batch.
    pub(crate) const BATCH: usize = 64;
    /// The payload bytes (as sent) one batch reads before it stops taking more.
    pub(crate) const BATCH_BYTES: u64 = 8 << 20;
    /// Deliveries sent to the dispatcher in one message, whose outcomes it writes in one
    /// sled batch. At 16 the worker fell behind 4,000 distinct pull requests a second (its
    /// commits were half its time); 64 holds the dispatcher from runners' calls for a few
    /// milliseconds at most (about 100 µs per delivery).
    pub(crate) const DISPATCH_BATCH: usize = 64;
    const _: () = assert!(BATCH <= PAGE && DISPATCH_BATCH <= BATCH);
}

/// A delivery being worked, with its parsed payload.
pub(crate) struct Work {
    pub delivery: Delivery,
    pub payload: Payload,
    /// The worker's lease when it was read (several nodes): its writes check it.
    pub fence: Option<fleetops_storage::leases::Fence>,
}

impl Work {
    /// A batch for this delivery's writes, fenced by the worker's lease (several nodes).
    pub(crate) fn batch(&self) -> WebhookBatch {
        let mut b = WebhookBatch::default();
        if let Some(f) = &self.fence {
            b.fence(f);
        }
        b
    }
}

/// A queued delivery read for working.
pub(crate) enum Loaded {
    /// Gone, or no longer queued.
    Done,
    /// Its payload does not parse: the dispatcher records the skip.
    Invalid(Box<Delivery>),
    /// For installation `key` (0 when it names none and its repository is held by none).
    Work(u64, std::sync::Arc<Work>),
}

/// A batch read and parsed (each delivery with what reading it gave), and whether it ended
/// cleanly; `None` when the reading thread panicked.
pub(crate) type LoadedBatch = Option<(Vec<(u64, Result<Loaded>)>, bool)>;

/// The worker's next batch, being read while the current one is worked.
pub(crate) struct ReadAhead {
    pub first: u64,
    pub batch: tokio::task::JoinHandle<LoadedBatch>,
}

impl ReadAhead {
    /// Waits for a read-ahead that will not be used to end, so its batch leaves memory before
    /// another is read (dropping the handle would leave the read running beside the next
    /// one). Defensive: a read-ahead is always for the front of what is left of the page. A
    /// worker that restarts drops its state, and a read under way then ends on its own.
    pub(crate) async fn discard(self) {
        let _ = self.batch.await;
    }
}

/// Whether a delivery is still waiting to be worked (a retried call finds it done).
pub(crate) fn still_queued(store: &Store, seq: u64) -> Result<bool> {
    Ok(store
        .delivery(seq)?
        .is_some_and(|d| d.outcome == DeliveryOutcome::Queued))
}

/// The organization a delivery of installation `id` resolves in (0: it names none and no
/// installation holds its repository): the one the installation is bound to; for none, the
/// service's only organization while it has exactly one. `None`: the delivery is skipped
/// (`installation_unbound`, or `repository_not_linked` when it names no installation), so no
/// tenant's link can catch another's repository.
pub(crate) fn delivery_org(store: &Store, id: u64) -> Result<Option<u64>> {
    if id == 0 {
        return Ok(store.sole_org()?);
    }
    Ok(store.installation_binding(id)?.organization_id)
}

/// Records a delivery as skipped with a reason.
pub(crate) fn skip(
    store: &Store,
    d: &Delivery,
    reason: &str,
    fence: Option<&fleetops_storage::leases::Fence>,
) -> Result<()> {
    let mut b = WebhookBatch::default();
    if let Some(f) = fence {
        b.fence(f);
    }
    skip_into(&mut b, d, reason)?;
    Ok(b.commit(store)?)
}

/// Adds a delivery's skip, with its reason, to `b`; it wrote no run.
pub(crate) fn skip_into(b: &mut WebhookBatch, d: &Delivery, reason: &str) -> Result<bool> {
    let mut d = d.clone();
    d.outcome = DeliveryOutcome::Skipped;
    d.reason = Some(reason.into());
    b.finish_delivery(&d)?;
    Ok(false)
}

/// Events that change an installation, or which installation holds a repository: the
/// worker ends a batch after one, and an installation works its own in order with the rest.
pub(crate) fn ends_batch(event: &str) -> bool {
    matches!(event, "installation" | "installation_repositories")
}
