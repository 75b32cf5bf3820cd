//! RuleEvaluator: one per project (started for projects with rules), the single writer of the
//! project's alerts and of the evaluator's condition states. It is fed by messages: heartbeats
//! (status and metrics) and log batches from the handles once they are durable, rollout
//! results from the pipeline's channel, and its own tick.
//!
//! Timers are a deadline heap holding at most one live entry per device (the next moment its
//! status or a held metric can change anything) and one per (log rule, device) window, so a
//! tick costs the entries that are due, never a pass over every device.
//!
//! Durable state: a condition that holds (since when) and a firing alert are written in the
//! same batch as the alert and its owed notifications, and the notifier is told only once that
//! batch is on disk. On a restart the states, the devices' last heartbeats and metrics are read
//! back, so a firing alert is neither lost nor fired again.
//!
//! Several nodes: each node with the project's rules runs its evaluator, but only the one
//! holding the lease `alerts/{project}` judges and writes (every write fenced by the lease);
//! the others stand by, dropping what they are sent, and try the lease at every tick. The
//! holder renews it once half of it has run; one that takes it over loads everything from
//! storage, as a restart does. Signals reach every node's evaluator (`alerts::remote`).

use fleetops_storage::Columns;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::alerts::notifier::NotifierMsg;
use crate::clock::Clock;
use crate::error::Result;
use crate::keyed::Keyed;
use crate::mailbox::Envelope;
use crate::rules::alert_conditions::{Condition, DeviceStatus, RolloutOutcome};
use fleetops_storage::accounts::Seq;
use fleetops_storage::{
    Alert, AlertEvent, AlertRule, AlertState, ConditionState, LogChunk, Notification,
    RelatedDeployment, RolloutStatus, Store,
};

/// How far back a reconciliation (`EvaluatorState::reconcile_rollouts`) looks for rollout
/// results an evaluator may have missed: well past a restart's backoff and a spent restart
/// budget, short enough that a start does not fire for results long past.
const RECONCILE_WINDOW_MS: i64 = 15 * 60 * 1000;

pub(crate) enum EvaluatorMsg {
    Heartbeat {
        device_id: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
    },
    Logs {
        device_id: u64,
        chunk: Arc<LogChunk>,
        /// Its share of the log budget, given back when the message is dropped (handled,
        /// or lost with a crashed evaluator).
        _budget: Budget,
    },
    Rollout {
        device_id: u64,
        status: RolloutStatus,
    },
    /// Rollout results may have been missed (the forwarder fell behind): reconcile the
    /// `deployment_status` rules with the stored results.
    RolloutsMissed,
    /// The project's rules were written: reload them.
    RulesChanged,
    /// A device was deleted or a group changed: reread devices and memberships.
    DevicesChanged,
    Tick,
    /// Fault injection (supervision tests only).
    #[cfg(feature = "fault-injection")]
    Panic,
}

/// What every evaluator shares.
#[derive(Clone)]
pub(crate) struct EvaluatorCtx {
    pub store: Store,
    pub clock: Clock,
    pub offline_after_ms: i64,
    pub tick: Duration,
    /// An alert names the package last activated for its device within this window.
    pub correlation_window_ms: i64,
    /// Time spent evaluating, across evaluators (for `/metrics` and the bench).
    pub busy_ns: Arc<AtomicU64>,
    pub notifiers: Keyed<crate::alerts::notifier::Notifier>,
    /// Rules not evaluated as written, by (project, rule): what the rules' `health` shows.
    pub rule_health: RuleHealthMap,
    /// The data directory's free space, for `disk_space` rules.
    pub disk: Arc<crate::disk::DiskSpace>,
    /// Several nodes: one node's evaluator of a project judges, under the project's lease;
    /// the others stand by.
    pub bus: crate::bus::Bus,
    pub lease_ttl_ms: i64,
    /// Makes every combined pattern set fail to build (tests of the per-rule fallback).
    #[cfg(feature = "fault-injection")]
    pub fail_log_sets: Arc<std::sync::atomic::AtomicBool>,
}

use crate::rules::alert_conditions::SERVER;

/// How a rule is evaluated when not simply as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RuleHealth {
    /// Evaluated, but apart from the project's other log rules (their patterns could not be
    /// compiled together).
    Degraded(String),
    /// Not evaluated: its condition cannot be read or its pattern cannot be compiled.
    Error(String),
}

pub(crate) type RuleHealthMap = Arc<DashMap<(u64, u64), RuleHealth>>;

#[derive(Default)]
pub(crate) struct RuleEvaluator;

impl crate::keyed::KeyedChild for RuleEvaluator {
    type Req = EvaluatorMsg;
    type Ctx = EvaluatorCtx;
    const KIND: &'static str = "alert-evaluator";
}

/// Bytes of log batches waiting for evaluators, across projects; a batch holds its share
/// until its message is dropped.
pub(crate) struct Budget {
    bytes: usize,
    used: Arc<AtomicUsize>,
}

impl Drop for Budget {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Due {
    /// The device's status and held metrics.
    Device(u64),
    /// A log rule's window for a device: (rule, device).
    Window(u64, u64),
}

/// A reread of storage owed before the next event or tick, whichever comes first (rules
/// include devices).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pending {
    #[default]
    Nothing,
    Devices,
    Rules,
}

pub(crate) struct EvaluatorState {
    pid: u64,
    pending: Pending,
    slug: String,
    ctx: EvaluatorCtx,
    rules: Vec<Loaded>,
    /// The indices (into `rules`) of the log rules, in the order of `log_set`'s patterns.
    log_rules: Vec<usize>,
    log_set: Option<LogMatcher>,
    states: HashMap<(u64, u64), ConditionState>,
    last_seen: HashMap<u64, i64>,
    /// Rollout results may have been missed (this incarnation is new, or the forwarder fell
    /// behind): reconcile on the next tick (`reconcile_rollouts`), once however often told.
    reconcile_due: bool,
    /// When each online device came online (its first heartbeat after being offline).
    online_since: HashMap<u64, i64>,
    metrics: HashMap<u64, Arc<BTreeMap<String, f64>>>,
    /// The times of the most recent matches, at most `count` of them.
    windows: HashMap<(u64, u64), VecDeque<i64>>,
    heap: BinaryHeap<Reverse<(i64, Due)>>,
    scheduled: HashMap<Due, i64>,
    /// Several nodes: the project's lease while this evaluator holds it (every write checks
    /// it), and when to renew it; `None`: standing by (signals are dropped, nothing written).
    lease: Option<(fleetops_storage::leases::Fence, i64)>,
    /// Standing by: when to look at the lease again (Unix ms).
    next_try: i64,
    /// Forwards the other nodes' signals of the project here, while it holds the lease.
    _listening: Option<crate::bus::Listener>,
}

/// The writes of one step, applied in one batch.
#[derive(Default)]
struct Changes {
    states: Vec<(u64, u64, Option<ConditionState>)>,
    alerts: Vec<Alert>,
    notifications: Vec<Notification>,
}

/// Rules not evaluated as written, each with why.
pub(super) type Unhealthy = Vec<(u64, RuleHealth)>;

mod actor;
mod commit;
mod feed;
mod matching;
mod rollouts;
mod schedule;

pub(crate) use feed::AlertFeed;
use matching::*;
