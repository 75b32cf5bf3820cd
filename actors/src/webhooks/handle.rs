//! [`WebhooksHandle`]: the way into the webhook family: intake, the delivery log,
//! repositories, test runs and the secret.

use super::*;

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
