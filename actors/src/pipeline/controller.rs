//! RolloutController: one per phased rollout a controller still has work for (running, or
//! with a failed gate's notice owed), under a keyed supervisor. It writes nothing itself and
//! keeps no rollout state: every tick (`[pipeline] rollout_tick_ms`) it reads the rollout,
//! judges the current phase's gate (`rules::rollouts`: failure rate, gate rules fired on the
//! devices the rollout has reached, the phase's wait) and sends its verdict to the project's
//! actor, the rollout's single writer, which records it durably as a decision. A verdict names
//! the phase it judged and when that phase began, so one for a phase the rollout has left, or
//! paused and resumed since, changes nothing. A restart (a panic, a kill -9) continues exactly
//! where the stored rollout stands.
//!
//! A failed gate's notice is owed durably in the rollout record and goes to every enabled
//! integration of the gate rules until each took it, retried after 1 s, doubling to 5 minutes.
//! Only who took it and the backoff are kept in memory, so after a restart the owed notice
//! goes to all of them again.
//!
//! A controller with nothing left to do leaves its supervisor's registry before it stops and
//! then looks once more, so a resume that reached it on its way out still gets a fresh
//! controller at once. The housekeeper starts a controller for any rollout with work left that
//! has none.
//!
//! Tested through the real server (`tests/api/rollouts/`: phases followed by fifty robots,
//! gates that pause and roll back, kill -9, a panic injected, a resume racing the stop).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fleetops_storage::{
    AlertEvent, DeploymentStatus, RolloutState, RolloutStatus, Severity, Store,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::assignments::Assignments;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::mailbox::Envelope;
use crate::project::PipelineMsg;
use crate::project::handle::ProjectsHandle;
use crate::rules::notifications::{AlertMessage, render};
use crate::rules::rollouts::{
    Member, RolloutAction, RolloutPlan, Step, gate, late_verdict, notice_for,
};

pub(crate) enum RolloutMsg {
    /// Judge the gate now (the interval, and a nudge after a member's action).
    Tick,
    /// Fault injection: the controller panics in its handler (supervision tests).
    #[cfg(feature = "fault-injection")]
    Panic,
}

/// Fault injection: per package, a hold the next controller of it to find nothing to do
/// takes: it sets the flag and waits for the `Notify` before it leaves the registry.
#[cfg(feature = "fault-injection")]
pub(crate) type StopHolds =
    Arc<dashmap::DashMap<u64, (Arc<tokio::sync::Notify>, Arc<std::sync::atomic::AtomicBool>)>>;

/// What every controller shares.
#[derive(Clone)]
pub(crate) struct RolloutCtx {
    pub store: Store,
    pub projects: ProjectsHandle,
    pub assignments: Arc<Assignments>,
    pub sender: crate::alerts::sender::Sender,
    pub sealer: crate::secrets::Sealer,
    pub clock: Clock,
    pub tick: Duration,
    /// The controllers' own supervisor: a stopping controller leaves its registry, and starts
    /// a fresh one when a resume came meanwhile.
    pub controllers: crate::keyed::Keyed<RolloutController>,
    /// Several nodes: a controller decides only while it holds its rollout's lease.
    pub bus: crate::bus::Bus,
    pub lease_ttl_ms: i64,
    /// A device unseen this long is offline (named so in a report timeout's reason).
    pub offline_after_ms: i64,
    #[cfg(feature = "fault-injection")]
    pub stop_holds: StopHolds,
}

/// The bus subject on which a node asks the others to start a rollout's controller (its id,
/// 8 bytes big-endian).
pub(crate) const SUBJECT: &str = "fleetops.rollouts";

#[derive(Default)]
pub(crate) struct RolloutController;

impl crate::keyed::KeyedChild for RolloutController {
    type Req = RolloutMsg;
    type Ctx = RolloutCtx;
    const KIND: &'static str = "rollout";
}

