//! Notifier: one per project, the single writer of its notifications' outcomes. It holds the
//! owed notifications in a deadline heap, sends each in its own task (at most
//! `[alerts] max_in_flight` at once across all projects, of which at most
//! `max_in_flight_per_project` for one project and `max_in_flight_per_org` for one
//! organization, so a slow target holds one slot, a project whose targets all hang holds its
//! share and never the whole pool, and neither delays another target or the evaluator),
//! records every attempt, and retries 5xx,
//! 429 (`Retry-After`, capped), timeouts and connection errors with exponential backoff up to
//! `[alerts] max_attempts`. Owed notifications are stored, so a restart resumes them.
//!
//! Several nodes: only the notifier on the node whose evaluator holds the project's lease
//! (`alerts/{project}`) sends; the others hold their owed notifications and send nothing, and
//! one that comes to hold the lease reads what is owed from storage first.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use crate::counters::Counters;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::alerts::sender::{SendError, Sender};
use crate::clock::Clock;
use crate::config::AlertsConfig;
use crate::error::{Error, Result};
use crate::mailbox::Envelope;
use crate::project::alerting::full_config;
use crate::rules::notifications::{AlertMessage, render};
use crate::secrets::Sealer;
use fleetops_storage::{Notification, Store};

pub(crate) enum NotifierMsg {
    /// Notifications written as owed (on disk already).
    Owed(Vec<Notification>),
    /// An attempt ended.
    Attempted {
        id: u64,
        outcome: std::result::Result<String, SendError>,
    },
    Tick,
    /// Fault injection (supervision tests only).
    #[cfg(feature = "fault-injection")]
    Panic,
}

#[derive(Clone)]
pub(crate) struct NotifierCtx {
    pub counters: Arc<crate::counters::Counters>,
    pub store: Store,
    pub clock: Clock,
    pub sealer: Sealer,
    pub sender: Sender,
    pub cfg: Arc<AlertsConfig>,
    /// The sending slots, shared by every project's notifier, with each organization's
    /// share.
    pub slots: crate::shares::Shares,
    /// Several nodes: this node's id, to know whether it holds the project's lease.
    pub bus: crate::bus::Bus,
}

#[derive(Default)]
pub(crate) struct Notifier;

impl crate::keyed::KeyedChild for Notifier {
    type Req = NotifierMsg;
    type Ctx = NotifierCtx;
    const KIND: &'static str = "notifier";
}

/// How often (in ticks) a notifier rereads its owed notifications from storage.
const REREAD_EVERY_TICKS: u32 = 240;
/// The longest backoff between two attempts.
const MAX_BACKOFF_MS: u64 = 300_000;

pub(crate) struct NotifierState {
    pid: u64,
    slug: String,
    /// The project's organization, whose share of the slots it takes from.
    org: u64,
    /// Ticks since the owed notifications were last reread from storage.
    ticks: u32,
    ctx: NotifierCtx,
    owed: HashMap<u64, Notification>,
    heap: BinaryHeap<Reverse<(i64, u64)>>,
    sending: HashSet<u64>,
    /// The owed notifications of each (alert, integration), in order: only the first may be
    /// sent, so a resolve never overtakes its firing.
    order: HashMap<(u64, u64), BTreeSet<u64>>,
    /// Several nodes: whether this node held the project's lease when last looked at, and
    /// when that was (Unix ms).
    holds: (bool, i64),
}

impl Actor for Notifier {
    type Msg = Envelope<NotifierMsg>;
    type State = NotifierState;
    type Arguments = (NotifierCtx, u64);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, pid): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let project = ctx.store.project(pid)?;
        let slug = project.as_ref().map(|p| p.slug.clone()).unwrap_or_default();
        let org = project.map_or(0, |p| p.org_id);
        let mut st = NotifierState {
            pid,
            slug,
            org,
            ticks: 0,
            owed: HashMap::new(),
            heap: BinaryHeap::new(),
            sending: HashSet::new(),
            order: HashMap::new(),
            holds: (false, i64::MIN),
            ctx,
        };
        for n in st.ctx.store.owed_notifications()? {
            if n.project_id == pid {
                st.take(n);
            }
        }
        let tick = Duration::from_millis(st.ctx.cfg.tick_ms.clamp(10, 1000));
        myself.send_interval(tick, || Envelope::cast(NotifierMsg::Tick));
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
        // Its organization deleted: nothing more is sent (the purge drops what is owed).
        if st.ctx.store.project_retired(st.pid) {
            myself.stop(None);
            return Ok(());
        }
        match msg {
            #[cfg(feature = "fault-injection")]
            NotifierMsg::Panic => panic!("injected fault in a notifier"),
            NotifierMsg::Owed(list) => {
                // Already settled by this notifier, which started from storage after the batch
                // was written: not taken again (each alert's records read once).
                let mut settled: HashMap<u64, HashSet<u64>> = HashMap::new();
                for n in list {
                    let done = match settled.entry(n.alert_id) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => e.insert(
                            st.ctx
                                .store
                                .alert_notifications(n.alert_id)?
                                .into_iter()
                                .filter(|x| x.success.is_some())
                                .map(|x| x.id)
                                .collect(),
                        ),
                    };
                    if !done.contains(&n.id) {
                        st.take(n);
                    }
                }
                st.start_due(&myself);
            }
            NotifierMsg::Tick => {
                st.ticks += 1;
                // Now and then, whatever is owed in storage (an evaluator whose message was
                // lost after its write, for instance).
                if st.ticks >= REREAD_EVERY_TICKS {
                    st.ticks = 0;
                    for n in st.ctx.store.owed_notifications()? {
                        if n.project_id == st.pid {
                            st.take(n);
                        }
                    }
                }
                st.start_due(&myself)
            }
            NotifierMsg::Attempted { id, outcome } => {
                st.sending.remove(&id);
                st.record(id, outcome).await?;
                st.start_due(&myself);
            }
        }
        Ok(())
    }
}

