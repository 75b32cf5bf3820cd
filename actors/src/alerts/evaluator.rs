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
    pub notifiers: Keyed<crate::alerts::notifier::NotifierActor>,
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
pub(crate) struct EvaluatorActor;

impl crate::keyed::KeyedChild for EvaluatorActor {
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

/// How the handles reach the evaluators: only projects with enabled rules get signals, so a
/// project without rules never starts one. Log batches are bounded in bytes: past
/// `[alerts] max_log_bytes_in_flight` a batch is not seen by the rules (counted on `/metrics`)
/// rather than queued without end.
#[derive(Clone)]
pub(crate) struct AlertFeed {
    pub evaluators: Keyed<EvaluatorActor>,
    pub notifiers: Keyed<crate::alerts::notifier::NotifierActor>,
    pub active: Arc<DashMap<u64, ()>>,
    pub log_bytes: Arc<AtomicUsize>,
    pub max_log_bytes: usize,
    pub dropped: Arc<AtomicU64>,
    /// What the evaluators record of rules not evaluated as written.
    pub rule_health: RuleHealthMap,
    /// Several nodes: every signal also goes to the other nodes, whose evaluator of the
    /// project may be the one judging it (`alerts::remote`).
    pub bus: crate::bus::Bus,
    /// See [`EvaluatorCtx::fail_log_sets`].
    #[cfg(feature = "fault-injection")]
    pub fail_log_sets: Arc<std::sync::atomic::AtomicBool>,
}

impl crate::signals::AlertSignals for AlertFeed {
    fn devices_changed(&self, pid: u64) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.signal(pid, EvaluatorMsg::DevicesChanged))
    }

    fn heartbeat(
        &self,
        pid: u64,
        device_id: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
    ) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.signal(
            pid,
            EvaluatorMsg::Heartbeat {
                device_id,
                at,
                metrics,
            },
        ))
    }

    fn logs(
        &self,
        pid: u64,
        device_id: u64,
        chunk: Arc<LogChunk>,
    ) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(AlertFeed::logs(self, pid, device_id, chunk))
    }
}