pub(crate) struct ControllerState {
    ctx: RolloutCtx,
    /// The package (its deployment id).
    id: u64,
    /// Failed attempts at the owed notice in this incarnation (its backoff).
    notice_attempts: u32,
    /// No attempt before this moment (Unix ms).
    notice_not_before: i64,
    /// The integrations that took the owed notice (so a retry goes only to the others), and
    /// the time of the decision that owes it.
    notice_sent_to: (i64, HashSet<u64>),
    /// The rollout's lease as taken at this tick (several nodes), which its writes check.
    fence: Option<fleetops_storage::leases::Fence>,
}

/// The owed notice is retried after 1 s, doubling up to 5 minutes, until every integration
/// of the gate rules took it.
const NOTICE_BACKOFF_MS: (i64, i64) = (1_000, 300_000);
/// The alerts of one gate rule read per tick at most (newest first, back to the phase's start).
const ALERTS_PER_RULE: usize = 2_000;

impl Actor for RolloutController {
    type Msg = Envelope<RolloutMsg>;
    type State = ControllerState;
    type Arguments = (RolloutCtx, u64);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, id): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(ctx.tick, || Envelope::cast(RolloutMsg::Tick));
        let _ = myself.cast(Envelope::cast(RolloutMsg::Tick));
        Ok(ControllerState {
            ctx,
            id,
            notice_attempts: 0,
            notice_not_before: 0,
            notice_sent_to: (i64::MIN, HashSet::new()),
            fence: None,
        })
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
        match msg {
            RolloutMsg::Tick => match st.tick().await {
                Ok(true) => {}
                // Nothing left to do: a later resume or restart starts it again.
                Ok(false) => st.stop(&myself).await,
                Err(e) => tracing::warn!(deployment = st.id, error = %e, "rollout tick failed"),
            },
            #[cfg(feature = "fault-injection")]
            RolloutMsg::Panic => panic!("injected fault in the rollout controller {}", st.id),
        }
        Ok(())
    }
}

impl ControllerState {
    /// Stops a controller that found nothing to do. A resume's nudge sent to it from now
    /// until it is gone would be lost with its mailbox, so it first leaves the registry (a
    /// resume from then on starts a fresh controller) and then looks once more: a resume
    /// that came before finds its rollout running again here, and a fresh controller is
    /// started for it.
    async fn stop(&mut self, myself: &ActorRef<Envelope<RolloutMsg>>) {
        #[cfg(feature = "fault-injection")]
        if let Some((_, (release, reached))) = self.ctx.stop_holds.remove(&self.id) {
            reached.store(true, std::sync::atomic::Ordering::SeqCst);
            release.notified().await;
        }
        let me = myself.get_id();
        self.ctx
            .controllers
            .registry
            .remove_if(&self.id, |_, a| a.get_id() == me);
        let store = self.ctx.store.clone();
        let id = self.id;
        let again = crate::off_thread(move || has_work(&store, id)).await;
        myself.stop(None);
        match again {
            Ok(false) => {}
            Ok(true) | Err(_) => {
                let controllers = self.ctx.controllers.clone();
                tokio::spawn(async move { start(&controllers, id).await });
            }
        }
    }

