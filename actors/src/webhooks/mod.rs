//! Inbound webhooks from the source-code host, as mailbox flows:
//!
//! ```text
//! POST /scm/webhooks ─ verify (HMAC, constant time) ─▶ IntakeActor (claim id + store, atomic)
//!        ◀── 202 once in the journal (fdatasync) ─────┘         │ seq
//!                                                               ▼
//!                       WebhookWorker (arrival order) ─▶ InstallationActor (one per installation)
//!                                                               │
//!                                                               ▼
//!                                                         JobDispatcher ─▶ test runs
//! ```
//!
//! A delivery answered 202 is on disk with its payload and a place in the queue: the intake
//! appends a batch's payloads and a journal record of its deliveries to the payload log with
//! one `fdatasync`, then claims the ids and stores the deliveries in one sled write without
//! waiting for sled's flush, and the store replays the journal at open for whatever sled lost.
//! The worker's effect and the delivery's outcome are written in one batch, and the
//! installation actor and the dispatcher act on a delivery only while it is still `queued`, so
//! after a crash, or a call retried while the first is still queued, every queued delivery is
//! processed exactly once. Reads (lists, status) go to the store.
//!
//! The store is the worker's queue (the list of `queued` deliveries), read a page at a time,
//! so a backlog costs a page of memory. A delivery that keeps failing (other than on an actor
//! that is down) is recorded `processing_failed` after five retries, so one poison delivery
//! cannot stall the queue. Each installation is bound to one organization, and its deliveries
//! resolve only to repository links of that organization's projects.
//!
//! Tested through the real server (`tests/api/webhooks.rs`: signatures, dedup, policy, batches
//! that fail part-way, panics), by unit tests of the intake, the dispatcher and the payloads,
//! and by the crash harness, whose kills land between a batch's 202 and sled's flush.

mod deliveries;
pub(crate) mod dispatcher;
pub(crate) mod installation;
pub(crate) mod intake;
pub mod payload;
mod repositories;
mod runs;
mod secret;
pub(crate) use secret::signature_matches;
mod views;
pub(crate) mod work;
pub(crate) mod worker;

pub use intake::SecretState;
pub use repositories::RepoPatch;
pub(crate) use secret::{SECRET_SUBJECT, load_secret};
pub use views::*;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};

use fleetops_storage::Store;

#[cfg(feature = "fault-injection")]
use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::mailbox::Slot;
use dispatcher::DispatcherMsg;
use installation::InstallationActor;
#[cfg(feature = "fault-injection")]
use installation::InstallationMsg;
use intake::IntakeMsg;

pub use crate::config::{RunsConfig, ScmConfig};

/// Rejected and duplicate deliveries kept in memory (never their bodies).
const RECENT_REJECTED: usize = 1000;

/// The way in for the webhook family: intake, the delivery log, repositories, test runs and
/// the secret. Cheap to clone.
#[derive(Clone)]
pub struct WebhooksHandle {
    pub(crate) store: Store,
    pub(crate) intake: Arc<Slot<IntakeMsg>>,
    pub(crate) dispatcher: Arc<Slot<DispatcherMsg>>,
    pub(crate) installations: Keyed<InstallationActor>,
    pub(crate) secret: Arc<RwLock<SecretState>>,
    pub(crate) cfg: ScmConfig,
    pub(crate) rejected: Arc<Mutex<VecDeque<DeliveryView>>>,
    pub(crate) failures: Arc<Mutex<VecDeque<i64>>>,
    pub(crate) clock: crate::clock::Clock,
    /// Several nodes: a rotation here is announced to the others, which read the secret
    /// again; a signature that fails reads it again too, at most once a second
    /// (`secret_read_at`, Unix ms, that read's time), in case the announcement was lost or is
    /// still on its way.
    pub(crate) bus: crate::bus::Bus,
    pub(crate) secret_read_at: Arc<std::sync::atomic::AtomicI64>,
    /// Several nodes: the webhook worker's lease as this node last took or renewed it
    /// (`None` while another node holds it). Every write a delivery's working makes is
    /// fenced by it, so a node that stalled past its lease and resumed writes nothing.
    pub(crate) worker_fence: Arc<std::sync::Mutex<Option<fleetops_storage::leases::Fence>>>,
}

impl WebhooksHandle {
    /// The worker's lease as last taken (several nodes), for the deliveries read now.
    pub(crate) fn worker_fence(&self) -> Option<fleetops_storage::leases::Fence> {
        self.worker_fence
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl WebhooksHandle {
    /// Makes the intake's next batch write this much slower (deadline tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_write_stall(&self, d: std::time::Duration) {
        self.intake.cast(IntakeMsg::StallNextWrite(d));
    }

    /// Holds the intake's next batch write until the returned hold is released (deadline
    /// tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_write_hold(&self) -> Arc<WriteHold> {
        let h = Arc::new(WriteHold::default());
        self.intake.cast(IntakeMsg::HoldNextWrite(h.clone()));
        h
    }

    /// Makes the intake panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_intake_panic(&self) {
        self.intake.cast(IntakeMsg::Panic);
    }

    /// Makes the dispatcher panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_dispatcher_panic(&self) {
        self.dispatcher.cast(DispatcherMsg::Panic);
    }

    /// Makes the `n`th delivery the dispatcher works from now on fail once (tests only); the
    /// flag says whether it did.
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_dispatch_failure(&self, n: u32) -> Arc<std::sync::atomic::AtomicBool> {
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.dispatcher
            .cast(DispatcherMsg::FailDispatch(n, fired.clone()));
        fired
    }

    /// Makes the dispatcher's next shared batch of outcomes fail to commit (tests only); the
    /// flag says whether it did.
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_commit_failure(&self) -> Arc<std::sync::atomic::AtomicBool> {
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.dispatcher
            .cast(DispatcherMsg::FailCommit(fired.clone()));
        fired
    }

    /// Calls waiting on the intake now, queued or being answered (deadline tests only).
    #[doc(hidden)]
    pub fn intake_waiting(&self) -> usize {
        self.intake.waiting()
    }

    /// Makes an installation's actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_panic(&self, installation_id: u64) -> Result<()> {
        let a = self.installations.actor(installation_id).await?;
        a.cast(crate::mailbox::Envelope::cast(InstallationMsg::Panic))
            .map_err(|_| Error::Unavailable {
                retry_after_secs: 1,
            })
    }
}

/// A batch write of the intake held by a test: `reached` once the write waits (its batch is
/// closed then, so what arrives next queues for the following one), until `release`.
#[doc(hidden)]
#[cfg(feature = "fault-injection")]
#[derive(Default)]
pub struct WriteHold {
    release: tokio::sync::Notify,
    reached: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "fault-injection")]
impl WriteHold {
    pub fn release(&self) {
        self.release.notify_one();
    }

    pub fn reached(&self) -> bool {
        self.reached.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) async fn wait(&self) {
        self.reached
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.release.notified().await;
    }
}
