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
//!  ├─ IntakeActor           webhook delivery ids (dedup), the payload log, the secret
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
//! and are answered once durable (a group commit; for webhook deliveries, the payload log's
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
//!   alert history, backtests). Each family's handle type is in its `handle.rs`; what it asks
//!   the project's writer is its own sub-enum of `project::messages` (`DevicesMsg`,
//!   `SessionsMsg`, `PipelineMsg`, `AlertingMsg`), built by no other family.
//! - **Writers**, the actors, each the single writer of its keys: `project` (one per project),
//!   `session` (one per active session), `quota` (one per organization), `webhooks::intake`,
//!   `webhooks::installation`, `webhooks::dispatcher`, `directory`, `alerts::evaluator` (one
//!   per project with rules), `alerts::notifier` (one per project with owed notifications);
//!   supervised by `root` through `keyed` (per-entity supervisors) with `mailbox` (deadlines,
//!   bounded waiting, the caller's state) and `supervision` (restart budgets). Three
//!   supervised actors write nothing and drive the writers through the handles:
//!   `webhooks::worker`, `housekeeper` and `pipeline::controller` (the rollout controllers).
//! - **Rules**, functions and types that decide and never write (some read the store):
//!   [`rules`] (input formats, deployment evaluation, rollout plans and gates, configuration
//!   lineage and files, quota counting, blob keys, alert conditions, integration configs and
//!   wire formats, outbound targets, backtests), [`versions`], [`logs`] (log batches and
//!   filters).
//!
//! [`Runtime`] (`runtime/`) holds the handles and starts the tree (`runtime/start.rs`), with
//! what a node tells the other nodes in `runtime/nodes.rs`; `http` and the binary reach
//! behaviour only through it, never the store.
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
mod root;
pub mod rules;
mod runtime;
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
pub use runtime::{Readiness, Runtime, StoreFigures};
pub use sessions::SessionsHandle;

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