impl AlertFeed {
    /// A log batch for the project's rules, if the budget has room for it.
    pub(crate) async fn logs(&self, pid: u64, device_id: u64, chunk: Arc<LogChunk>) {
        if !self.active.contains_key(&pid) {
            return;
        }
        let bytes = chunk.text.len() + chunk.len() * 16 + 64;
        let before = self.log_bytes.fetch_add(bytes, Ordering::Relaxed);
        let budget = Budget {
            bytes,
            used: self.log_bytes.clone(),
        };
        if before + bytes > self.max_log_bytes {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.signal(
            pid,
            EvaluatorMsg::Logs {
                device_id,
                chunk,
                _budget: budget,
            },
        )
        .await;
    }

    /// Sends a signal to the project's evaluator (started if needed); never fails the caller.
    pub(crate) async fn signal(&self, pid: u64, msg: EvaluatorMsg) {
        if !self.active.contains_key(&pid) {
            return;
        }
        if self.bus.is_shared() {
            let remote = match &msg {
                EvaluatorMsg::Heartbeat {
                    device_id,
                    at,
                    metrics,
                } => Some(super::remote::Signal::Heartbeat {
                    device_id: *device_id,
                    at: *at,
                    metrics: metrics.clone(),
                }),
                EvaluatorMsg::Logs {
                    device_id, chunk, ..
                } => Some(super::remote::Signal::Logs {
                    device_id: *device_id,
                    chunk: chunk.clone(),
                }),
                EvaluatorMsg::Rollout { device_id, status } => {
                    Some(super::remote::Signal::Rollout {
                        device_id: *device_id,
                        status: *status,
                    })
                }
                EvaluatorMsg::DevicesChanged => Some(super::remote::Signal::DevicesChanged),
                _ => None,
            };
            match remote.as_ref().and_then(super::remote::encode) {
                // Larger than a bus message may be: the other nodes' evaluators do not see it,
                // as when the byte budget is full.
                Some(m) if m.len() > super::remote::MAX_MESSAGE => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Some(m) => self.bus.publish(super::remote::subject(pid), &m),
                None => {}
            }
        }
        match self.evaluators.actor(pid).await {
            Ok(a) => {
                let _ = a.cast(Envelope::cast(msg));
            }
            // Once per signal while it is down (heartbeats come often): debug, not warn; the
            // supervisor logs the failure itself.
            Err(e) => tracing::debug!(project = pid, error = %e, "alert evaluator unavailable"),
        }
    }

    /// Stops the project's evaluator and notifier and takes it off the active list: its
    /// organization is being deleted, and nothing may write into it while it is purged.
    pub(crate) fn stop_project(&self, pid: u64) {
        self.active.remove(&pid);
        self.rule_health.retain(|(p, _), _| *p != pid);
        if let Some(a) = self.evaluators.running(pid) {
            a.stop(None);
        }
        if let Some(a) = self.notifiers.running(pid) {
            a.stop(None);
        }
    }

    /// As [`AlertFeed::rules_changed_here`], and tells the other nodes (several nodes).
    pub(crate) async fn rules_changed(&self, store: &Store, pid: u64) {
        if self.bus.is_shared() {
            self.bus
                .publish(super::remote::RULES_SUBJECT.into(), &pid.to_be_bytes());
        }
        self.rules_changed_here(store, pid).await;
    }

    /// Marks the project as having enabled rules (or not), from storage, and tells its
    /// evaluator to reload.
    pub(crate) async fn rules_changed_here(&self, store: &Store, pid: u64) {
        if store.project_retired(pid) {
            self.stop_project(pid);
            return;
        }
        let any = store
            .project_alert_rules(pid)
            .map(|r| r.iter().any(|r| r.enabled))
            .unwrap_or(true);
        let was = self.active.contains_key(&pid);
        if any {
            self.active.insert(pid, ());
        }
        if (any || was)
            && let Ok(a) = self.evaluators.actor(pid).await
        {
            let _ = a.cast(Envelope::cast(EvaluatorMsg::RulesChanged));
        }
        if !any {
            self.active.remove(&pid);
        }
    }
}

/// A rule as the evaluator uses it.
struct Loaded {
    rule: AlertRule,
    cond: Condition,
    level: Option<u8>,
}

/// How a project's log rules match a line: every pattern in one set, so a line is scanned
/// once whatever the number of rules; or, when the set cannot be built, each rule's pattern
/// on its own (slower, never silent: each such rule's `health` says so).
enum LogMatcher {
    Set(regex::RegexSet),
    Each(Vec<regex::Regex>),
}

impl LogMatcher {
    /// The indices (into the matcher's patterns) that match `msg`, into `out`.
    fn matches(&self, msg: &str, out: &mut Vec<usize>) {
        out.clear();
        match self {
            LogMatcher::Set(set) => {
                if set.is_match(msg) {
                    out.extend(set.matches(msg).iter());
                }
            }
            LogMatcher::Each(each) => {
                out.extend(
                    each.iter()
                        .enumerate()
                        .filter(|(_, r)| r.is_match(msg))
                        .map(|(k, _)| k),
                );
            }
        }
    }
}

/// The log rules' matcher, with the indices (into `rules`) of the log rules in the order of
/// its patterns, and the rules it had to set apart (each with why).
fn log_set(rules: &[Loaded], fail_set: bool) -> (Vec<usize>, Option<LogMatcher>, Unhealthy) {
    let mut idx = Vec::new();
    let mut patterns = Vec::new();
    for (i, l) in rules.iter().enumerate() {
        if let Condition::LogPattern { pattern, .. } = &l.cond {
            idx.push(i);
            patterns.push(pattern.clone());
        }
    }
    if idx.is_empty() {
        return (idx, None, Vec::new());
    }
    let limit = 256 * 1024 * patterns.len().max(1);
    let set = if fail_set {
        Err(regex::Error::CompiledTooBig(limit))
    } else {
        regex::RegexSetBuilder::new(&patterns)
            .size_limit(limit)
            .dfa_size_limit(limit)
            .build()
    };
    let why = match set {
        Ok(set) => return (idx, Some(LogMatcher::Set(set)), Vec::new()),
        Err(e) => e.to_string(),
    };
    // Each rule alone, within the limit it was checked against when written.
    let mut kept = Vec::new();
    let mut each = Vec::new();
    let mut health = Vec::new();
    for (i, p) in idx.into_iter().zip(&patterns) {
        let id = rules[i].rule.id;
        match crate::rules::alert_conditions::compile(p) {
            Ok(r) => {
                kept.push(i);
                each.push(r);
                health.push((
                    id,
                    RuleHealth::Degraded(format!(
                        "evaluated apart from the project's other log rules: their patterns \
                         could not be compiled together ({why})"
                    )),
                ));
            }
            Err(e) => health.push((
                id,
                RuleHealth::Error(format!("its pattern cannot be compiled: {e}")),
            )),
        }
    }
    tracing::warn!(
        error = %why,
        rules = ?health.iter().map(|(id, _)| id).collect::<Vec<_>>(),
        "a project's log rules could not be compiled together; each is matched on its own"
    );
    (kept, Some(LogMatcher::Each(each)), health)
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
type Unhealthy = Vec<(u64, RuleHealth)>;

/// The enabled rules of the project, with the ones it cannot evaluate.
fn load_rules(store: &Store, pid: u64) -> Result<(Vec<Loaded>, Unhealthy)> {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for r in store.project_alert_rules(pid)? {
        if !r.enabled {
            continue;
        }
        let cond = serde_json::from_slice::<serde_json::Value>(&r.condition_json)
            .map_err(|e| e.to_string())
            .and_then(|v| Condition::parse(&v).map_err(|e| e.to_string()));
        let cond = match cond {
            Ok(c) => c,
            Err(e) => {
                bad.push((
                    r.id,
                    RuleHealth::Error(format!("its condition cannot be read: {e}")),
                ));
                continue;
            }
        };
        let level = match &cond {
            Condition::LogPattern { pattern, level, .. } => {
                if let Err(e) = crate::rules::alert_conditions::compile(pattern) {
                    bad.push((
                        r.id,
                        RuleHealth::Error(format!("its pattern cannot be compiled: {e}")),
                    ));
                    continue;
                }
                level.as_deref().and_then(crate::logs::parse_level)
            }
            _ => None,
        };
        out.push(Loaded {
            rule: r,
            cond,
            level,
        });
    }
    Ok((out, bad))
}

/// The project's lease for an evaluator of `ctx` (several nodes): taken or renewed, `None`
/// while another node's evaluator holds it; always `None` on one node.
async fn take_lease(
    ctx: &EvaluatorCtx,
    pid: u64,
) -> Result<Option<(fleetops_storage::leases::Fence, i64)>> {
    if !ctx.bus.is_shared() {
        return Ok(None);
    }
    let (store, node, now, ttl) = (
        ctx.store.clone(),
        ctx.bus.node_id(),
        ctx.clock.now_ms(),
        ctx.lease_ttl_ms,
    );
    let taken = crate::off_thread(move || {
        Ok(store.take_lease(&super::remote::lease_name(pid), node, now, ttl)?)
    })
    .await;
    match taken {
        // Renewed once half of it has run.
        Ok(t) => Ok(t.map(|f| (f, now + ttl / 2))),
        // The database out of reach: stand by, and look again later.
        Err(e) => {
            tracing::warn!(project = pid, error = %e, "could not take the alerting lease");
            Ok(None)
        }
    }
}

/// Bytes of other nodes' log batches one evaluator's mailbox holds at most.
const MAX_REMOTE_LOG_BYTES: usize = 32 << 20;

/// How often a standing-by evaluator looks whether the lease is free.
const STAND_BY_MS: i64 = 1_000;

/// Forwards the other nodes' signals of project `pid` to its evaluator here.
async fn listen(
    bus: &crate::bus::Bus,
    pid: u64,
    me: ActorRef<Envelope<EvaluatorMsg>>,
) -> Result<crate::bus::Listener> {
    let mut sub = bus
        .subscribe(&super::remote::subject(pid))
        .await
        .map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    let queued = Arc::new(AtomicUsize::new(0));
    Ok(crate::bus::Listener::spawn(async move {
        while let Some(m) = sub.next().await {
            let msg = match super::remote::decode(&m.payload) {
                Some(super::remote::Signal::Heartbeat {
                    device_id,
                    at,
                    metrics,
                }) => EvaluatorMsg::Heartbeat {
                    device_id,
                    at,
                    metrics,
                },
                Some(super::remote::Signal::Logs { device_id, chunk }) => {
                    // Bounded as the local batches are: past the bound it is not seen.
                    let bytes = m.payload.len();
                    if queued.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_REMOTE_LOG_BYTES {
                        queued.fetch_sub(bytes, Ordering::Relaxed);
                        continue;
                    }
                    EvaluatorMsg::Logs {
                        device_id,
                        chunk,
                        _budget: Budget {
                            bytes,
                            used: queued.clone(),
                        },
                    }
                }
                Some(super::remote::Signal::Rollout { device_id, status }) => {
                    EvaluatorMsg::Rollout { device_id, status }
                }
                Some(super::remote::Signal::DevicesChanged) => EvaluatorMsg::DevicesChanged,
                None => continue,
            };
            if me.cast(Envelope::cast(msg)).is_err() {
                break;
            }
        }
    }))
}

/// The evaluator's state read from storage; `judge`: devices and states brought up to date
/// and written (not while standing by, when nothing is written).
async fn load(
    ctx: EvaluatorCtx,
    pid: u64,
    lease: Option<(fleetops_storage::leases::Fence, i64)>,
    judge: bool,
) -> std::result::Result<EvaluatorState, ActorProcessingErr> {
    let store = ctx.store.clone();
    let slug = store
        .project(pid)?
        .map(|p| p.slug.clone())
        .ok_or_else(|| format!("project {pid} does not exist"))?;
    let mut st = EvaluatorState {
        pid,
        pending: Pending::Nothing,
        slug,
        rules: Vec::new(),
        log_rules: Vec::new(),
        log_set: None,
        states: store
            .condition_states(pid)?
            .into_iter()
            .map(|s| ((s.rule_id, s.device_id), s))
            .collect(),
        last_seen: HashMap::new(),
        // Rollout results reach the evaluator as events, which a restart loses.
        reconcile_due: true,
        online_since: HashMap::new(),
        metrics: HashMap::new(),
        windows: HashMap::new(),
        heap: BinaryHeap::new(),
        scheduled: HashMap::new(),
        lease,
        next_try: 0,
        _listening: None,
        ctx,
    };
    st.rules = st.load()?;
    if judge {
        let now = st.ctx.clock.now_ms();
        let mut ch = Changes::default();
        // Devices and states from storage (online since: unknown after a restart, so counted
        // from the last heartbeat at the latest).
        st.refresh_devices(now, &mut ch)?;
        st.commit(ch).await?;
    }
    Ok(st)
}

impl Actor for EvaluatorActor {
    type Msg = Envelope<EvaluatorMsg>;
    type State = EvaluatorState;
    type Arguments = (EvaluatorCtx, u64);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, pid): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(ctx.tick, || Envelope::cast(EvaluatorMsg::Tick));
        let lease = take_lease(&ctx, pid).await?;
        let standby = ctx.bus.is_shared() && lease.is_none();
        // Judging: the other nodes' signals come here.
        let listening = if lease.is_some() {
            Some(listen(&ctx.bus, pid, myself.clone()).await?)
        } else {
            None
        };
        let mut st = load(ctx, pid, lease, !standby).await?;
        st._listening = listening;
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            return Ok(());
        };
        // Its organization deleted: nothing more is judged or written.
        if st.ctx.store.project_retired(st.pid) {
            myself.stop(None);
            return Ok(());
        }
        let now = st.ctx.clock.now_ms();
        if st.ctx.bus.is_shared() {
            let due = match &st.lease {
                Some((_, renew_at)) => now >= *renew_at,
                None => now >= st.next_try,
            };
            if matches!(msg, EvaluatorMsg::Tick) && due {
                match take_lease(&st.ctx, st.pid).await? {
                    Some(lease) if st.lease.is_none() => {
                        // Taken over: judge from what is stored now, with every node's signals.
                        let listening = listen(&st.ctx.bus, st.pid, myself.clone()).await?;
                        *st = load(st.ctx.clone(), st.pid, Some(lease), true).await?;
                        st._listening = Some(listening);
                    }
                    Some(lease) => st.lease = Some(lease),
                    None => {
                        st.lease = None;
                        st._listening = None;
                        st.next_try = now + STAND_BY_MS;
                    }
                }
            }
            if st.lease.is_none() {
                // Standing by: another node's evaluator judges the project.
                return Ok(());
            }
        }
        let started = std::time::Instant::now();
        let mut ch = Changes::default();
        match msg {
            // An event is judged by the rules and devices as they are when it comes: a reread
            // owed for changes made before it is done first (the change's answer went out
            // after its signal was sent, so every event sent after that answer is judged with
            // it).
            EvaluatorMsg::Heartbeat {
                device_id,
                at,
                metrics,
            } => {
                st.flush_pending(now, &mut ch)?;
                st.heartbeat(device_id, at, metrics, now, &mut ch)?
            }
            EvaluatorMsg::Logs {
                device_id, chunk, ..
            } => {
                st.flush_pending(now, &mut ch)?;
                st.logs(device_id, &chunk, now, &mut ch)?
            }
            EvaluatorMsg::Rollout { device_id, status } => {
                st.flush_pending(now, &mut ch)?;
                st.rollout(device_id, status, now, &mut ch)?
            }
            EvaluatorMsg::RolloutsMissed => st.reconcile_due = true,
            // Both reread storage, at the next event or tick: a burst of changes (a script
            // creating 100 rules) is reread once.
            EvaluatorMsg::RulesChanged => st.pending = st.pending.max(Pending::Rules),
            EvaluatorMsg::DevicesChanged => st.pending = st.pending.max(Pending::Devices),
            #[cfg(feature = "fault-injection")]
            EvaluatorMsg::Panic => panic!("injected fault in the evaluator of project {}", st.pid),
            EvaluatorMsg::Tick => {
                st.flush_pending(now, &mut ch)?;
                if std::mem::take(&mut st.reconcile_due) {
                    let latest = st.latest_results(now).await?;
                    st.reconcile_rollouts(&latest, now, &mut ch)?;
                }
                st.tick(now, &mut ch)?
            }
        }
        // The evaluation itself, the write and its fsync left out.
        st.ctx
            .busy_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match st.commit(ch).await {
            // Another node took the lease (this one stalled past it): nothing was written;
            // stand by.
            Err(crate::error::Error::Conflict(w)) if w == "lease" => {
                st.lease = None;
                st._listening = None;
                st.next_try = now + STAND_BY_MS;
                Ok(())
            }
            other => Ok(other?),
        }
    }
}

