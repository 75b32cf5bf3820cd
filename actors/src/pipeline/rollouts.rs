//! Phased rollouts, the handle's side: the view of a rollout (phases with their devices and
//! states, the gate decisions), members' pause/resume/abort (one message to the project's
//! actor, the rollout's writer) and the controllers' start.

use std::collections::HashMap;

use fleetops_storage::{RolloutState, UpdateState};
use serde::Serialize;

use super::PipelineHandle;
use crate::clock::fmt_ms;
use crate::error::{Error, Result};
use crate::project::PipelineMsg;
use crate::rules::rollouts::RolloutPlan;
pub use crate::rules::rollouts::{OnFailure, PhaseDevices, RolloutAction};

/// A phase lists at most this many of its devices (its counts cover all).
pub const PHASE_DEVICES_SHOWN: usize = 1000;

/// A rollout's state as shown: `planned` while its package is a draft, else the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShownState {
    Planned,
    Running,
    Paused,
    Completed,
    Aborted,
    RolledBack,
}

impl ShownState {
    pub fn of(r: &fleetops_storage::pipeline::rollouts::Rollout) -> Self {
        if r.started_at.is_none() {
            return ShownState::Planned;
        }
        match r.state {
            RolloutState::Running => ShownState::Running,
            RolloutState::Paused => ShownState::Paused,
            RolloutState::Completed => ShownState::Completed,
            RolloutState::Aborted => ShownState::Aborted,
            RolloutState::RolledBack => ShownState::RolledBack,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ShownState::Planned => "planned",
            ShownState::Running => "running",
            ShownState::Paused => "paused",
            ShownState::Completed => "completed",
            ShownState::Aborted => "aborted",
            ShownState::RolledBack => "rolled_back",
        }
    }
}