    /// One judgement; `false` when the controller has nothing left to do.
    async fn tick(&mut self) -> Result<bool> {
        let (store, id) = (self.ctx.store.clone(), self.id);
        let Some(r) = store.rollout(id)? else {
            return Ok(false);
        };
        // Several nodes: only the holder of the rollout's lease judges and notifies; the
        // others keep ticking, to take over once it lapses (its holder died or stalled).
        self.fence = None;
        if self.ctx.bus.is_shared() {
            let ctx = self.ctx.clone();
            let taken = crate::off_thread(move || {
                ctx.store
                    .take_lease(
                        &format!("rollout/{id}"),
                        ctx.bus.node_id(),
                        ctx.clock.now_ms(),
                        ctx.lease_ttl_ms,
                    )
                    .map_err(Error::from)
            })
            .await?;
            match taken {
                Some(f) => self.fence = Some(f),
                None => return Ok(true),
            }
        }
        let pid = r.project_id;
        // A deleted organization's rollout: no notice, no step; the purge removes it.
        if store.project_retired(pid) {
            return Ok(false);
        }
        if let Some(notice) = r.notice_owed.clone() {
            self.notify(&r, &notice).await?;
        }
        let Some(d) = store.deployment(pid, id)? else {
            return Ok(false);
        };
        // A completed rollout with a late failure owed: judged once, recorded, notified.
        if r.late_owed && r.state == RolloutState::Completed && d.status == DeploymentStatus::Active
        {
            let ctx = self.ctx.clone();
            let reason = crate::off_thread(move || {
                let plan = RolloutPlan::of(&r)
                    .ok_or_else(|| Error::Internal(format!("package {id}: plan does not parse")))?;
                let members = members(&ctx, &d, &plan)?;
                Ok((0..plan.phases.len() as u32).find_map(|i| {
                    late_verdict(&plan, i, &r, members.get(i as usize).map_or(&[], |m| m))
                }))
            })
            .await?;
            self.write(pid, id, RolloutAction::Late { reason }).await?;
            let owed = store.rollout(id)?.is_some_and(|r| r.notice_owed.is_some());
            return Ok(owed);
        }
        // Paused, finished, or its package no longer active: nothing to judge. A paused
        // rollout's controller stops too (a resume starts it again); one with a notice owed
        // stays until the notice is sent.
        if d.status != DeploymentStatus::Active || r.state != RolloutState::Running {
            let owed = store.rollout(id)?.is_some_and(|r| r.notice_owed.is_some());
            return Ok(owed);
        }
        let ctx = self.ctx.clone();
        let now = ctx.clock.now_ms();
        let (from_phase, since) = (r.phase, r.phase_started_at);
        let step = crate::off_thread(move || {
            let plan = RolloutPlan::of(&r)
                .ok_or_else(|| Error::Internal(format!("package {id}: plan does not parse")))?;
            let members = members(&ctx, &d, &plan)?;
            let reached: HashSet<u64> = members
                .iter()
                .take(r.phase as usize + 1)
                .flatten()
                .map(|m| m.id)
                .collect();
            let fired = fired(&ctx.store, pid, &plan, r.phase_started_at, &reached)?;
            let current = members.get(r.phase as usize).map_or(&[][..], |m| m);
            let offered_at = |dev: u64| ctx.store.device_offered_at(id, dev).ok().flatten();
            let step = gate(&plan, &r, now, current, fired, offered_at, |ids| {
                unreported(&ctx, pid, ids, now)
            });
            if step == Step::Wait || step == Step::Advance || step == Step::Complete {
                // A phase that passed before is judged again on what was reported since.
                for i in 0..r.phase {
                    let m = members.get(i as usize).map_or(&[][..], |m| m);
                    if let Some(why) = late_verdict(&plan, i, &r, m) {
                        return Ok(Step::Fail(why));
                    }
                }
            }
            Ok(step)
        })
        .await?;
        if step != Step::Wait {
            self.write(
                pid,
                id,
                RolloutAction::Step {
                    from_phase,
                    since,
                    step: step.clone(),
                },
            )
            .await?;
        }
        // A completed rollout is looked at once more by the next tick (its late failures).
        Ok(true)
    }

    /// Sends a controller's verdict to the rollout's writer, fenced by this tick's lease.
    async fn write(&self, pid: u64, id: u64, action: RolloutAction) -> Result<()> {
        self.ctx
            .projects
            .write(pid, |reply| PipelineMsg::Rollout {
                id,
                action: action.clone(),
                fence: self.fence.clone(),
                reply,
            })
            .await?;
        Ok(())
    }