impl EvaluatorState {
    fn store(&self) -> &Store {
        &self.ctx.store
    }

    /// Whether `rule` covers `device` (no groups: every device).
    fn applies(&self, rule: &AlertRule, device: u64) -> Result<bool> {
        if rule.device_group_ids.is_empty() {
            return Ok(true);
        }
        let groups = self.store().project_groups(self.pid)?;
        Ok(groups.iter().any(|g| {
            rule.device_group_ids.binary_search(&g.id).is_ok()
                && g.device_ids.binary_search(&device).is_ok()
        }))
    }

    fn schedule(&mut self, due: Due, at: i64) {
        if self.scheduled.get(&due).is_some_and(|t| *t <= at) {
            return;
        }
        self.scheduled.insert(due, at);
        self.heap.push(Reverse((at, due)));
    }

    fn online(&self, device: u64, now: i64) -> Option<bool> {
        self.last_seen
            .get(&device)
            .map(|ls| now < ls + self.ctx.offline_after_ms)
    }

    fn heartbeat(
        &mut self,
        device: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        if self.online(device, at) != Some(true) {
            self.online_since.insert(device, at);
        }
        let prev = self.last_seen.get(&device).copied().unwrap_or(i64::MIN);
        self.last_seen.insert(device, at.max(prev));
        self.metrics.insert(device, metrics);
        self.check_device(device, now, ch)
    }

