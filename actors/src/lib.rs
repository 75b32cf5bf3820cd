//! The fleetops supervision tree: every behaviour and state change lives here.
//!
//! ```text
//! RootSupervisor
//!  ├─ DirectoryActor        single writer: users, organizations, members, projects, API keys,
//!  │                        sign-outs
//!  ├─ ProjectsSupervisor
//!  │   └─ ProjectActor      one per project (started on first use): devices, groups,
//!  │                        heartbeats, session records (status, tags, deletion), capsules,
//!  │                        configurations, deployment packages, rollout results and
//!  │                        decisions, integrations and alert rules
//!  ├─ SessionsSupervisor
//!  │   └─ SessionActor      one per active session: its log chunks, counters and artifacts,
//!  │                        the replay buffer and the live fan-out
//!  ├─ IntakeActor           webhook delivery ids (dedup), the payload journal, the secret
//!  ├─ JobDispatcher         repository links, test runs, idempotency keys
//!  ├─ InstallationsSupervisor
//!  │   └─ InstallationActor one per host installation: its lifecycle and repositories
//!  ├─ QuotasSupervisor
//!  │   └─ QuotaActor        one per organization: checks and reserves its storage quota
//!  ├─ NotifiersSupervisor
//!  │   └─ Notifier          one per project with owed notifications: sends, retries, records
//!  ├─ EvaluatorsSupervisor
//!  │   └─ RuleEvaluator     one per project with enabled rules: condition states and alerts
//!  ├─ RolloutsSupervisor
//!  │   └─ RolloutController one per phased rollout with work left: judges its phase's gate
//!  ├─ WebhookWorker         routes queued deliveries to their owners, in arrival order
//!  └─ Housekeeper           retention, expired uploads, orphaned blobs; restarts what
//!                           runs on its own timers and is down
//! ```
//!
//! A panic inside an actor's handler is caught by ractor and reported to its supervisor, which
//! restarts the actor from storage within the `[supervision]` budget: the request being handled
//! gets a 500 and wrote nothing, the requests queued behind it are sent once more to the
//! replacement, and an actor left down past its budget answers 503 while the rest serves.
//! Handles are the only way in: writes pass through the owning actor, one atomic batch each,
//! and are answered once durable (a group commit; for webhook deliveries, the payload journal's
//! fsync); reads go to the store. Every call has a deadline (`call_timeout_ms`) and every
//! mailbox a bound (`mailbox_limit`); a call whose caller gave up before the actor took it on
//! is never applied.
//!
//! This crate never touches hyper; `http` never touches sled.
//!
//! # Module map
//!
//! Three layers, imports pointing one way (`tests/layering.rs` fails on an import cycle
//! between modules or between families, on a rule that imports anything but other rules and
//! `error`, `versions`, `clock` or `text`, and on a writer that imports a handle):
//!
//! - **Handles**, the typed API `http` calls (validate input, send one message, shape the
//!   reply): `directory` (users, organizations, projects, keys), [`projects`] (devices,
//!   groups, heartbeats), [`sessions`] (sessions, logs, artifacts, exports), [`pipeline`]
//!   (capsules, configurations, deployments, rollouts, the device update API), [`webhooks`]
//!   (intake, delivery log, repositories, test runs), [`alerts`] (integrations, rules, the
//!   alert history, backtests).
//! - **Writers**, the actors, each the single writer of its keys: `project` (one per project),
//!   `session` (one per active session), `quota` (one per organization), `webhooks::intake`,
//!   `webhooks::installation`, `webhooks::dispatcher`, `directory`, `alerts::evaluator` (one
//!   per project with rules), `alerts::notifier` (one per project with owed notifications);
//!   supervised by `root` through `keyed` (per-entity supervisors) with `mailbox` (deadlines,
//!   bounded waiting, the caller's state) and `supervision` (restart budgets). Three
//!   supervised actors write nothing and drive the writers through the handles:
//!   `webhooks::worker`, `housekeeper` and `rollout` (the rollout controllers).
//! - **Rules**, functions and types that decide and never write (some read the store):
//!   [`rules`] (input formats, deployment evaluation, rollout plans and gates, configuration
//!   lineage and files, quota counting, blob keys, alert conditions, integration configs and
//!   wire formats, outbound targets, backtests), [`versions`], [`logs`] (log batches and
//!   filters).
//!
//! Leaf modules shared by writers and handles: `assignments` (which package each device should
//! run, cached), [`provenance`] (package → capsule → commit → test runs), `shares` (pools with
//! a bounded share per organization) and `signals` (what device and log handles tell the alert
//! evaluators). Beside them: [`bus`] (what travels between nodes sharing a database, and
//! the leases that let one of them decide), [`config`] (settings), [`clock`], [`error`], [`events`] (the
//! outbox events leave their writer through), [`auth`] and [`access`] (who may do what),
//! [`links`] (signed upload and download links), [`live`] (the live log stream), [`views`]
//! (response shapes), [`health`] (what `/healthz` reports), [`backup`], [`archives`],
//! [`secrets`] and `sealing` (where the key of integration secrets lives).
//!
//! Tested by unit tests beside the code, `tests/layering.rs`, and the workspace's API tests,
//! which turn on the `fault-injection` feature to make actors panic, stall or fail to start
//! (the shipped binary has none of these hooks).