impl NotifierState {
    fn take(&mut self, n: Notification) {
        if n.success.is_some() || self.owed.contains_key(&n.id) {
            return;
        }
        self.heap.push(Reverse((n.next_attempt_at, n.id)));
        self.order
            .entry((n.alert_id, n.integration_id))
            .or_default()
            .insert(n.id);
        self.owed.insert(n.id, n);
    }

    /// Whether this notifier sends: always on one node; with several, while this node's
    /// evaluator holds the project's lease (looked at most twice a second). Coming to hold it,
    /// what is owed is read from storage first.
    fn may_send(&mut self) -> bool {
        if !self.ctx.bus.is_shared() {
            return true;
        }
        let now = self.ctx.clock.now_ms();
        if now.saturating_sub(self.holds.1) < 500 {
            return self.holds.0;
        }
        let me = self.ctx.bus.node_id();
        let holds = matches!(
            self.ctx.store.lease(&crate::alerts::remote::lease_name(self.pid)),
            Ok(Some(l)) if l.holder == me && l.until > now
        );
        if holds && !self.holds.0 {
            match self.ctx.store.owed_notifications() {
                Ok(owed) => {
                    for n in owed {
                        if n.project_id == self.pid {
                            self.take(n);
                        }
                    }
                }
                Err(_) => return false,
            }
        }
        self.holds = (holds, now);
        holds
    }

    /// Starts every due attempt a slot is free for (within the project's and its
    /// organization's shares); the rest wait for a slot of theirs or the next tick.
    fn start_due(&mut self, myself: &ActorRef<Envelope<NotifierMsg>>) {
        if !self.may_send() {
            return;
        }
        let now = self.ctx.clock.now_ms();
        while let Some(Reverse((at, id))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            let Some(n) = self.owed.get(&id) else {
                self.heap.pop();
                continue;
            };
            if n.next_attempt_at != at || self.sending.contains(&id) {
                self.heap.pop();
                continue;
            }
            // One integration hears an alert's messages in order: a resolve waits while the
            // firing before it is still owed (retrying), so it never overtakes it.
            let (alert, integration) = (n.alert_id, n.integration_id);
            let earlier = self
                .order
                .get(&(alert, integration))
                .and_then(|ids| ids.first())
                .is_some_and(|first| *first < id);
            if earlier {
                self.heap.pop();
                let later = now + self.ctx.cfg.tick_ms.clamp(10, 1000) as i64;
                if let Some(n) = self.owed.get_mut(&id) {
                    n.next_attempt_at = later;
                }
                self.heap.push(Reverse((later, id)));
                continue;
            }
            if self.sending.len() >= self.ctx.cfg.max_in_flight_per_project.max(1) {
                break;
            }
            let Some(slot) = self.ctx.slots.try_take(self.org) else {
                break;
            };
            self.heap.pop();
            self.sending.insert(id);
            let (n, ctx, slug, me) = (
                n.clone(),
                self.ctx.clone(),
                self.slug.clone(),
                myself.clone(),
            );
            tokio::spawn(async move {
                // Reports the attempt however the task ends: a panic inside it is a failed
                // attempt to retry, and never leaves the notification marked as being sent.
                let mut report = Report {
                    me,
                    id: n.id,
                    outcome: None,
                };
                report.outcome = Some(attempt(&ctx, &slug, &n).await);
                drop(slot);
            });
        }
    }