    /// Re-judges every status and metric rule for `device` now, fires or resolves, and
    /// schedules the next moment anything can change.
    fn check_device(&mut self, device: u64, now: i64, ch: &mut Changes) -> Result<()> {
        let mut next: Option<i64> = None;
        let mut want = |t: i64| next = Some(next.map_or(t, |n: i64| n.min(t)));
        let online = self.online(device, now);
        if online == Some(true)
            && let Some(ls) = self.last_seen.get(&device)
        {
            // Going offline changes status rules.
            want(ls + self.ctx.offline_after_ms);
        }
        let mut verdicts = Vec::new();
        for (i, l) in self.rules.iter().enumerate() {
            let since = match &l.cond {
                Condition::DeviceStatus { status, .. } => match (status, online) {
                    (DeviceStatus::Offline, Some(false)) => self
                        .last_seen
                        .get(&device)
                        .map(|ls| ls + self.ctx.offline_after_ms),
                    (DeviceStatus::Online, Some(true)) => self.online_since.get(&device).copied(),
                    _ => None,
                },
                Condition::MetricThreshold {
                    metric,
                    operator,
                    threshold,
                    ..
                } => {
                    let holds = self
                        .metrics
                        .get(&device)
                        .and_then(|m| m.get(metric))
                        .is_some_and(|v| operator.holds(*v, *threshold));
                    holds.then(|| {
                        self.states
                            .get(&(l.rule.id, device))
                            .map_or(now, |s| s.since)
                    })
                }
                _ => continue,
            };
            // A rule that no longer covers the device (it left the group) does not hold.
            let since = if self.applies(&l.rule, device)? {
                since
            } else {
                None
            };
            verdicts.push((i, since));
        }
        for (i, since) in verdicts {
            let rule_id = self.rules[i].rule.id;
            let dur = self.rules[i].cond.duration_ms();
            let cur = self.states.get(&(rule_id, device)).cloned();
            match (since, cur) {
                (None, Some(s)) => self.clear(i, device, &s, now, ch)?,
                (None, None) => {}
                (Some(_), Some(s)) if s.alert_id.is_some() => {}
                (Some(since), cur) => {
                    let since = cur.map_or(since, |c| c.since);
                    if now >= since + dur {
                        self.fire(i, device, since, now, ch)?;
                    } else {
                        self.hold(rule_id, device, since, ch);
                        want(since + dur);
                    }
                }
            }
        }
        if let Some(t) = next {
            self.schedule(Due::Device(device), t);
        }
        Ok(())
    }