pub mod access;
pub mod alerts;
pub mod archives;
mod assignments;
pub mod auth;
pub mod backup;
pub mod bus;
pub mod clock;
pub mod config;
pub mod counters;
/// Atomic duration histograms (request polls at the edge, group-commit fsyncs here).
pub use fleetops_storage::timings;

mod directory;
pub mod disk;
pub mod error;
pub mod events;
pub mod fuzzing;
pub mod health;
mod housekeeper;
mod keyed;
pub mod links;
pub mod live;
pub mod logs;
mod mailbox;
pub mod pipeline;
mod project;
pub mod provenance;
pub use project::handle as projects;
mod quota;
mod rollout;
mod root;
pub mod rules;
mod sealing;
pub mod secrets;
mod session;
mod shares;
mod signals;
pub use session::handle as sessions;
mod supervision;
pub mod text;
pub mod versions;
pub mod views;
pub mod webhooks;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dashmap::DashMap;
use fleetops_storage::{BlobStore, Store};
use ractor::{Actor, ActorRef};

pub use access::{Access, OrgScope, ProjectScope};
pub use auth::{Authenticator, Credential, Principal};
pub use config::RuntimeConfig;
pub use directory::{BootstrapReq, DirectoryHandle};
pub use error::{Error, Result};
pub use fleetops_storage::{
    AlertState, DeliveryOutcome, DeploymentStatus, InstallationState, Organization, Role,
    RolloutState, RolloutStatus, RunStatus, UpdateState, ValidationStatus,
};
pub use projects::ProjectsHandle;
pub use sessions::SessionsHandle;

use keyed::{Keyed, KeyedArgs};
use mailbox::Slot;
use root::{RootArgs, RootMsg, RootSupervisor};

/// The running tree and the handles into it. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    pub store: Store,
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

/// The bus subject on which a node announces a change that may change which package a
/// device of a project should run (the project's id, 8 bytes big-endian).
const ASSIGNMENTS_SUBJECT: &str = "fleetops.assignments";

/// How often a node computes every device's package again, when the bus may have lost a
/// change announcement.
const ASSIGNMENTS_REFRESH: Duration = Duration::from_secs(2);

