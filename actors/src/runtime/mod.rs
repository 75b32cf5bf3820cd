//! [`Runtime`]: the running supervision tree and the handles into it, what `http` and the
//! binary hold. Started in `start` (one subtree of the tree per function), and told about the
//! other nodes sharing the database in `nodes`.

mod nodes;
mod start;

use crate::{
    Access, Authenticator, DirectoryHandle, ProjectsHandle, Result, SessionsHandle, alerts, backup,
    bus, clock, counters, disk, health, housekeeper, pipeline, webhooks,
};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use fleetops_storage::{BlobStore, Store};
use ractor::ActorRef;

use crate::mailbox::Slot;
use crate::root::RootMsg;

/// The running tree and the handles into it. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    /// Reached through the handles; [`Runtime::store`] exists for tests only.
    pub(crate) store: Store,
    pub auth: Arc<Authenticator>,
    pub access: Access,
    pub directory: DirectoryHandle,
    pub projects: ProjectsHandle,
    pub sessions: SessionsHandle,
    pub pipeline: pipeline::PipelineHandle,
    pub webhooks: webhooks::WebhooksHandle,
    pub alerts: alerts::AlertsHandle,
    pub backups: backup::BackupsHandle,
    /// Lines ingested and notification outcomes, for `/metrics`.
    pub counters: Arc<counters::Counters>,
    /// What travels to the other nodes sharing the database (in-process on one node).
    pub bus: bus::Bus,
    /// Where blobs and sealed log segments live (readiness asks it).
    blobs: BlobStore,
    /// The last readiness answer and when it was made: asked at most once a second.
    ready: Arc<std::sync::Mutex<Option<(std::time::Instant, Readiness)>>>,
    /// The data directory's free space and the floor below which writes are refused.
    pub disk: Arc<disk::DiskSpace>,
    /// The webhook worker and the housekeeper, supervised by the root (killed first at
    /// shutdown: the worker may be waiting on its queue).
    worker: Arc<Slot<webhooks::worker::WorkerMsg>>,
    /// Wakes the worker (fault injection only; the intake wakes it for stored deliveries).
    #[cfg(feature = "fault-injection")]
    worker_feed: webhooks::worker::WorkerFeed,
    housekeeper: Arc<Slot<housekeeper::HousekeeperMsg>>,
    pruners: housekeeper::Pruners,
    /// The root's children that are down now.
    pub health: health::Health,
    /// The time leases, the dedup window and secret grace are measured by.
    pub clock: clock::Clock,
    root: ActorRef<RootMsg>,
    restarts: Arc<AtomicU64>,
    /// Live batches not queued for subscribers too far behind.
    live_skipped: Arc<AtomicU64>,
}

/// What `/readyz` reports: whether this node reaches each engine it needs.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct Readiness {
    /// `ready`; `degraded` when only the bus is out of reach (still serving); `not_ready`
    /// when the database or the blob store is.
    pub status: &'static str,
    /// `ok` or what failed, for the metadata database (sled or PostgreSQL).
    pub database: String,
    /// `ok` or what failed, for the blob store (local directory or S3).
    pub object_store: String,
    /// `ok`, `in-process` (no bus configured) or what failed.
    pub bus: String,
}

impl Readiness {
    /// Whether a load balancer should send requests here.
    pub fn is_ready(&self) -> bool {
        self.status != "not_ready"
    }
}

/// What `/metrics` reports of the store.
#[derive(Debug, Clone)]
pub struct StoreFigures {
    /// Log segments written and fetched, and the chunk cache's hits.
    pub segments: fleetops_storage::sessions::segments::SegmentStats,
    /// Webhook deliveries waiting for the worker.
    pub deliveries_queued: u64,
    /// Deliveries recovered from the payload log at start-up.
    pub deliveries_recovered: u64,
}

impl Runtime {
    /// The store behind the handles, for tests that look at it (the `fault-injection`
    /// feature; the shipped binary has no such way in).
    #[cfg(feature = "fault-injection")]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Whether any user exists (a first start makes the initial administrator).
    pub fn has_users(&self) -> Result<bool> {
        Ok(self.store.any_user_exists()?)
    }

    /// What `/metrics` reports of the store now.
    pub fn store_figures(&self) -> StoreFigures {
        StoreFigures {
            segments: self.store.segment_stats(),
            deliveries_queued: self.store.deliveries_queued().unwrap_or(0),
            deliveries_recovered: self.store.deliveries_recovered(),
        }
    }

    /// The durations of the store's durable commits (group-commit fsyncs on sled,
    /// transactions' commits on PostgreSQL).
    pub fn flush_timings(&self) -> Arc<fleetops_storage::timings::Timings> {
        self.store.flush_timings()
    }