    /// The reread of storage owed, if any.
    fn flush_pending(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        match std::mem::take(&mut self.pending) {
            Pending::Rules => self.reload(now, ch),
            Pending::Devices => self.refresh_devices(now, ch),
            Pending::Nothing => Ok(()),
        }
    }

    /// Loads the enabled rules and builds the log rules' matcher, recording in the shared
    /// health map each rule not evaluated as written.
    fn load(&mut self) -> Result<Vec<Loaded>> {
        let (rules, mut health) = load_rules(self.store(), self.pid)?;
        #[cfg(feature = "fault-injection")]
        let fail = self.ctx.fail_log_sets.load(Ordering::Relaxed);
        #[cfg(not(feature = "fault-injection"))]
        let fail = false;
        let (log_rules, matcher, apart) = log_set(&rules, fail);
        (self.log_rules, self.log_set) = (log_rules, matcher);
        health.extend(apart);
        let pid = self.pid;
        self.ctx.rule_health.retain(|(p, _), _| *p != pid);
        for (id, h) in health {
            self.ctx.rule_health.insert((pid, id), h);
        }
        Ok(rules)
    }

    /// Matches a batch once against every log rule's pattern (one `RegexSet` pass per line,
    /// or each rule's own when they could not be compiled together), then counts per rule
    /// with its level and module.
    fn logs(&mut self, device: u64, chunk: &LogChunk, now: i64, ch: &mut Changes) -> Result<()> {
        let Some(matcher) = &self.log_set else {
            return Ok(());
        };
        let mut applicable = Vec::with_capacity(self.log_rules.len());
        for &i in &self.log_rules {
            let l = &self.rules[i];
            let level_present = l.level.is_none_or(|lv| chunk.level_mask & (1 << lv) != 0);
            applicable.push(level_present && self.applies(&l.rule, device)?);
        }
        if !applicable.iter().any(|a| *a) {
            return Ok(());
        }
        // The levels some applicable rule looks at: lines of other levels are never matched.
        let levels: u8 = self
            .log_rules
            .iter()
            .zip(&applicable)
            .filter(|(_, a)| **a)
            .map(|(&i, _)| self.rules[i].level.map_or(0xff, |l| 1u8 << l))
            .fold(0, |m, x| m | x);
        if chunk.level_mask & levels == 0 {
            return Ok(());
        }
        let mut counts = vec![0usize; self.log_rules.len()];
        let mut hits = Vec::new();
        for e in 0..chunk.len() {
            if chunk.level_at(e).is_some_and(|l| levels & (1u8 << l) == 0) {
                continue;
            }
            let Some(msg) = chunk.message(e) else {
                continue;
            };
            matcher.matches(msg, &mut hits);
            for &k in &hits {
                if !applicable.get(k).copied().unwrap_or(false) {
                    continue;
                }
                let Some(&i) = self.log_rules.get(k) else {
                    continue;
                };
                let l = &self.rules[i];
                if l.level.is_some_and(|lv| chunk.level_at(e) != Some(lv)) {
                    continue;
                }
                if let Condition::LogPattern {
                    module: Some(m), ..
                } = &l.cond
                {
                    let idx = chunk.module_at(e).map(|x| x as usize);
                    if idx.and_then(|x| chunk.modules.get(x)) != Some(m) {
                        continue;
                    }
                }
                counts[k] += 1;
            }
        }
        for (k, matched) in counts.into_iter().enumerate() {
            if matched == 0 {
                continue;
            }
            let i = self.log_rules[k];
            let Condition::LogPattern {
                count,
                window_seconds,
                ..
            } = self.rules[i].cond
            else {
                continue;
            };
            let (rule_id, count) = (self.rules[i].rule.id, count as usize);
            let window_ms = (window_seconds as i64).saturating_mul(1000);
            let w = self.windows.entry((rule_id, device)).or_default();
            for _ in 0..matched.min(count) {
                w.push_back(now);
            }
            while w.len() > count {
                w.pop_front();
            }
            let front = w.front().copied().unwrap_or(now);
            let holds = w.len() >= count && front > now - window_ms;
            if holds && !self.states.contains_key(&(rule_id, device)) {
                self.fire(i, device, now, now, ch)?;
            }
            // Looked at again when its oldest match leaves: resolves, or frees the window.
            self.schedule(Due::Window(rule_id, device), front + window_ms);
        }
        Ok(())
    }

    fn window_due(&mut self, rule_id: u64, device: u64, now: i64, ch: &mut Changes) -> Result<()> {
        let Some(i) = self.rules.iter().position(|l| l.rule.id == rule_id) else {
            return Ok(());
        };
        let Condition::LogPattern {
            count,
            window_seconds,
            ..
        } = self.rules[i].cond
        else {
            return Ok(());
        };
        let window_ms = (window_seconds as i64).saturating_mul(1000);
        let w = self.windows.entry((rule_id, device)).or_default();
        while w.front().is_some_and(|t| *t <= now - window_ms) {
            w.pop_front();
        }
        if w.len() >= count as usize {
            let front = w.front().copied().unwrap_or(now);
            self.schedule(Due::Window(rule_id, device), front + window_ms);
        } else {
            if w.is_empty() {
                self.windows.remove(&(rule_id, device));
            } else if let Some(front) = w.front().copied() {
                // Below the count: look again when its oldest match leaves, to free it.
                self.schedule(Due::Window(rule_id, device), front + window_ms);
            }
            if let Some(s) = self.states.get(&(rule_id, device)).cloned() {
                self.clear(i, device, &s, now, ch)?;
            }
        }
        Ok(())
    }