    /// Records an attempt: done, retried later, or failed for good.
    async fn record(
        &mut self,
        id: u64,
        outcome: std::result::Result<String, SendError>,
    ) -> Result<()> {
        let Some(mut n) = self.owed.remove(&id) else {
            return Ok(());
        };
        let now = self.ctx.clock.now_ms();
        n.attempts += 1;
        let counted = match outcome {
            Ok(_) => {
                n.success = Some(true);
                n.last_error = None;
                &self.ctx.counters.notifications_sent
            }
            Err(SendError::Retry { message, after }) if n.attempts < self.ctx.cfg.max_attempts => {
                let backoff = self
                    .ctx
                    .cfg
                    .retry_base_ms
                    .saturating_mul(1u64 << (n.attempts - 1).min(20))
                    .min(MAX_BACKOFF_MS);
                let wait = after.map_or(backoff, |a| {
                    a.as_millis().min(u128::from(MAX_BACKOFF_MS)) as u64
                });
                n.last_error = Some(message);
                n.next_attempt_at = now.saturating_add(wait as i64);
                &self.ctx.counters.notifications_retried
            }
            Err(e) => {
                n.success = Some(false);
                n.last_error = Some(e.message().to_string());
                &self.ctx.counters.notifications_failed
            }
        };
        self.ctx.store.put_notification(&n)?;
        // Counted once recorded: an attempt whose record failed is made again after the
        // restart and counted then.
        Counters::add(counted, 1);
        // On disk with the next group commit, which this asks for without holding the
        // notifier (one fsync per attempt, in series, made 10,000 notifications take
        // seconds). A crash before it sends the attempt again: delivery is at least once.
        let store = self.ctx.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.durable().await {
                tracing::warn!(error = %e, "a notification's outcome did not reach the disk");
            }
        });
        if n.success.is_none() {
            self.heap.push(Reverse((n.next_attempt_at, n.id)));
            self.owed.insert(n.id, n);
        } else {
            let key = (n.alert_id, n.integration_id);
            if let Some(ids) = self.order.get_mut(&key) {
                ids.remove(&n.id);
                if ids.is_empty() {
                    self.order.remove(&key);
                }
            }
        }
        Ok(())
    }
}

/// One attempt of one notification: what the alert says, rendered for its integration.
async fn attempt(
    ctx: &NotifierCtx,
    slug: &str,
    n: &Notification,
) -> std::result::Result<String, SendError> {
    let fail = |e: Error| SendError::Final(e.to_string());
    let integration = ctx
        .store
        .integration(n.project_id, n.integration_id)
        .map_err(|e| fail(e.into()))?
        .ok_or_else(|| SendError::Final("the integration was deleted".into()))?;
    if !integration.enabled {
        return Err(SendError::Final("the integration is disabled".into()));
    }
    let alert = ctx
        .store
        .alert(n.project_id, n.alert_id)
        .map_err(|e| fail(e.into()))?
        .ok_or_else(|| SendError::Final("the alert is gone".into()))?;
    let cfg = full_config(&ctx.sealer, &integration).map_err(fail)?;
    let device_id = crate::rules::alert_conditions::alert_device(alert.device_id);
    let device_name = device_id
        .and_then(|d| ctx.store.device(n.project_id, d).ok().flatten())
        .map(|d| d.name);
    let msg = AlertMessage {
        event: n.event,
        alert_id: Some(alert.id),
        rule_id: Some(alert.rule_id),
        rule_name: alert.rule_name.clone(),
        severity: alert.severity,
        project: slug.to_string(),
        device_id,
        device_name,
        summary: alert.summary.clone(),
        fired_at: alert.fired_at,
        resolved_at: alert.resolved_at,
        dedup_key: alert.dedup_key.clone(),
        related_deployment: alert.related_deployment.clone(),
    };
    // The same delivery id on every attempt of one notification, so receivers can dedupe.
    let delivery = uuid::Uuid::from_u64_pair(n.alert_id, n.id).to_string();
    let out = render(
        &cfg,
        &msg,
        ctx.sender.pagerduty_url(),
        &delivery,
        ctx.clock.now_ms() / 1000,
    );
    ctx.sender.send(&out).await
}

/// An attempt's outcome, sent to its notifier when dropped (`None`: the attempt panicked).
struct Report {
    me: ActorRef<Envelope<NotifierMsg>>,
    id: u64,
    outcome: Option<std::result::Result<String, SendError>>,
}

impl Drop for Report {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or_else(|| {
            Err(SendError::Retry {
                message: "the attempt failed inside fleetops".into(),
                after: None,
            })
        });
        let _ = self.me.cast(Envelope::cast(NotifierMsg::Attempted {
            id: self.id,
            outcome,
        }));
    }
}