    /// Sends the owed notice to every integration of the gate rules, then records it sent.
    async fn notify(
        &mut self,
        r: &fleetops_storage::pipeline::rollouts::Rollout,
        notice: &str,
    ) -> Result<()> {
        let (store, pid, id) = (&self.ctx.store, r.project_id, r.deployment_id);
        let plan = RolloutPlan::of(r).unwrap_or(RolloutPlan {
            phases: Vec::new(),
            gate_alert_rule_ids: Vec::new(),
            on_failure: Default::default(),
        });
        let slug = store.project(pid)?.map(|p| p.slug).unwrap_or_default();
        let name = store
            .deployment(pid, id)?
            .map(|d| d.name)
            .unwrap_or_else(|| id.to_string());
        let now = self.ctx.clock.now_ms();
        if now < self.notice_not_before {
            return Ok(());
        }
        // The decision that owes the notice (a gate's pause or rollback): its time keys the
        // notice, so a member's resume or abort meanwhile, or a later gate failure with the
        // same reason, neither changes an incident's key nor passes for this notice's sends.
        let decided_at = r
            .decisions
            .iter()
            .rev()
            .find(|d| notice_for(&d.action, &d.reason).as_deref() == Some(notice))
            .map_or(now, |d| d.at);
        if self.notice_sent_to.0 != decided_at {
            self.notice_sent_to = (decided_at, HashSet::new());
        }
        let mut integrations = Vec::new();
        for rid in &plan.gate_alert_rule_ids {
            if let Some(rule) = store.alert_rule(pid, *rid)? {
                for i in rule.integration_ids {
                    if !integrations.contains(&i) {
                        integrations.push(i);
                    }
                }
            }
        }
        let msg = AlertMessage {
            event: AlertEvent::Firing,
            alert_id: None,
            rule_id: plan.gate_alert_rule_ids.first().copied(),
            rule_name: format!("rollout of {name}"),
            severity: Severity::Warning,
            project: slug,
            device_id: None,
            device_name: None,
            summary: format!("Package {name} (deployment {id}): {notice}"),
            fired_at: now,
            resolved_at: None,
            dedup_key: format!("fleetops-rollout-{id}-{decided_at}"),
            related_deployment: None,
        };
        let mut all_sent = true;
        for iid in integrations {
            if self.notice_sent_to.1.contains(&iid) {
                continue;
            }
            let Some(i) = store.integration(pid, iid)? else {
                continue;
            };
            if !i.enabled {
                continue;
            }
            let cfg = crate::project::alerting::full_config(&self.ctx.sealer, &i)?;
            let out = render(
                &cfg,
                &msg,
                self.ctx.sender.pagerduty_url(),
                &uuid::Uuid::new_v4().to_string(),
                now / 1000,
            );
            match self.ctx.sender.send(&out).await {
                Ok(_) => {
                    self.notice_sent_to.1.insert(iid);
                }
                Err(e) => {
                    all_sent = false;
                    tracing::warn!(
                        deployment = id,
                        integration = iid,
                        error = e.message(),
                        "rollout notice not delivered; retried later"
                    );
                }
            }
        }
        if !all_sent {
            // Still owed: the next attempt after a doubling wait.
            let wait = NOTICE_BACKOFF_MS
                .0
                .saturating_mul(1 << self.notice_attempts.min(16))
                .min(NOTICE_BACKOFF_MS.1);
            self.notice_attempts += 1;
            self.notice_not_before = now + wait;
            return Ok(());
        }
        self.ctx
            .projects
            .write(pid, |reply| PipelineMsg::Rollout {
                id,
                action: RolloutAction::NoticeSent,
                fence: self.fence.clone(),
                reply,
            })
            .await?;
        self.notice_attempts = 0;
        self.notice_not_before = 0;
        Ok(())
    }
}