    fn rollout(
        &mut self,
        device: u64,
        status: RolloutStatus,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        for i in 0..self.rules.len() {
            self.rollout_rule(i, device, status, None, now, ch)?;
        }
        Ok(())
    }

    /// One `deployment_status` rule (index `i`; any other rule is left alone) meeting a
    /// device's rollout result: as its event (`missed` is `None`), or as a result found in
    /// storage that its event may have missed, reported at `missed` (`reconcile_rollouts`).
    fn rollout_rule(
        &mut self,
        i: usize,
        device: u64,
        status: RolloutStatus,
        missed: Option<i64>,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let Some(Condition::DeploymentStatus { status: want }) =
            self.rules.get(i).map(|r| r.cond.clone())
        else {
            return Ok(());
        };
        if !self.applies(&self.rules[i].rule, device)? {
            return Ok(());
        }
        let hit = matches!(
            (want, status),
            (RolloutOutcome::Succeeded, RolloutStatus::Succeeded)
                | (RolloutOutcome::Failed, RolloutStatus::Failed)
        );
        let made = self.rules[i].rule.created_at;
        let key = (self.rules[i].rule.id, device);
        // A missed result fires only if it is recent and the rule existed when it came, and
        // clears only a firing older than it, as its event would have.
        let fires = missed.is_none_or(|at| at >= made && at >= now - RECONCILE_WINDOW_MS);
        match (hit, self.states.get(&key).cloned()) {
            (true, None) if fires => self.fire(i, device, now, now, ch)?,
            (false, Some(s)) if missed.is_none_or(|at| at > s.since) => {
                self.clear(i, device, &s, now, ch)?
            }
            _ => {}
        }
        Ok(())
    }

    /// Each present device's latest stored rollout result (across the project's packages)
    /// that a reconciliation can act on, when the project has `deployment_status` rules: the
    /// results of the last [`RECONCILE_WINDOW_MS`] (the only ones that may fire), read from
    /// the project's time index, and the latest result of each device a `deployment_status`
    /// rule is firing for (the only ones an older result may clear), read by key in each of
    /// the project's packages. Older results of other devices change nothing, so they are not
    /// read: the cost follows the recent results, and the firing alerts times the project's
    /// packages, not every device and result the project keeps. On the blocking pool.
    async fn latest_results(&self, now: i64) -> Result<HashMap<u64, (i64, RolloutStatus)>> {
        let rollout_rules: std::collections::HashSet<u64> = self
            .rules
            .iter()
            .filter(|r| matches!(r.cond, Condition::DeploymentStatus { .. }))
            .map(|r| r.rule.id)
            .collect();
        if rollout_rules.is_empty() {
            return Ok(HashMap::new());
        }
        let firing: std::collections::BTreeSet<u64> = self
            .states
            .keys()
            .filter(|(rule, _)| rollout_rules.contains(rule))
            .map(|&(_, device)| device)
            .collect();
        let (store, pid) = (self.ctx.store.clone(), self.pid);
        crate::off_thread(move || {
            // Of two results reported in the same millisecond, the newer package's is the
            // latest (as when every package was read newest first).
            let mut latest: HashMap<u64, (i64, u64, RolloutStatus)> = HashMap::new();
            let mut offer = |device: u64, v: (i64, u64, RolloutStatus)| {
                let e = latest.entry(device).or_insert(v);
                if (v.0, v.1) > (e.0, e.1) {
                    *e = v;
                }
            };
            for r in store.recent_results(pid, now.saturating_sub(RECONCILE_WINDOW_MS))? {
                offer(r.device_id, (r.reported_at, r.deployment_id, r.status));
            }
            if !firing.is_empty() {
                for dep in store.project_deployments(pid)? {
                    for &device in &firing {
                        if let Some(r) = store.device_result(dep.id, device)? {
                            offer(device, (r.reported_at, r.deployment_id, r.status));
                        }
                    }
                }
            }
            let mut present = HashMap::with_capacity(latest.len());
            for (device, (at, _, status)) in latest {
                if store.device(pid, device)?.is_some() {
                    present.insert(device, (at, status));
                }
            }
            Ok(present)
        })
        .await
    }

    /// Brings the `deployment_status` rules in step with the results an evaluator may have
    /// missed (`latest`, from `latest_results`): a result from the last
    /// [`RECONCILE_WINDOW_MS`], after the rule was made, fires a rule it matches; one after
    /// a firing that it does not match clears it. Older results are left alone, so a start
    /// does not wake results long past.
    fn reconcile_rollouts(
        &mut self,
        latest: &HashMap<u64, (i64, RolloutStatus)>,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        for i in 0..self.rules.len() {
            for (&device, &(at, status)) in latest {
                self.rollout_rule(i, device, status, Some(at), now, ch)?;
            }
        }
        Ok(())
    }

    fn tick(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        while let Some(Reverse((at, due))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            if self.scheduled.get(&due) != Some(&at) {
                continue; // superseded
            }
            self.scheduled.remove(&due);
            match due {
                Due::Device(d) => self.check_device(d, now, ch)?,
                Due::Window(r, d) => self.window_due(r, d, now, ch)?,
            }
        }
        self.check_server(now, ch)
    }

