//! Housekeeper: the periodic chores, as one supervised actor ticking every
//! `[supervision] housekeeping_seconds`. Each pass:
//! - runs the registered pruners: in-memory state that would otherwise grow with the number of
//!   callers (the authenticator's key-touch map, and the edge's rate-limit buckets, which the
//!   binary registers), and final records past their retention (heartbeat samples past
//!   `[alerts] history_days`, alerts resolved past `retention_days`), a bounded number a pass;
//! - asks the directory to forget sign-outs whose tokens have all expired;
//! - purges uploads never confirmed once their link expired (never one whose upload or confirm
//!   is under way);
//! - asks the intake (the owner of delivery ids) to expire the delivery log past its retention;
//! - seals the log batches of sessions whose oldest unsealed batch is older than `[logs]
//!   seal_age_seconds` (`session/sealer.rs`), and deletes ended sessions past their project's
//!   retention (`[logs] retention_days` or the project's own), at most 1,000 a pass, and
//!   deletes the log segments of deleted sessions still on the to-delete list;
//! - starts what runs only on its own timers and is down (past its restart budget, or after a
//!   start that failed): the controllers of rollouts with work left, the evaluators of
//!   projects with enabled rules, the notifiers of projects with owed notifications; and,
//!   every 10 minutes, the validations of confirms answered 202 whose verdict is not written;
//! - on its first pass and then hourly (a crash may leave some), deletes blobs no record points
//!   at; an artifact blob only once it is 24 h old, as its upload may still be streaming, and a
//!   log segment only once it is an hour old, as its seal may still be committing.
//!
//! Several nodes: what keeps this node's own state (the pruners, the controllers, evaluators
//! and notifiers it runs) is done on every node; the chores on shared records (sign-outs,
//! purges, expired uploads, the delivery log, seals, retention, segments, validations,
//! orphaned blobs) only by the node holding the lease `housekeeping`, which lasts two passes
//! and is renewed at each, so a dead holder's chores are taken over within two passes.
//!
//! It keeps nothing that matters across a restart: the next incarnation starts its own timer.
//! It writes no live record itself: each chore that changes one goes through the actor that
//! owns its keys; only final records (samples, resolved alerts) are deleted directly, since no
//! writer changes them any more.
//!
//! Tested through the API tests of its chores (samples and alerts past their retention, the
//! delivery log's retention, expired uploads, orphaned blobs) and with a panic injected
//! (`tests/api/supervision/`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::auth::Authenticator;
use crate::mailbox::Envelope;
use crate::pipeline::PipelineHandle;
use crate::session::handle::SessionsHandle;
use crate::webhooks::WebhooksHandle;

/// How often the blob stores are swept for orphans (a listing of every blob).
const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// How often failed background validations are tried again.
const VALIDATIONS_EVERY: Duration = Duration::from_secs(600);
/// An unreferenced artifact blob younger than this may be an upload still streaming.
pub(crate) const ORPHAN_GRACE_MS: i64 = 24 * 3_600_000;

/// Deletes the blobs no record points at (see the two sweeps); how many went.
pub(crate) async fn collect_orphans(
    sessions: &SessionsHandle,
    pipeline: &PipelineHandle,
    now_ms: i64,
    store_ahead_ms: i64,
) -> crate::Result<usize> {
    let artifacts = sessions
        .collect_orphans(now_ms, ORPHAN_GRACE_MS, store_ahead_ms)
        .await?;
    Ok(artifacts + pipeline.collect_orphans().await?)
}

/// Pruning registered from outside the tree (the edge's rate-limit buckets).
pub(crate) type Pruners = Arc<Mutex<Vec<Box<dyn Fn() + Send + Sync>>>>;

pub(crate) enum HousekeeperMsg {
    Tick,
    /// Fault injection for supervision tests.
    #[cfg(feature = "fault-injection")]
    Panic,
}

pub(crate) struct Housekeeper;

#[derive(Clone)]
pub(crate) struct HousekeeperArgs {
    pub pipeline: PipelineHandle,
    pub sessions: SessionsHandle,
    pub webhooks: WebhooksHandle,
    pub alerts: crate::alerts::AlertsHandle,
    pub clock: crate::clock::Clock,
    /// When this incarnation last swept for orphaned blobs.
    pub last_sweep: Option<Instant>,
    /// When this incarnation last resumed failed capsule validations.
    pub last_validations: Option<Instant>,
    pub auth: Arc<Authenticator>,
    pub directory: crate::directory::DirectoryHandle,
    pub pruners: Pruners,
    pub every: Duration,
    /// Several nodes: the shared chores run under a lease (this node's bus id).
    pub bus: crate::bus::Bus,
}