/// Several nodes: starts the controllers the other nodes start (so one stands by to take over
/// each rollout's lease), and computes the packages of a project's devices again when another
/// node changed the project; tells the others of this node's changes.
async fn listen_to_other_nodes(
    store: &Store,
    bus: &bus::Bus,
    controllers: &keyed::Keyed<rollout::RolloutActor>,
    assignments: &Arc<assignments::Assignments>,
) -> anyhow::Result<()> {
    fn id_of(m: &bus::Message) -> Option<u64> {
        Some(u64::from_be_bytes(m.payload.get(..8)?.try_into().ok()?))
    }
    let b = bus.clone();
    assignments.on_change(Box::new(move |project| {
        b.publish(ASSIGNMENTS_SUBJECT.into(), &project.to_be_bytes());
    }));
    let mut changes = bus.subscribe(ASSIGNMENTS_SUBJECT).await?;
    let a = Arc::downgrade(assignments);
    tokio::spawn(async move {
        while let Some(m) = changes.next().await {
            let (Some(a), Some(p)) = (a.upgrade(), id_of(&m)) else {
                break;
            };
            a.changed_elsewhere(p);
        }
    });
    let a = Arc::downgrade(assignments);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(ASSIGNMENTS_REFRESH);
        loop {
            every.tick().await;
            let Some(a) = a.upgrade() else { break };
            a.refresh_all();
        }
    });
    // An organization deleted on another node: its projects refused here within a second
    // even if the announcement was lost.
    let s = store.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            every.tick().await;
            let s = s.clone();
            let _ = tokio::task::spawn_blocking(move || s.refresh_retired()).await;
        }
    });
    let mut starts = bus.subscribe(rollout::SUBJECT).await?;
    let controllers = controllers.clone();
    tokio::spawn(async move {
        while let Some(m) = starts.next().await {
            if let Some(id) = id_of(&m) {
                rollout::start(&controllers, id).await;
            }
        }
    });
    Ok(())
}

/// The bus subject on which a node announces that it wrote a cached record.
const CACHES_SUBJECT: &str = "fleetops.caches";

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

/// The meta key of the generated JWT secret.
const JWT_SECRET_META: &str = "jwt_secret";
/// The meta key of the key that seals what travels on the bus between nodes.
const BUS_KEY_META: &str = "bus_key";
/// The meta key of the key that signs upload and download links.
const LINK_KEY_META: &str = "link_signing_key";