    /// Judges the server-wide (`disk_space`) rules against the data directory's free space
    /// (read at most every quarter second, shared with the edge's floor): a tick with no such
    /// rule reads nothing.
    fn check_server(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let mut free = None;
        for i in 0..self.rules.len() {
            let Condition::DiskSpace { below_bytes, .. } = self.rules[i].cond else {
                continue;
            };
            let free = *free.get_or_insert_with(|| self.ctx.disk.free_bytes());
            let rule_id = self.rules[i].rule.id;
            let cur = self.states.get(&(rule_id, SERVER)).cloned();
            match (free < below_bytes, cur) {
                (false, Some(s)) => self.clear(i, SERVER, &s, now, ch)?,
                (false, None) => {}
                (true, Some(s)) if s.alert_id.is_some() => {}
                (true, cur) => {
                    let since = cur.map_or(now, |c| c.since);
                    if now >= since + self.rules[i].cond.duration_ms() {
                        self.fire(i, SERVER, since, now, ch)?;
                    } else {
                        self.hold(rule_id, SERVER, since, ch);
                    }
                }
            }
        }
        Ok(())
    }

    /// After the rules changed: states of rules that are gone, disabled or changed (condition
    /// or groups) are
    /// cleared (a firing alert of theirs is resolved without notifications: the rule that
    /// would be resolved no longer exists as it was), then everything is judged again.
    fn reload(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let fresh = self.load()?;
        // What a rule's states depend on: its condition and its devices.
        let shape = |l: &Loaded| {
            (
                l.rule.condition_json.clone(),
                l.rule.device_group_ids.clone(),
            )
        };
        let kept: HashMap<u64, _> = fresh.iter().map(|l| (l.rule.id, shape(l))).collect();
        let old: HashMap<u64, _> = self.rules.iter().map(|l| (l.rule.id, shape(l))).collect();
        let changed = |r: &u64| !kept.contains_key(r) || kept.get(r) != old.get(r);
        let stale: Vec<(u64, u64)> = self
            .states
            .keys()
            .filter(|(r, _)| changed(r))
            .copied()
            .collect();
        for key in stale {
            // Resolved through the rule as it was, so its integrations hear the resolve.
            if let (Some(s), Some(i)) = (
                self.states.get(&key).cloned(),
                self.rules.iter().position(|l| l.rule.id == key.0),
            ) {
                self.clear(i, key.1, &s, now, ch)?;
            }
        }
        self.windows.retain(|(r, _), _| !changed(r));
        self.rules = fresh;
        self.refresh_devices(now, ch)
    }

    /// Rereads the devices (their last heartbeat and metrics) and reconciles the states: a
    /// state whose device is gone, whose rule no longer covers the device, or whose rule is
    /// gone is cleared (resolving its alert); then everything is judged again.
    fn refresh_devices(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let devices = self.store().project_devices(self.pid)?;
        let present: std::collections::HashSet<u64> = devices.iter().map(|d| d.id).collect();
        let before = std::mem::take(&mut self.last_seen);
        self.metrics.clear();
        for d in devices {
            if let Some(ls) = d.last_seen_at {
                self.last_seen.insert(d.id, ls);
                // Online since the stored heartbeat when it went offline between the one this
                // evaluator knew and that one (the stored heartbeat may be the very one whose
                // event comes next, which then finds the device online already).
                let back = before
                    .get(&d.id)
                    .is_some_and(|&prev| ls >= prev + self.ctx.offline_after_ms);
                let since = match self.online_since.get(&d.id) {
                    Some(&s) if !back => s.min(ls),
                    _ => ls,
                };
                self.online_since.insert(d.id, since);
                self.metrics.insert(d.id, Arc::new(d.metrics));
            }
        }
        self.online_since.retain(|d, _| present.contains(d));
        self.windows.retain(|(_, d), _| present.contains(d));
        let keys: Vec<(u64, u64)> = self.states.keys().copied().collect();
        for (r, d) in keys {
            let Some(s) = self.states.get(&(r, d)).cloned() else {
                continue;
            };
            match self.rules.iter().position(|l| l.rule.id == r) {
                // A server-wide rule's state is judged by the tick, not by devices.
                Some(_) if d == SERVER => {}
                Some(i) => {
                    if !present.contains(&d) || !self.applies(&self.rules[i].rule, d)? {
                        self.clear(i, d, &s, now, ch)?;
                    }
                }
                None => {
                    // A rule deleted or disabled while no evaluator ran: nothing to notify
                    // through; the alert is closed.
                    self.states.remove(&(r, d));
                    ch.states.push((r, d, None));
                    if let Some(a) = s.alert_id
                        && let Some(mut alert) = self.store().alert(self.pid, a)?
                        && alert.state == AlertState::Firing
                    {
                        alert.state = AlertState::Resolved;
                        alert.resolved_at = Some(now);
                        ch.alerts.push(alert);
                    }
                }
            }
        }
        self.recheck_everything(now, ch)
    }

    fn recheck_everything(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let devices: Vec<u64> = self.last_seen.keys().copied().collect();
        for d in devices {
            self.check_device(d, now, ch)?;
        }
        // A firing log alert whose window was lost with a restart resolves once a whole
        // window passes without matches.
        let firing_logs: Vec<(u64, u64, i64)> = self
            .states
            .keys()
            .filter_map(|(r, d)| {
                self.rules
                    .iter()
                    .find(|l| l.rule.id == *r)
                    .and_then(|l| match l.cond {
                        Condition::LogPattern { window_seconds, .. } => {
                            Some((*r, *d, (window_seconds as i64).saturating_mul(1000)))
                        }
                        _ => None,
                    })
            })
            .collect();
        for (r, d, w) in firing_logs {
            if let std::collections::hash_map::Entry::Vacant(e) = self.windows.entry((r, d)) {
                e.insert(VecDeque::from([now]));
                self.schedule(Due::Window(r, d), now + w);
            }
        }
        Ok(())
    }

    fn hold(&mut self, rule_id: u64, device: u64, since: i64, ch: &mut Changes) {
        let st = ConditionState {
            rule_id,
            device_id: device,
            since,
            alert_id: None,
        };
        if self.states.get(&(rule_id, device)) != Some(&st) {
            self.states.insert((rule_id, device), st.clone());
            ch.states.push((rule_id, device, Some(st)));
        }
    }