/// Each phase's devices (by id) with their final results with the package.
fn members(
    ctx: &RolloutCtx,
    d: &fleetops_storage::Deployment,
    plan: &RolloutPlan,
) -> Result<Vec<Vec<Member>>> {
    let phases = ctx.assignments.phases(
        &ctx.store,
        d,
        plan,
        ctx.assignments.generation(d.project_id),
    )?;
    let results: std::collections::HashMap<u64, (bool, i64)> = ctx
        .store
        .device_results(d.id)?
        .into_iter()
        .map(|x| {
            (
                x.device_id,
                (x.status == RolloutStatus::Failed, x.reported_at),
            )
        })
        .collect();
    let mut out: Vec<Vec<Member>> = vec![Vec::new(); plan.phases.len()];
    for (dev, p) in phases.iter() {
        if let Some(m) = out.get_mut(*p as usize) {
            m.push(Member {
                id: *dev,
                result: results.get(dev).copied(),
            });
        }
    }
    for m in &mut out {
        m.sort_unstable_by_key(|m| m.id);
    }
    Ok(out)
}

/// The devices that did not report, for a timeout's reason: by name, the offline ones said
/// so, at most [`UNREPORTED_NAMED`] of them.
fn unreported(ctx: &RolloutCtx, pid: u64, ids: &[u64], now: i64) -> String {
    let mut named = Vec::new();
    let mut offline = 0usize;
    for &id in ids {
        let (name, off) = match ctx.store.device(pid, id) {
            Ok(Some(d)) => {
                let off = d
                    .last_seen_at
                    .is_none_or(|t| now.saturating_sub(t) >= ctx.offline_after_ms);
                (d.name, off)
            }
            _ => (format!("device {id}"), false),
        };
        offline += usize::from(off);
        if named.len() < UNREPORTED_NAMED {
            named.push(if off {
                format!("{name} (offline)")
            } else {
                name
            });
        }
    }
    let mut s = named.join(", ");
    if ids.len() > named.len() {
        s.push_str(&format!(" and {} more", ids.len() - named.len()));
    }
    if offline > 0 {
        s.push_str(&format!("; {offline} offline"));
    }
    s
}

/// A report timeout's reason names at most this many devices (and counts the rest).
const UNREPORTED_NAMED: usize = 20;

/// The first gate rule that fired on one of `devices` at or after `since`: `(rule, device)`.
fn fired(
    store: &Store,
    pid: u64,
    plan: &RolloutPlan,
    since: i64,
    devices: &HashSet<u64>,
) -> Result<Option<(u64, u64)>> {
    const PAGE: usize = 200;
    for &rule in &plan.gate_alert_rule_ids {
        let mut skip = 0;
        'pages: while skip < ALERTS_PER_RULE {
            let (alerts, _) = store.alerts_page(pid, None, Some(rule), None, skip, PAGE)?;
            for a in &alerts {
                if a.fired_at < since {
                    break 'pages;
                }
                if devices.contains(&a.device_id) {
                    return Ok(Some((rule, a.device_id)));
                }
            }
            if alerts.len() < PAGE {
                break;
            }
            skip += PAGE;
        }
    }
    Ok(None)
}

/// Starts the package's controller if none runs, and has it judge now.
pub(crate) async fn start(controllers: &crate::keyed::Keyed<RolloutController>, id: u64) {
    match controllers.actor(id).await {
        Ok(a) => {
            let _ = a.cast(Envelope::cast(RolloutMsg::Tick));
        }
        Err(e) => tracing::warn!(deployment = id, error = %e, "rollout controller did not start"),
    }
}

/// Whether a controller has work for the rollout: running with its package active, or a
/// failed gate's notice owed (what `tick` keeps a controller for).
fn has_work(store: &Store, id: u64) -> Result<bool> {
    let Some(r) = store.rollout(id)? else {
        return Ok(false);
    };
    // A deleted organization's rollout has none (`tick` stops its controller).
    if store.project_retired(r.project_id) {
        return Ok(false);
    }
    let Some(d) = store.deployment(r.project_id, id)? else {
        return Ok(false);
    };
    Ok(r.notice_owed.is_some()
        || (d.status == DeploymentStatus::Active
            && (r.state == RolloutState::Running
                || (r.late_owed && r.state == RolloutState::Completed))))
}
