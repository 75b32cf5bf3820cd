//! RolloutController: one per phased rollout a controller still has work for (running,
//! paused, or with a failed gate's notice owed), under a keyed supervisor. It holds no state
//! of its own: every tick it reads the rollout, judges the current phase's gate (failure rate,
//! gate rules fired on the devices the rollout has reached, the phase's wait) and sends its
//! verdict to the project's actor, the rollout's single writer, which records it durably as a
//! decision. A restart (a panic, a kill -9) continues exactly where the stored rollout stands.
//! A failed gate's notice goes to the gate rules' integrations until sent.

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
use crate::project::ProjectMsg;
use crate::project::handle::ProjectsHandle;
use crate::rules::notifications::{AlertMessage, render};
use crate::rules::rollouts::{RolloutAction, RolloutPlan, Step, gate};

pub(crate) enum RolloutMsg {
    /// Judge the gate now (the interval, and a nudge after a member's action).
    Tick,
    /// Fault injection: the controller panics in its handler (supervision tests).
    #[cfg(feature = "fault-injection")]
    Panic,
}

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
}

#[derive(Default)]
pub(crate) struct RolloutActor;

impl crate::keyed::KeyedChild for RolloutActor {
    type Req = RolloutMsg;
    type Ctx = RolloutCtx;
    const KIND: &'static str = "rollout";
}

pub(crate) struct ControllerState {
    ctx: RolloutCtx,
    /// The package (its deployment id).
    id: u64,
    /// Attempts at the owed notice in this incarnation (bounded, then given up with a log).
    notice_attempts: u32,
}

/// A notice is tried at most this many times per incarnation.
const NOTICE_ATTEMPTS: u32 = 10;
/// The alerts of one gate rule read per tick at most (newest first, back to the phase's start).
const ALERTS_PER_RULE: usize = 2_000;

impl Actor for RolloutActor {
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
                Ok(false) => myself.stop(None),
                Err(e) => tracing::warn!(deployment = st.id, error = %e, "rollout tick failed"),
            },
            #[cfg(feature = "fault-injection")]
            RolloutMsg::Panic => panic!("injected fault in the rollout controller {}", st.id),
        }
        Ok(())
    }
}

impl ControllerState {
    /// One judgement; `false` when the controller has nothing left to do.
    async fn tick(&mut self) -> Result<bool> {
        let (store, id) = (self.ctx.store.clone(), self.id);
        let Some(r) = store.rollout(id)? else {
            return Ok(false);
        };
        let pid = r.project_id;
        if let Some(notice) = r.notice_owed.clone() {
            self.notify(&r, &notice).await?;
        }
        let Some(d) = store.deployment(pid, id)? else {
            return Ok(false);
        };
        if d.status != DeploymentStatus::Active || r.state != RolloutState::Running {
            let owed = store.rollout(id)?.is_some_and(|r| r.notice_owed.is_some());
            return Ok(
                owed || (d.status == DeploymentStatus::Active && r.state == RolloutState::Paused)
            );
        }
        let ctx = self.ctx.clone();
        let now = ctx.clock.now_ms();
        let from_phase = r.phase;
        let step = crate::off_thread(move || {
            let plan = RolloutPlan::of(&r)
                .ok_or_else(|| Error::Internal(format!("package {id}: plan does not parse")))?;
            let phases =
                ctx.assignments
                    .phases(&ctx.store, &d, &plan, ctx.assignments.generation())?;
            let current: HashSet<u64> = phases
                .iter()
                .filter(|(_, p)| **p == r.phase)
                .map(|(d, _)| *d)
                .collect();
            let reached: HashSet<u64> = phases
                .iter()
                .filter(|(_, p)| **p <= r.phase)
                .map(|(d, _)| *d)
                .collect();
            let failed = ctx
                .store
                .device_results(id)?
                .iter()
                .filter(|x| {
                    x.status == RolloutStatus::Failed
                        && x.reported_at >= r.phase_started_at
                        && current.contains(&x.device_id)
                })
                .count();
            let fired = fired(&ctx.store, pid, &plan, r.phase_started_at, &reached)?;
            Ok(gate(&plan, &r, now, current.len(), failed, fired))
        })
        .await?;
        if step != Step::Wait {
            self.ctx
                .projects
                .write(pid, |reply| ProjectMsg::Rollout {
                    id,
                    action: RolloutAction::Step {
                        from_phase,
                        step: step.clone(),
                    },
                    reply,
                })
                .await?;
            if matches!(step, Step::Complete) {
                let owed = store.rollout(id)?.is_some_and(|r| r.notice_owed.is_some());
                return Ok(owed);
            }
        }
        Ok(true)
    }

    /// Sends the owed notice to every integration of the gate rules, then records it sent.
    async fn notify(
        &mut self,
        r: &fleetops_storage::rollouts::Rollout,
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
        let now = self.ctx.clock.now_ms();
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
            dedup_key: format!("fleetops-rollout-{id}-{}", r.decisions.len()),
            related_deployment: None,
        };
        let mut all_sent = true;
        for iid in integrations {
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
            if let Err(e) = self.ctx.sender.send(&out).await {
                all_sent = false;
                tracing::warn!(
                    deployment = id,
                    integration = iid,
                    error = e.message(),
                    "rollout notice not delivered"
                );
            }
        }
        self.notice_attempts += 1;
        if !all_sent && self.notice_attempts < NOTICE_ATTEMPTS {
            return Ok(());
        }
        if !all_sent {
            tracing::error!(
                deployment = id,
                "rollout notice given up after {NOTICE_ATTEMPTS} attempts"
            );
        }
        self.ctx
            .projects
            .write(pid, |reply| ProjectMsg::Rollout {
                id,
                action: RolloutAction::NoticeSent,
                reply,
            })
            .await?;
        self.notice_attempts = 0;
        Ok(())
    }
}

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
            let (alerts, _) = store.alerts_page(pid, None, Some(rule), skip, PAGE)?;
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