/// `GET /deployments/{id}/rollout`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RolloutView {
    pub deployment_id: u64,
    pub state: ShownState,
    /// `None` until the package is activated.
    pub started_at: Option<String>,
    /// The phase under way (or where it stopped).
    pub current_phase: Option<String>,
    pub on_failure: OnFailure,
    pub gate_alert_rule_ids: Vec<u64>,
    pub phases: Vec<PhaseView>,
    /// Oldest first: every start, pass, pause, resume, abort and rollback, with its reason.
    pub decisions: Vec<DecisionView>,
    /// A failed gate's notice not yet delivered to the gate rules' integrations.
    pub notice_owed: bool,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PhaseView {
    pub name: String,
    pub devices_rule: PhaseDevices,
    pub min_wait_seconds: u64,
    pub max_failure_rate: f64,
    /// As given, or its default (1, or `1 - max_failure_rate` when that is given).
    pub min_success_rate: f64,
    /// As given, or its default.
    pub report_timeout_seconds: u64,
    /// pending, in_progress, passed, paused, aborted, rolled_back.
    pub status: &'static str,
    pub started_at: Option<String>,
    pub device_count: usize,
    /// Devices whose latest result is `failed`, over the phase's devices.
    pub failure_rate: f64,
    pub counts: PhaseCounts,
    /// At most [`PHASE_DEVICES_SHOWN`], by id.
    pub devices: Vec<PhaseDevice>,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct PhaseCounts {
    /// No report yet.
    pub waiting: usize,
    pub downloading: usize,
    pub installing: usize,
    pub rebooting: usize,
    pub succeeded: usize,
    pub failed: usize,
    /// Failed, then put back by the robot's rollback hook.
    pub rolled_back: usize,
    /// Failed, and the rollback hook failed too.
    pub rollback_failed: usize,
    /// Offered again by a member after a failure; no report since.
    pub retrying: usize,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PhaseDevice {
    pub id: u64,
    pub name: String,
    pub state: Option<UpdateState>,
    pub reported_at: Option<String>,
    /// The message of its latest report (a failure's or a rollback's words), if any.
    pub message: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DecisionView {
    pub at: String,
    pub phase: String,
    pub action: String,
    pub reason: String,
}

impl PipelineHandle {
    /// Starts the controllers of every rollout with work left that has none (start-up, and
    /// every housekeeping pass).
    pub(crate) async fn resume_rollouts(&self) -> Result<()> {
        let me = self.clone();
        for r in crate::off_thread(move || Ok(me.store.open_rollouts()?)).await? {
            if self.store.project_retired(r.project_id) {
                continue;
            }
            if self.controllers.running(r.deployment_id).is_none() {
                self.start_controller(r.deployment_id).await;
            }
        }
        Ok(())
    }

    /// Starts the package's controller if it is not running, and has it judge now.
    pub(crate) async fn start_controller(&self, id: u64) {
        if self.bus.is_shared() {
            self.bus.publish(
                crate::pipeline::controller::SUBJECT.into(),
                &id.to_be_bytes(),
            );
        }
        crate::pipeline::controller::start(&self.controllers, id).await;
    }

    /// Holds the package's next controller to find nothing to do, before it
    /// leaves the registry, until the returned `Notify` is notified; the flag says it got
    /// there (tests of a resume racing a stopping controller).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_rollout_stop_hold(
        &self,
        id: u64,
    ) -> Result<(
        std::sync::Arc<tokio::sync::Notify>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    )> {
        let (release, reached) = (std::sync::Arc::default(), std::sync::Arc::default());
        self.rollout_stop_holds.insert(
            id,
            (
                std::sync::Arc::clone(&release),
                std::sync::Arc::clone(&reached),
            ),
        );
        Ok((release, reached))
    }

    /// Makes the package's rollout controller panic (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_rollout_panic(&self, id: u64) -> Result<()> {
        let a = self.controllers.actor(id).await?;
        a.cast(crate::mailbox::Envelope::cast(
            crate::pipeline::controller::RolloutMsg::Panic,
        ))
        .map_err(|_| Error::Unavailable {
            retry_after_secs: 1,
        })
    }

    pub async fn rollout(&self, pid: u64, id: u64) -> Result<RolloutView> {
        let me = self.clone();
        crate::off_thread(move || me.rollout_now(pid, id)).await
    }

    fn rollout_now(&self, pid: u64, id: u64) -> Result<RolloutView> {
        let d = self
            .store
            .deployment(pid, id)?
            .ok_or_else(|| Error::not_found("Deployment"))?;
        let r = self
            .store
            .rollout(id)?
            .ok_or_else(|| Error::not_found("Rollout"))?;
        let plan = RolloutPlan::of(&r).ok_or_else(|| {
            Error::Internal(format!("package {id}: its rollout plan does not parse"))
        })?;
        let phases =
            self.assignments
                .phases(&self.store, &d, &plan, self.assignments.generation(pid))?;
        let progress: HashMap<u64, (UpdateState, i64, Option<String>)> = self
            .store
            .device_progress(id)?
            .into_iter()
            .map(|p| (p.device_id, (p.state, p.at, p.message)))
            .collect();
        let failed: std::collections::HashSet<u64> = self
            .store
            .device_results(id)?
            .into_iter()
            .filter(|x| x.status == fleetops_storage::RolloutStatus::Failed)
            .map(|x| x.device_id)
            .collect();
        let names: HashMap<u64, String> = self
            .store
            .project_devices(pid)?
            .into_iter()
            .map(|d| (d.id, d.name))
            .collect();
        let mut members: Vec<Vec<u64>> = vec![Vec::new(); plan.phases.len()];
        for (dev, p) in phases.iter() {
            if let Some(m) = members.get_mut(*p as usize) {
                m.push(*dev);
            }
        }
        let started = r.started_at.is_some();
        let name_of = |i: u32| plan.phases.get(i as usize).map(|p| p.name.clone());
        let views = plan
            .phases
            .iter()
            .zip(members)
            .enumerate()
            .map(|(i, (p, mut devs))| {
                devs.sort_unstable();
                let i = i as u32;
                let status = if !started || i > r.phase {
                    "pending"
                } else if i < r.phase {
                    "passed"
                } else {
                    match r.state {
                        RolloutState::Running => "in_progress",
                        RolloutState::Paused => "paused",
                        RolloutState::Completed => "passed",
                        RolloutState::Aborted => "aborted",
                        RolloutState::RolledBack => "rolled_back",
                    }
                };
                let mut counts = PhaseCounts::default();
                for dev in &devs {
                    match progress.get(dev).map(|s| s.0) {
                        None => counts.waiting += 1,
                        Some(UpdateState::Downloading) => counts.downloading += 1,
                        Some(UpdateState::Installing) => counts.installing += 1,
                        Some(UpdateState::Rebooting) => counts.rebooting += 1,
                        Some(UpdateState::Succeeded) => counts.succeeded += 1,
                        Some(UpdateState::Failed) => counts.failed += 1,
                        Some(UpdateState::RolledBack) => counts.rolled_back += 1,
                        Some(UpdateState::RollbackFailed) => counts.rollback_failed += 1,
                        Some(UpdateState::Retrying) => counts.retrying += 1,
                    }
                }
                let failure_rate = if devs.is_empty() {
                    0.0
                } else {
                    devs.iter().filter(|d| failed.contains(d)).count() as f64 / devs.len() as f64
                };
                PhaseView {
                    name: p.name.clone(),
                    devices_rule: p.devices.clone(),
                    min_wait_seconds: p.min_wait_seconds,
                    max_failure_rate: p.max_failure_rate,
                    min_success_rate: p.success_needed(),
                    report_timeout_seconds: p.report_timeout(),
                    status,
                    started_at: r
                        .decisions
                        .iter()
                        .rev()
                        .find(|x| x.phase == i && x.action == "started")
                        .map(|x| fmt_ms(x.at)),
                    device_count: devs.len(),
                    failure_rate,
                    counts,
                    devices: devs
                        .iter()
                        .take(PHASE_DEVICES_SHOWN)
                        .map(|dev| PhaseDevice {
                            id: *dev,
                            name: names.get(dev).cloned().unwrap_or_default(),
                            state: progress.get(dev).map(|s| s.0),
                            reported_at: progress.get(dev).map(|s| fmt_ms(s.1)),
                            message: progress.get(dev).and_then(|s| s.2.clone()),
                        })
                        .collect(),
                }
            })
            .collect();
        Ok(RolloutView {
            deployment_id: id,
            state: ShownState::of(&r),
            started_at: r.started_at.map(fmt_ms),
            current_phase: started.then(|| name_of(r.phase)).flatten(),
            on_failure: plan.on_failure,
            gate_alert_rule_ids: plan.gate_alert_rule_ids.clone(),
            phases: views,
            decisions: r
                .decisions
                .iter()
                .map(|x| DecisionView {
                    at: fmt_ms(x.at),
                    phase: name_of(x.phase).unwrap_or_else(|| (x.phase + 1).to_string()),
                    action: x.action.clone(),
                    reason: x.reason.clone(),
                })
                .collect(),
            notice_owed: r.notice_owed.is_some(),
        })
    }

    /// A member's pause, resume or abort; answers the rollout as it now stands.
    pub async fn rollout_action(
        &self,
        pid: u64,
        id: u64,
        action: RolloutAction,
    ) -> Result<RolloutView> {
        let resumed = action == RolloutAction::Resume;
        self.projects
            .write(pid, |reply| PipelineMsg::Rollout {
                id,
                action: action.clone(),
                fence: None,
                reply,
            })
            .await?;
        if resumed {
            self.start_controller(id).await;
        }
        self.rollout(pid, id).await
    }
}

/// `POST .../rollout/devices/{device_id}/retry`: the device's state with the package now.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Retried {
    pub deployment_id: u64,
    pub device_id: u64,
    /// `retrying` until the device reports again.
    pub state: UpdateState,
    /// How many times the package was offered to the device again.
    pub offers: u32,
}

