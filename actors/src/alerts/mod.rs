//! Alerting, as mailbox flows:
//!
//! ```text
//! heartbeat, log batch ─ once durable (signals) ─┐
//! rollout result ─ once durable (events outbox) ─┼─▶ RuleEvaluator (one per project with rules)
//! its own tick (a deadline heap) ────────────────┘
//!                                                        │ condition states, the alert and its
//!                                                        │ owed notifications: one batch
//!                                                        ▼ told once that batch is on disk
//!                                         Notifier (one per project with owed notifications)
//!                                                        │ each attempt recorded
//!                                                        ▼
//!                                         sender: HTTP to vetted addresses, SMTP
//! ```
//!
//! The handle `http/` calls is in `handle.rs`; each concept has its own file (`integrations`,
//! `rules`, `history`, `backtest`, `evaluator/`, `notifier`, `sender`). Integrations and rules
//! are written by the project's actor, so a rule's integrations and groups exist when it is
//! written, deleting an integration takes it out of every rule in the same write, and a group
//! a rule names cannot be deleted; alerts and condition states by the project's evaluator;
//! notification outcomes by the notifier.
//!
//! Invariants a change must keep:
//! - An alert fires once per device and rule while its condition holds, and a restart neither
//!   loses nor repeats it: its state is on disk before the notifier hears of it.
//! - Delivery is at least once: owed notifications are stored and resumed after a restart,
//!   and every attempt of one carries the same delivery id, so receivers can drop repeats.
//! - Only projects with enabled rules have an evaluator, started with the server so that
//!   silent devices still go offline after a restart; the housekeeper starts any evaluator or
//!   notifier that is down (`revive`).
//! - Rollout results reach the evaluators through a broadcast channel; when the forwarder falls
//!   behind, each evaluator reconciles from the stored results.
//! - Log batches waiting for evaluators are bounded in bytes (`max_log_bytes_in_flight`): past
//!   it a batch is not seen by the log rules, and ingestion never waits for them.
//!
//! Tested through the real server with real peers: `tests/api/alerts/` (integrations and
//! rules against an HTTP sink, aiosmtpd and the Standard Webhooks reference library),
//! `tests/api/evaluation/` (every condition fires and resolves, retries, restarts), and
//! panics injected into the evaluator and the notifier under load.

pub mod backtest;
pub(crate) mod evaluator;
mod handle;
pub mod history;
pub mod integrations;
pub(crate) mod notifier;
pub(crate) mod remote;
pub mod rules;
pub mod sender;

use crate::clock::Clock;
use crate::project::handle::ProjectsHandle;
use crate::secrets::Sealer;
use fleetops_storage::Store;

pub use backtest::{BacktestRequest, BacktestView};
pub use handle::AlertsHandle;
pub use history::{AlertFilter, AlertView};
pub use integrations::{IntegrationPatch, IntegrationRequest, IntegrationView, TestResult};
pub use rules::{RulePatchRequest, RuleRequest, RuleView};