impl Runtime {
    /// Starts the supervision tree over an open store.
    pub async fn start(store: Store, blobs: BlobStore, cfg: RuntimeConfig) -> anyhow::Result<Self> {
        // Sealed log chunks go to the blob store, and are read back on blocking threads.
        store.attach_segments(
            blobs.clone(),
            tokio::runtime::Handle::current(),
            cfg.logs.cache_bytes,
        );
        let bus = if cfg.bus.url.is_empty() {
            bus::Bus::local()
        } else {
            // Kept beside the JWT secret, so every node sharing the database finds it.
            let fresh = secrets::random_bytes(bus::KEY_LEN)?;
            let key = store.meta_get_or_init(BUS_KEY_META, || fresh)?;
            bus::Bus::connect(&cfg.bus, &key).await?
        };
        if bus.is_shared() {
            // Another node's write of a cached record clears this node's caches.
            let b = bus.clone();
            store.on_cache_forget(Box::new(move || b.publish(CACHES_SUBJECT.into(), &[])));
            let mut forgets = bus.subscribe(CACHES_SUBJECT).await?;
            let s = store.clone();
            tokio::spawn(async move {
                while forgets.next().await.is_some() {
                    s.forget_cached();
                }
            });
        }
        let secret = if cfg.auth.jwt_secret.is_empty() {
            // Drawn before the call so that a failing random source fails the start, not
            // stores an empty key.
            let fresh = secrets::random_bytes(32)?;
            store.meta_get_or_init(JWT_SECRET_META, || fresh)?
        } else {
            if cfg.auth.jwt_secret.len() < 32 {
                anyhow::bail!("the configured JWT secret is shorter than 32 bytes");
            }
            cfg.auth.jwt_secret.as_bytes().to_vec()
        };
        if secret.len() < 32 {
            anyhow::bail!("could not generate a JWT secret");
        }
        let (touch_tx, mut touch_rx) = tokio::sync::mpsc::unbounded_channel();
        let auth = Arc::new(Authenticator::new(
            store.clone(),
            cfg.auth.clone(),
            &secret,
            touch_tx,
        )?);

        let timeout = Duration::from_millis(cfg.supervision.call_timeout_ms);
        let limit = cfg.supervision.mailbox_limit.max(1);
        let directory_slot = Arc::new(Slot::new(limit, timeout));
        let projects_slot = Arc::new(Slot::new(limit, timeout));
        let sessions_slot = Arc::new(Slot::new(limit, timeout));
        let intake_slot = Arc::new(Slot::new(limit, timeout));
        let dispatcher_slot = Arc::new(Slot::new(limit, timeout));
        let installations_slot = Arc::new(Slot::new(limit, timeout));
        let restarts = Arc::new(AtomicU64::new(0));
        let health = health::Health::default();
        let quotas_slot = Arc::new(Slot::new(limit, timeout));
        let evaluators_slot = Arc::new(Slot::new(limit, timeout));
        let notifiers_slot = Arc::new(Slot::new(limit, timeout));
        let rollouts_slot = Arc::new(Slot::new(limit, timeout));
        let quota_args = KeyedArgs::<quota::QuotaActor> {
            ctx: store.clone(),
            cfg: cfg.supervision.clone(),
            registry: Arc::new(DashMap::new()),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        let clock = clock::Clock::default();
        let rollouts = events::Outbox::start(store.clone());
        let sealer = sealing::sealer(&store, &cfg.secrets)?;
        let assignments = Arc::new(assignments::Assignments::new(
            cfg.pipeline.device_cache_entries,
        ));
        let project_args = KeyedArgs::<project::ProjectActor> {
            ctx: project::ProjectCtx {
                store: store.clone(),
                rollouts: rollouts.clone(),
                assignments: assignments.clone(),
                clock: clock.clone(),
                alerting: project::alerting::AlertingCtx {
                    sealer: sealer.clone(),
                    allow_private_targets: cfg.alerts.allow_private_targets,
                    history_resolution_ms: (cfg.alerts.history_resolution_seconds as i64)
                        .saturating_mul(1000),
                    max_rules: cfg.alerts.max_rules_per_project,
                    max_integrations_per_rule: cfg.alerts.max_integrations_per_rule,
                },
            },
            cfg: cfg.supervision.clone(),
            registry: Arc::new(DashMap::new()),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        let live_skipped = Arc::new(AtomicU64::new(0));
        let counters = Arc::new(counters::Counters::default());
        let log_sealer =
            session::sealer::LogSealer::new(store.clone(), cfg.logs.clone(), counters.clone());
        let session_args = KeyedArgs::<session::SessionActor> {
            ctx: (
                store.clone(),
                cfg.sessions.clone(),
                live_skipped.clone(),
                log_sealer.clone(),
                bus.clone(),
            ),
            cfg: cfg.supervision.clone(),
            registry: Arc::new(DashMap::new()),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        store.backfill_commit_runs()?;
        store.backfill_results_by_time()?;
        let bound = store.bind_installations()?;
        if bound > 0 {
            tracing::info!(
                installations = bound,
                "bound installations stored before installations belonged to organizations"
            );
        }
        let lowered = store.lowercase_run_commits()?;
        if lowered > 0 {
            tracing::info!(
                runs = lowered,
                "lower-cased the commits of runs stored before commits were lower-cased at parse"
            );
        }
        let feed = webhooks::worker::WorkerFeed {
            bus: bus.is_shared().then(|| bus.clone()),
            ..Default::default()
        };
        let installation_args = KeyedArgs::<webhooks::installation::InstallationActor> {
            ctx: (store.clone(), dispatcher_slot.clone()),
            cfg: cfg.supervision.clone(),
            registry: Arc::new(DashMap::new()),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        let installation_actors = Keyed::new(
            installations_slot.clone(),
            installation_args.registry.clone(),
            cfg.supervision.clone(),
        );
        let project_actors = Keyed::new(
            projects_slot.clone(),
            project_args.registry.clone(),
            cfg.supervision.clone(),
        );
        let sender = alerts::sender::Sender::new(&cfg.alerts, &cfg.smtp)?;
        let notifier_args = KeyedArgs::<alerts::notifier::NotifierActor> {
            ctx: alerts::notifier::NotifierCtx {
                counters: counters.clone(),
                store: store.clone(),
                clock: clock.clone(),
                sealer: sealer.clone(),
                sender: sender.clone(),
                cfg: Arc::new(cfg.alerts.clone()),
                slots: shares::Shares::new(
                    cfg.alerts.max_in_flight,
                    cfg.alerts.max_in_flight_per_org,
                ),
                bus: bus.clone(),
            },
            cfg: cfg.supervision.clone(),
            registry: Arc::new(DashMap::new()),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        let notifier_actors = Keyed::new(
            notifiers_slot.clone(),
            notifier_args.registry.clone(),
            cfg.supervision.clone(),
        );
        let disk = Arc::new(disk::DiskSpace::new(store.clone(), cfg.min_free_bytes));
        let evaluator_busy = Arc::new(AtomicU64::new(0));
        let rule_health: alerts::evaluator::RuleHealthMap = Arc::new(DashMap::new());
        #[cfg(feature = "fault-injection")]
        let fail_log_sets = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let evaluator_args = KeyedArgs::<alerts::evaluator::EvaluatorActor> {
            ctx: alerts::evaluator::EvaluatorCtx {
                store: store.clone(),
                clock: clock.clone(),
                offline_after_ms: (cfg.devices.offline_after_seconds as i64).saturating_mul(1000),
                tick: Duration::from_millis(cfg.alerts.tick_ms.clamp(10, 1000)),
                correlation_window_ms: cfg.alerts.correlation_window_seconds.saturating_mul(1000),
                busy_ns: evaluator_busy.clone(),
                notifiers: notifier_actors.clone(),
                rule_health: rule_health.clone(),
                disk: disk.clone(),
                bus: bus.clone(),
                lease_ttl_ms: cfg.bus.lease_ttl_ms.max(100) as i64,
                #[cfg(feature = "fault-injection")]
                fail_log_sets: fail_log_sets.clone(),
            },
            cfg: cfg.supervision.clone(),
            registry: Arc::new(DashMap::new()),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        let alert_feed = alerts::evaluator::AlertFeed {
            evaluators: Keyed::new(
                evaluators_slot.clone(),
                evaluator_args.registry.clone(),
                cfg.supervision.clone(),
            ),
            notifiers: notifier_actors.clone(),
            active: Arc::new(DashMap::new()),
            log_bytes: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_log_bytes: cfg.alerts.max_log_bytes_in_flight.max(1),
            dropped: Arc::new(AtomicU64::new(0)),
            rule_health: rule_health.clone(),
            bus: bus.clone(),
            #[cfg(feature = "fault-injection")]
            fail_log_sets,
        };
        let session_actors = Keyed::new(
            sessions_slot.clone(),
            session_args.registry.clone(),
            cfg.supervision.clone(),
        );

        // The handles first (they only hold slots and the store), so that the supervised
        // worker and housekeeper can be given theirs.
        let rollout_registry: keyed::Registry<rollout::RolloutMsg> = Arc::new(DashMap::new());
        let (stop_feed, stop_store, stop_rollouts) =
            (alert_feed.clone(), store.clone(), rollout_registry.clone());
        let directory = DirectoryHandle {
            offboarding: directory::purge::Offboarding {
                store: store.clone(),
                blobs: blobs.clone(),
                stop_project: Arc::new(move |pid| {
                    stop_feed.stop_project(pid);
                    // Its rollout controllers too, so none sends a gate's notice for it.
                    if let Ok(deployments) = stop_store.project_deployments(pid) {
                        for d in deployments {
                            if let Some(a) = stop_rollouts.get(&d.id) {
                                a.stop(None);
                            }
                        }
                    }
                }),
                running: Arc::new(DashMap::new()),
                step: cfg.supervision.purge_records_per_step.max(1),
                pause: Duration::from_millis(cfg.supervision.purge_pause_ms),
                grace: Duration::from_millis(cfg.supervision.call_timeout_ms)
                    + Duration::from_secs(1),
            },
            slot: directory_slot.clone(),
            store: store.clone(),
            sign_in_lifetime_ms: (cfg.auth.refresh_window_seconds as i64)
                .saturating_add(cfg.auth.token_ttl_seconds as i64)
                .saturating_mul(1000),
        };
        let projects = ProjectsHandle {
            actors: project_actors,
            store: store.clone(),
            devices: cfg.devices.clone(),
            restarts: restarts.clone(),
            clock: clock.clone(),
            alerts: Arc::new(alert_feed.clone()),
        };
        let controllers = Keyed::new(
            rollouts_slot.clone(),
            rollout_registry,
            cfg.supervision.clone(),
        );
        #[cfg(feature = "fault-injection")]
        let stop_holds: rollout::StopHolds = Arc::new(DashMap::new());
        let rollout_args = KeyedArgs::<rollout::RolloutActor> {
            ctx: rollout::RolloutCtx {
                store: store.clone(),
                projects: projects.clone(),
                assignments: assignments.clone(),
                sender: sender.clone(),
                sealer: sealer.clone(),
                clock: clock.clone(),
                tick: Duration::from_millis(cfg.pipeline.rollout_tick_ms.clamp(10, 60_000)),
                controllers: controllers.clone(),
                bus: bus.clone(),
                lease_ttl_ms: cfg.bus.lease_ttl_ms.max(100) as i64,
                offline_after_ms: (cfg.devices.offline_after_seconds as i64).saturating_mul(1000),
                #[cfg(feature = "fault-injection")]
                stop_holds: stop_holds.clone(),
            },
            cfg: cfg.supervision.clone(),
            registry: controllers.registry.clone(),
            restarts: restarts.clone(),
            health: health.clone(),
        };
        let uploads = shares::Shares::new(cfg.uploads.0, cfg.uploads.1);
        let sessions = SessionsHandle {
            counters: counters.clone(),
            actors: session_actors,
            projects: projects.clone(),
            store: store.clone(),
            blobs,
            cfg: cfg.sessions.clone(),
            streams: shares::Shares::new(
                cfg.sessions.max_streams,
                cfg.sessions.max_streams_per_org,
            ),
            uploads: uploads.clone(),
            sealer: log_sealer,
            logs: cfg.logs.clone(),
            bus: bus.clone(),
        };
        let fresh = secrets::random_bytes(32)?;
        let signing_key = store.meta_get_or_init(LINK_KEY_META, || fresh)?;
        if signing_key.len() < 32 {
            anyhow::bail!("could not generate the link signing key");
        }
        let pipeline = pipeline::PipelineHandle {
            bus: bus.clone(),
            projects: projects.clone(),
            store: store.clone(),
            blobs: sessions.blobs.clone(),
            uploads,
            signer: Arc::new(links::Signer::new(signing_key)),
            public_url: Arc::new(std::sync::RwLock::new(cfg.public_url.clone())),
            quotas: Arc::new(cfg.quotas.clone()),
            quota: quota::QuotaHandle {
                actors: Keyed::new(
                    quotas_slot.clone(),
                    quota_args.registry.clone(),
                    cfg.supervision.clone(),
                ),
            },
            cfg: cfg.pipeline.clone(),
            list_cache: Arc::new(DashMap::new()),
            tmp_dir: cfg.tmp_dir.clone(),
            rollouts,
            assignments: assignments.clone(),
            controllers,
            #[cfg(feature = "fault-injection")]
            rollout_stop_holds: stop_holds,
            locks: Arc::new(DashMap::new()),
        };
        let webhooks = webhooks::WebhooksHandle {
            store: store.clone(),
            intake: intake_slot.clone(),
            dispatcher: dispatcher_slot.clone(),
            installations: installation_actors,
            secret: Arc::new(std::sync::RwLock::new(webhooks::load_secret(
                &store, &cfg.scm,
            )?)),
            cfg: cfg.scm.clone(),
            rejected: Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new())),
            failures: Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new())),
            clock: clock.clone(),
            bus: bus.clone(),
            secret_read_at: Arc::default(),
            worker_fence: Arc::default(),
        };
        let alerts = alerts::AlertsHandle {
            projects: projects.clone(),
            store: store.clone(),
            sealer: sealer.clone(),
            sender,
            clock: clock.clone(),
            feed: alert_feed.clone(),
            history_days: cfg.alerts.history_days,
            history_resolution_seconds: cfg.alerts.history_resolution_seconds,
            evaluator_busy,
            offline_after_ms: (cfg.devices.offline_after_seconds as i64).saturating_mul(1000),
            assignments: assignments.clone(),
        };
        let worker_slot = Arc::new(Slot::new(limit, timeout));
        let housekeeper_slot = Arc::new(Slot::new(limit, timeout));
        let pruners: housekeeper::Pruners = Arc::new(std::sync::Mutex::new(Vec::new()));
        // Heartbeat samples older than `[alerts] history_days`, and alerts resolved longer ago
        // than `[alerts] retention_days` (0: kept), a bounded number a pass. Both are final
        // records, so no actor's write can race their deletion.
        let mut retained: Vec<(u64, Prune)> = vec![(cfg.alerts.history_days, |s, before| {
            s.prune_metric_history(before, 100_000)
        })];
        if cfg.alerts.retention_days > 0 {
            retained.push((cfg.alerts.retention_days, |s, before| {
                s.prune_alerts(before, 10_000)
            }));
        }
        for (days, prune) in retained {
            let (store, clock) = (store.clone(), clock.clone());
            let keep_ms = days_ms(days);
            if let Ok(mut p) = pruners.lock() {
                p.push(Box::new(move || {
                    if let Err(e) = prune(&store, clock.now_ms().saturating_sub(keep_ms)) {
                        tracing::warn!(error = %e, "pruning past its retention failed");
                    }
                }));
            }
        }

        let (root, _) = Actor::spawn(
            None,
            RootSupervisor,
            RootArgs {
                store: store.clone(),
                cfg: cfg.supervision.clone(),
                tiers: cfg.tiers.clone(),
                max_api_keys_per_user: cfg.auth.max_api_keys_per_user,
                directory: directory_slot.clone(),
                projects: projects_slot,
                project_args,
                sessions: sessions_slot,
                session_args,
                intake: intake_slot.clone(),
                dispatcher: dispatcher_slot.clone(),
                queue: feed.clone(),
                dedup_window_seconds: cfg.scm.dedup_window_seconds,
                lease_seconds: cfg.runs.lease_seconds,
                installations: installations_slot,
                installation_args,
                worker: worker_slot.clone(),
                worker_args: webhooks::worker::WorkerArgs {
                    webhooks: webhooks.clone(),
                    feed: feed.clone(),
                    lease: bus.is_shared().then(|| {
                        (
                            bus.clone(),
                            clock.clone(),
                            cfg.bus.lease_ttl_ms.max(100) as i64,
                        )
                    }),
                },
                housekeeper: housekeeper_slot.clone(),
                housekeeper_args: housekeeper::HousekeeperArgs {
                    pipeline: pipeline.clone(),
                    sessions: sessions.clone(),
                    clock: clock.clone(),
                    last_sweep: None,
                    // Start-up resumes them itself.
                    last_validations: Some(std::time::Instant::now()),
                    webhooks: webhooks.clone(),
                    alerts: alerts.clone(),
                    auth: auth.clone(),
                    directory: directory.clone(),
                    pruners: pruners.clone(),
                    every: Duration::from_secs(cfg.supervision.housekeeping_seconds.max(1)),
                    bus: bus.clone(),
                },
                quotas: quotas_slot.clone(),
                quota_args,
                evaluators: evaluators_slot,
                evaluator_args,
                notifiers: notifiers_slot,
                notifier_args,
                rollouts: rollouts_slot,
                rollout_args,
                restarts: restarts.clone(),
                health: health.clone(),
                clock: clock.clone(),
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("supervision tree failed to start: {e}"))?;

        let touch_dir = directory.clone();
        tokio::spawn(async move {
            while let Some((id, at)) = touch_rx.recv().await {
                touch_dir.touch_key(id, at);
            }
        });
        // Confirms answered 202 whose validation a crash or stop interrupted.
        let owed = pipeline.resume_validations()?;
        if owed > 0 {
            tracing::info!(owed, "resuming capsule validations");
        }
        alerts.start(pipeline.subscribe_rollouts()).await?;
        // Rollouts a controller still has work for continue where their records stand.
        pipeline.resume_rollouts().await?;
        // Organizations deleted before a stop are purged on (their evaluators stop again).
        directory.resume_purges()?;
        let access = Access {
            store: store.clone(),
            tier_rank: Arc::new(cfg.tiers.iter().rev().cloned().collect()),
        };
        let backups = backup::BackupsHandle::new(
            store.clone(),
            sessions
                .blobs
                .local_root()
                .map(std::path::Path::to_path_buf),
            clock.clone(),
        );
        if bus.is_shared() {
            listen_to_other_nodes(&store, &bus, &pipeline.controllers, &assignments).await?;
            let mut rotations = bus.subscribe(webhooks::SECRET_SUBJECT).await?;
            let hooks = webhooks.clone();
            tokio::spawn(async move {
                while rotations.next().await.is_some() {
                    if let Err(e) = hooks.reload_secret() {
                        tracing::warn!(error = %e, "could not read the rotated webhook secret");
                    }
                }
            });
            let mut wakes = bus.subscribe(webhooks::worker::WAKE_SUBJECT).await?;
            let wake = feed.wake.clone();
            tokio::spawn(async move {
                while wakes.next().await.is_some() {
                    wake.notify_one();
                }
            });
        }
        Ok(Self {
            disk,
            bus,
            blobs: sessions.blobs.clone(),
            ready: Arc::default(),
            store,
            backups,
            counters,
            auth,
            access,
            directory,
            projects,
            sessions,
            pipeline,
            webhooks,
            alerts,
            worker: worker_slot,
            #[cfg(feature = "fault-injection")]
            worker_feed: feed,
            housekeeper: housekeeper_slot,
            pruners,
            health,
            clock,
            root,
            restarts,
            live_skipped,
        })
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

/// Runs a storage read that may walk many records (a filtered list page) on the blocking
/// pool, so it never holds an async worker thread.
pub(crate) async fn off_thread<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Internal(format!("a blocking read did not finish: {e}")))?
}

/// Deletes a bounded number of records older than the instant given; how many went.
type Prune = fn(&Store, i64) -> fleetops_storage::Result<usize>;

/// A retention in days as milliseconds; a value too large to count means for good.
fn days_ms(days: u64) -> i64 {
    i64::try_from(days)
        .unwrap_or(i64::MAX)
        .saturating_mul(86_400_000)
}
