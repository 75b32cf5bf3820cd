//! [`Runtime::start`]: the store's keys, the supervision tree, one subtree per family, and
//! the tasks beside it.

use crate::{
    Access, Authenticator, DirectoryHandle, ProjectsHandle, Runtime, RuntimeConfig, SessionsHandle,
    alerts, assignments, backup, bus, clock, counters, directory, disk, events, health,
    housekeeper, keyed, links, pipeline, project, quota, sealing, secrets, session, shares,
    webhooks,
};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dashmap::DashMap;
use fleetops_storage::{BlobStore, Store};
use ractor::Actor;

use super::nodes::*;
use crate::keyed::{Keyed, KeyedArgs};
use crate::mailbox::Slot;
use crate::pipeline::controller;
use crate::root::{RootArgs, RootSupervisor};

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
        let notifier_args = KeyedArgs::<alerts::notifier::Notifier> {
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
        let evaluator_args = KeyedArgs::<alerts::evaluator::RuleEvaluator> {
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
        let rollout_registry: keyed::Registry<controller::RolloutMsg> = Arc::new(DashMap::new());
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
        let stop_holds: controller::StopHolds = Arc::new(DashMap::new());
        let rollout_args = KeyedArgs::<controller::RolloutController> {
            ctx: controller::RolloutCtx {
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
}

/// Deletes a bounded number of records older than the instant given; how many went.
type Prune = fn(&Store, i64) -> fleetops_storage::Result<usize>;

/// A retention in days as milliseconds; a value too large to count means for good.
fn days_ms(days: u64) -> i64 {
    i64::try_from(days)
        .unwrap_or(i64::MAX)
        .saturating_mul(86_400_000)
}