    fn summary(&self, l: &Loaded, device_name: &str) -> String {
        match &l.cond {
            Condition::DeviceStatus {
                status,
                duration_seconds,
            } => format!(
                "{device_name} has been {} for {duration_seconds} s",
                match status {
                    DeviceStatus::Online => "online",
                    DeviceStatus::Offline => "offline",
                }
            ),
            Condition::MetricThreshold {
                metric,
                operator,
                threshold,
                duration_seconds,
            } => format!(
                "{metric} {} {threshold} on {device_name} for {duration_seconds} s",
                operator.symbol()
            ),
            Condition::LogPattern {
                pattern,
                count,
                window_seconds,
                ..
            } => format!(
                "{count} log line(s) matching /{pattern}/ within {window_seconds} s on {device_name}"
            ),
            Condition::DeploymentStatus { status } => format!(
                "a deployment {} on {device_name}",
                match status {
                    RolloutOutcome::Succeeded => "succeeded",
                    RolloutOutcome::Failed => "failed",
                }
            ),
            Condition::DiskSpace {
                below_bytes,
                duration_seconds,
            } => format!(
                "the server's data directory has {} bytes free, below {below_bytes}, for \
                 {duration_seconds} s",
                self.ctx.disk.free_bytes()
            ),
        }
    }

    fn notify(
        &self,
        l: &Loaded,
        alert: &Alert,
        event: AlertEvent,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let n = l.rule.integration_ids.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let first = self.store().new_ids(Seq::Notification, n)?;
        for (k, integration_id) in l.rule.integration_ids.iter().enumerate() {
            ch.notifications.push(Notification {
                id: first + k as u64,
                project_id: self.pid,
                alert_id: alert.id,
                integration_id: *integration_id,
                event,
                attempts: 0,
                success: None,
                last_error: None,
                next_attempt_at: now,
                created_at: now,
            });
        }
        Ok(())
    }

    /// The deployment package most recently activated for `device` within the correlation
    /// window before `now`, if any.
    fn related(
        &self,
        device: &fleetops_storage::Device,
        now: i64,
    ) -> Result<Option<RelatedDeployment>> {
        let mut best: Option<RelatedDeployment> = None;
        for d in self.store().project_deployments(self.pid)? {
            let Some(at) = d.deployed_at else { continue };
            if at > now || now - at > self.ctx.correlation_window_ms {
                continue;
            }
            if best.as_ref().is_some_and(|b| b.activated_at >= at) {
                continue;
            }
            if crate::rules::deployments::targets_device(self.store(), &d, device)? {
                best = Some(RelatedDeployment {
                    id: d.id,
                    name: d.name.clone(),
                    activated_at: at,
                });
            }
        }
        Ok(best)
    }

    fn fire(
        &mut self,
        i: usize,
        device: u64,
        since: i64,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let stored = match device {
            SERVER => None,
            _ => self.store().device(self.pid, device)?,
        };
        let related = match &stored {
            Some(d) => self.related(d, now)?,
            None => None,
        };
        let l = &self.rules[i];
        let name = stored.map_or_else(|| format!("device {device}"), |d| d.name);
        let id = self.store().new_id(Seq::Alert)?;
        let alert = Alert {
            id,
            project_id: self.pid,
            rule_id: l.rule.id,
            rule_name: l.rule.name.clone(),
            severity: l.rule.severity,
            state: AlertState::Firing,
            device_id: device,
            summary: self.summary(l, &name),
            fired_at: now,
            resolved_at: None,
            dedup_key: format!("fleetops-{}-{id}", self.slug),
            related_deployment: related,
        };
        self.notify(l, &alert, AlertEvent::Firing, now, ch)?;
        let st = ConditionState {
            rule_id: l.rule.id,
            device_id: device,
            since,
            alert_id: Some(id),
        };
        ch.states.push((st.rule_id, device, Some(st.clone())));
        self.states.insert((st.rule_id, device), st);
        ch.alerts.push(alert);
        Ok(())
    }

    fn clear(
        &mut self,
        i: usize,
        device: u64,
        s: &ConditionState,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let rule_id = self.rules[i].rule.id;
        self.states.remove(&(rule_id, device));
        ch.states.push((rule_id, device, None));
        if let Some(a) = s.alert_id
            && let Some(mut alert) = self.store().alert(self.pid, a)?
            && alert.state == AlertState::Firing
        {
            alert.state = AlertState::Resolved;
            alert.resolved_at = Some(now);
            self.notify(&self.rules[i], &alert, AlertEvent::Resolved, now, ch)?;
            ch.alerts.push(alert);
        }
        Ok(())
    }

    /// Writes a step's changes in one batch, waits until they are on disk, then hands the
    /// owed notifications to the project's notifier.
    async fn commit(&mut self, ch: Changes) -> Result<()> {
        if ch.states.is_empty() && ch.alerts.is_empty() && ch.notifications.is_empty() {
            return Ok(());
        }
        self.ctx.store.apply_evaluation(
            self.pid,
            &ch.states,
            &ch.alerts,
            &ch.notifications,
            self.lease.as_ref().map(|(f, _)| f),
        )?;
        self.ctx.store.durable().await?;
        if !ch.notifications.is_empty() {
            match self.ctx.notifiers.actor(self.pid).await {
                Ok(a) => {
                    let _ = a.cast(Envelope::cast(NotifierMsg::Owed(ch.notifications)));
                }
                // Stored as owed: the notifier takes them when it starts.
                Err(e) => tracing::warn!(project = self.pid, error = %e, "notifier unavailable"),
            }
        }
        Ok(())
    }
}