    /// Whether this node reaches its engines: a read from the database, a lookup in the blob
    /// store and a round trip to the bus, each given `wait` (concurrently); the answer is kept
    /// for a second, so a flood of health checks costs the engines nothing more.
    pub async fn readiness(&self, wait: Duration) -> Readiness {
        if let Ok(r) = self.ready.lock()
            && let Some((at, answer)) = r.as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return answer.clone();
        }
        let answer = self.check_readiness(wait).await;
        if let Ok(mut r) = self.ready.lock() {
            *r = Some((std::time::Instant::now(), answer.clone()));
        }
        answer
    }

    async fn check_readiness(&self, wait: Duration) -> Readiness {
        fn verdict<E: std::fmt::Display>(
            r: std::result::Result<std::result::Result<(), E>, tokio::time::error::Elapsed>,
        ) -> String {
            match r {
                Ok(Ok(())) => "ok".into(),
                Ok(Err(e)) => format!("unreachable: {e}"),
                Err(_) => "unreachable: no answer in time".into(),
            }
        }
        let (database, object_store, bus) = tokio::join!(
            tokio::time::timeout(wait, self.store.reachable()),
            tokio::time::timeout(wait, self.blobs.reachable()),
            self.bus.reachable(wait),
        );
        let database = verdict(database);
        let object_store = verdict(object_store);
        let bus = match (self.bus.is_shared(), bus) {
            (false, _) => "in-process".to_string(),
            (true, true) => "ok".to_string(),
            (true, false) => "unreachable".to_string(),
        };
        // The bus down degrades every node alike (caches fall back to their bound, live feeds
        // and alert signals to the store and what each node sees): taking every node out of
        // the load balancer would be worse, so it does not make a node not ready.
        let status = if database != "ok" || object_store != "ok" {
            "not_ready"
        } else if bus == "unreachable" {
            "degraded"
        } else {
            "ready"
        };
        Readiness {
            status,
            database,
            object_store,
            bus,
        }
    }

    /// Sets the base of handed-out links once the listening address is known (when
    /// `public_url` is not configured).
    pub fn set_public_url(&self, url: &str) {
        if let Ok(mut u) = self.pipeline.public_url.write()
            && u.is_empty()
        {
            *u = url.trim_end_matches('/').to_string();
        }
    }

    /// Registers pruning of state kept outside the tree (the edge's rate-limit buckets); the
    /// housekeeper runs it on every pass.
    pub fn on_housekeeping(&self, prune: impl Fn() + Send + Sync + 'static) {
        if let Ok(mut p) = self.pruners.lock() {
            p.push(Box::new(prune));
        }
    }

    /// One housekeeping pass now (tests; the housekeeper also runs every
    /// `housekeeping_seconds`).
    #[doc(hidden)]
    pub fn housekeep_now(&self) {
        self.housekeeper.cast(housekeeper::HousekeeperMsg::Tick);
    }

    /// One sweep for blobs no record points at, now (tests; the housekeeper sweeps hourly).
    #[doc(hidden)]
    pub async fn collect_orphans_now(&self) -> Result<usize> {
        housekeeper::collect_orphans(&self.sessions, &self.pipeline, self.clock.now_ms(), 0).await
    }

    /// As [`Runtime::collect_orphans_now`], with the object store's clock `ahead` of now for
    /// the log segments' grace (tests).
    #[doc(hidden)]
    pub async fn collect_orphans_later(&self, ahead: Duration) -> Result<usize> {
        let ahead = i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX);
        housekeeper::collect_orphans(&self.sessions, &self.pipeline, self.clock.now_ms(), ahead)
            .await
    }

    /// Makes the webhook worker panic (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_worker_panic(&self) {
        self.worker_feed
            .panic_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.worker_feed.stored();
    }

    /// Makes the housekeeper panic (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_housekeeper_panic(&self) {
        self.housekeeper.cast(housekeeper::HousekeeperMsg::Panic);
    }

    /// Actor restarts since start-up, all supervisors together.
    /// Live batches skipped for subscribers over their queue bound (for `/metrics`).
    /// Per family of keyed actors: calls waiting in all their mailboxes, and in the fullest
    /// one (for `/metrics`).
    pub fn mailbox_depths(&self) -> Vec<(&'static str, usize, usize)> {
        let feed = &self.alerts.feed;
        let d = |name, (sum, max)| (name, sum, max);
        vec![
            d("project", self.projects.actors.depths()),
            d("session", self.sessions.actors.depths()),
            d("installation", self.webhooks.installations.depths()),
            d("evaluator", feed.evaluators.depths()),
            d("notifier", feed.notifiers.depths()),
            d("quota", self.pipeline.quota.actors.depths()),
        ]
    }

    /// The most memory one streamed upload's writer holds (the edge reserves it from the
    /// body budget while the upload runs).
    pub fn upload_buffer_bytes(&self) -> usize {
        self.sessions.blobs.stream_buffer_bytes()
    }

    pub fn live_batches_skipped(&self) -> u64 {
        self.live_skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn restarts(&self) -> u64 {
        self.restarts.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the tree, leaves first (project actors, then the root's children, then the
    /// root), and flushes storage.
    pub async fn shutdown(&self) {
        let t = Some(Duration::from_secs(10));
        // The worker first: a delivery it was working stays queued and is worked after the
        // next start.
        for a in [
            self.worker.get().map(|a| a.get_cell()),
            self.housekeeper.get().map(|a| a.get_cell()),
        ]
        .into_iter()
        .flatten()
        {
            a.kill();
            let _ = a.wait(t).await;
        }
        for sup in [
            self.sessions.actors.sup.get().map(|a| a.get_cell()),
            self.projects.actors.sup.get().map(|a| a.get_cell()),
            self.webhooks.installations.sup.get().map(|a| a.get_cell()),
            self.pipeline.quota.actors.sup.get().map(|a| a.get_cell()),
        ]
        .into_iter()
        .flatten()
        {
            sup.stop_children_and_wait(None, t).await;
        }
        self.root.stop_children_and_wait(None, t).await;
        let _ = self.root.stop_and_wait(None, t).await;
        // Nothing here decides any more: what this node held (rollouts, the webhook queue,
        // projects' alerting, housekeeping) goes to the other nodes at once, not when it
        // runs out.
        if self.bus.is_shared() {
            let (store, node) = (self.store.clone(), self.bus.node_id());
            let released =
                tokio::task::spawn_blocking(move || store.release_leases(node, clock::now_ms()))
                    .await;
            match released {
                Ok(Ok(n)) => tracing::info!(leases = n, "leases given back"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not give the leases back"),
                Err(e) => tracing::warn!(error = %e, "could not give the leases back"),
            }
        }
        if let Err(e) = self.store.flush_blocking() {
            tracing::error!(error = %e, "final flush failed");
        }
    }
}