impl PipelineHandle {
    /// A member's retry of a device that failed the package: the package is offered to it
    /// again (a new ETag on its next poll), and its failure no longer counts against its
    /// phase, which waits for its new report.
    pub async fn retry_device(
        &self,
        pid: u64,
        id: u64,
        device_id: u64,
        by: String,
    ) -> Result<Retried> {
        let offers = self
            .projects
            .write(pid, |reply| PipelineMsg::RetryDevice {
                id,
                device_id,
                by: by.clone(),
                reply,
            })
            .await?;
        let me = self.clone();
        if crate::off_thread(move || Ok(me.store.rollout(id)?.is_some())).await? {
            self.start_controller(id).await;
        }
        Ok(Retried {
            deployment_id: id,
            device_id,
            state: UpdateState::Retrying,
            offers,
        })
    }
}

/// `GET/PATCH /policy`: the project's rollout policy.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PolicyView {
    /// Activation needs a passed test run of the capsule's commit (409 naming it otherwise).
    pub require_passed_test_run: bool,
}

impl PipelineHandle {
    pub fn policy(&self, pid: u64) -> Result<PolicyView> {
        let p = self.store.project_policy(pid)?;
        Ok(PolicyView {
            require_passed_test_run: p.require_passed_test_run,
        })
    }

    pub async fn set_policy(
        &self,
        pid: u64,
        require_passed_test_run: Option<bool>,
    ) -> Result<PolicyView> {
        let mut p = self.store.project_policy(pid)?;
        if let Some(v) = require_passed_test_run {
            p.require_passed_test_run = v;
        }
        let p = self
            .projects
            .write(pid, |reply| PipelineMsg::SetPolicy {
                policy: p.clone(),
                reply,
            })
            .await?;
        Ok(PolicyView {
            require_passed_test_run: p.require_passed_test_run,
        })
    }
}