impl HousekeeperArgs {
    /// Whether this node does the chores on shared records this pass: always on one node;
    /// with several, while it holds the lease `housekeeping` (two passes long).
    async fn holds_shared_chores(&self) -> bool {
        if !self.bus.is_shared() {
            return true;
        }
        let store = self.pipeline.store.clone();
        let (node, now) = (self.bus.node_id(), self.clock.now_ms());
        let ttl = i64::try_from(self.every.as_millis().saturating_mul(2)).unwrap_or(i64::MAX);
        matches!(
            tokio::task::spawn_blocking(move || store.take_lease("housekeeping", node, now, ttl))
                .await,
            Ok(Ok(Some(_)))
        )
    }
}

impl Actor for Housekeeper {
    type Msg = Envelope<HousekeeperMsg>;
    type State = HousekeeperArgs;
    type Arguments = HousekeeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: HousekeeperArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        // The timer ends with this incarnation (its casts fail); a restart starts another.
        myself.send_interval(args.every, || Envelope::cast(HousekeeperMsg::Tick));
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg.open() {
            Some(HousekeeperMsg::Tick) => {}
            #[cfg(feature = "fault-injection")]
            Some(HousekeeperMsg::Panic) => panic!("injected fault in the housekeeper"),
            None => return Ok(()),
        }
        if let Ok(p) = st.pruners.lock() {
            for prune in p.iter() {
                prune();
            }
        }
        st.auth.prune();
        // What this node runs itself, however the shared chores go.
        if let Err(e) = st.pipeline.resume_rollouts().await {
            tracing::warn!(error = %e, "restarting rollout controllers failed");
        }
        if let Err(e) = st.alerts.revive().await {
            tracing::warn!(error = %e, "reviving alert evaluators and notifiers failed");
        }
        if !st.holds_shared_chores().await {
            return Ok(());
        }
        if let Err(e) = st.directory.prune_sign_outs(st.clock.now_ms()).await {
            tracing::warn!(error = %e, "forgetting expired sign-outs failed");
        }
        if let Err(e) = st.directory.resume_purges() {
            tracing::warn!(error = %e, "resuming the purge of deleted organizations failed");
        }
        if let Err(e) = st.pipeline.purge_expired().await {
            tracing::warn!(error = %e, "purging expired uploads failed");
        }
        if let Err(e) = st.webhooks.expire().await {
            tracing::warn!(error = %e, "expiring webhook deliveries failed");
        }
        if let Err(e) = st.sessions.seal_owed(st.clock.now_ms()).await {
            tracing::warn!(error = %e, "sealing log batches failed");
        }
        if let Err(e) = st.sessions.delete_doomed_segments().await {
            tracing::warn!(error = %e, "deleting the log segments of deleted sessions failed");
        }
        match st.sessions.expire_sessions(st.clock.now_ms()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(sessions = n, "deleted sessions past their retention"),
            Err(e) => tracing::warn!(error = %e, "deleting sessions past their retention failed"),
        }
        // The same for confirms answered 202 whose background validation failed (a storage
        // or S3 error), every few minutes (each hashes up to a capsule's size again): one
        // running now holds its capsule's lock and is left alone.
        if st
            .last_validations
            .is_none_or(|t| t.elapsed() >= VALIDATIONS_EVERY)
        {
            st.last_validations = Some(Instant::now());
            if let Err(e) = st.pipeline.resume_validations() {
                tracing::warn!(error = %e, "resuming capsule validations failed");
            }
        }
        if st
            .last_sweep
            .is_none_or(|t| t.elapsed() >= ORPHAN_SWEEP_EVERY)
        {
            st.last_sweep = Some(Instant::now());
            match collect_orphans(&st.sessions, &st.pipeline, st.clock.now_ms(), 0).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(blobs = n, "collected orphaned blobs"),
                Err(e) => tracing::warn!(error = %e, "collecting orphaned blobs failed"),
            }
        }
        Ok(())
    }
}
