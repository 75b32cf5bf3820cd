//! Deployment packages, the handle's side: plan, create, edit, transitions and rollout
//! reports (each one message to the project's actor), the views and the lists. What blocks a
//! package is decided in `rules::deployments`.

use fleetops_storage::Deployment;
use serde::Serialize;
use serde_json::value::RawValue;

use super::PipelineHandle;
use crate::clock::fmt_ms;
use crate::error::{Error, Result};
pub use crate::events::RolloutEvent;
use crate::project::PipelineMsg;
pub(crate) use crate::rules::deployments::evaluate;
pub use crate::rules::deployments::{
    Blocker, DeploymentPatch, DeploymentSpec, Evaluation, MAX_TARGETS, TargetDevice, Transition,
};
use crate::views::{Page, PageReq};

/// A deployment package as returned.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeploymentView {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    pub description: Option<String>,
    pub composition_tag: String,
    pub capsule_id: u64,
    pub configuration_id: Option<u64>,
    pub deployment_status: fleetops_storage::DeploymentStatus,
    pub deployed_at: Option<String>,
    pub deprecated_at: Option<String>,
    pub target_devices: Box<RawValue>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Deployment> for DeploymentView {
    fn from(d: &Deployment) -> Self {
        Self {
            id: d.id,
            project_id: d.project_id,
            name: d.name.clone(),
            description: d.description.clone(),
            composition_tag: d.composition_tag.clone(),
            capsule_id: d.capsule_id,
            configuration_id: d.configuration_id,
            deployment_status: d.status,
            deployed_at: d.deployed_at.map(fmt_ms),
            deprecated_at: d.deprecated_at.map(fmt_ms),
            target_devices: super::raw_json(&d.target_devices_json, "[]"),
            created_at: fmt_ms(d.created_at),
            updated_at: fmt_ms(d.updated_at),
        }
    }
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct DeviceResults {
    pub succeeded: usize,
    pub failed: usize,
}

/// `GET /deployments/{id}`: the record and the devices' rollout results.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeploymentDetail {
    #[serde(flatten)]
    pub deployment: DeploymentView,
    pub device_results: DeviceResults,
    /// Each device's latest state with the package, counted (the update API's reports).
    pub device_states: DeviceStates,
    /// package → capsule → commit → the commit's test runs.
    pub provenance: crate::provenance::Provenance,
    /// The phased rollout, when the package has a plan: its state and current phase.
    pub rollout: Option<RolloutSummary>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RolloutSummary {
    pub state: super::rollouts::ShownState,
    pub current_phase: Option<String>,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct DeviceStates {
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

/// `POST /deployments/plan`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Plan {
    pub blocked: bool,
    pub blockers: Vec<Blocker>,
    pub device_count: usize,
    pub devices: Vec<TargetDevice>,
}

/// The console's rollout page ([`PipelineHandle::rollout_page`]).
pub struct RolloutPage {
    pub name: String,
    pub rollout: Option<super::rollouts::RolloutView>,
    pub blockers: Vec<Blocker>,
}

/// A device's rollout report, as accepted.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ResultAccepted {
    pub deployment_id: u64,
    pub device_id: u64,
    pub status: fleetops_storage::UpdateState,
    pub reported_at: String,
}

impl PipelineHandle {
    fn deployment(&self, pid: u64, id: u64) -> Result<Deployment> {
        self.store
            .deployment(pid, id)?
            .ok_or_else(|| Error::not_found("Deployment"))
    }

    pub async fn create_deployment(
        &self,
        pid: u64,
        spec: DeploymentSpec,
    ) -> Result<DeploymentView> {
        let d = self
            .projects
            .write(pid, |reply| PipelineMsg::CreateDeployment {
                spec: Box::new(spec.clone()),
                reply,
            })
            .await?;
        Ok(DeploymentView::from(&d))
    }

    /// Evaluates a body without creating anything; the project's activation policy is
    /// listed as a blocker too (it refuses activation, not creation).
    pub fn plan(&self, pid: u64, spec: &DeploymentSpec) -> Result<Plan> {
        let mut e = evaluate(&self.store, pid, spec)?;
        if self.store.capsule(pid, spec.capsule_id)?.is_some()
            && let Some(reason) =
                crate::provenance::policy_blocker(&self.store, pid, spec.capsule_id)?
        {
            e.blockers.push(Blocker {
                status: 409,
                field: "capsule_id".into(),
                reason,
            });
        }
        Ok(Plan {
            blocked: !e.blockers.is_empty(),
            blockers: e.blockers,
            device_count: e.devices.len(),
            devices: e.devices,
        })
    }

    /// What the console's rollout page shows of a deployment: its name, its rollout (none
    /// without a plan) and, for a draft, what would block its activation now (its own checks
    /// and the project's policy). The draft's plan reads the project's devices, so it runs off
    /// the runtime's threads.
    pub async fn rollout_page(&self, pid: u64, id: u64) -> Result<RolloutPage> {
        let me = self.clone();
        let (name, blockers) = crate::off_thread(move || {
            let d = me.deployment(pid, id)?;
            let blockers = if d.status == fleetops_storage::DeploymentStatus::Draft {
                me.plan(pid, &DeploymentSpec::of(&d))?.blockers
            } else {
                Vec::new()
            };
            Ok((d.name, blockers))
        })
        .await?;
        let rollout = match self.rollout(pid, id).await {
            Ok(r) => Some(r),
            Err(Error::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(RolloutPage {
            name,
            rollout,
            blockers,
        })
    }

    pub async fn deployments(
        &self,
        pid: u64,
        status: Option<fleetops_storage::DeploymentStatus>,
        page: PageReq,
    ) -> Result<Page<DeploymentView>> {
        let me = self.clone();
        crate::off_thread(move || me.deployments_now(pid, status, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn deployments_now(
        &self,
        pid: u64,
        status: Option<fleetops_storage::DeploymentStatus>,
        page: PageReq,
    ) -> Result<Page<DeploymentView>> {
        let (deployments, total) =
            self.store
                .deployments_page(pid, status, page.skip(), page.page_size)?;
        Ok(page.of(
            deployments.iter().map(DeploymentView::from).collect(),
            total,
        ))
    }

    pub fn deployment_detail(&self, pid: u64, id: u64) -> Result<DeploymentDetail> {
        let d = self.deployment(pid, id)?;
        let mut results = DeviceResults::default();
        for r in self.store.device_results(id)? {
            match r.status {
                fleetops_storage::RolloutStatus::Succeeded => results.succeeded += 1,
                fleetops_storage::RolloutStatus::Failed => results.failed += 1,
            }
        }
        let mut states = DeviceStates::default();
        for p in self.store.device_progress(id)? {
            use fleetops_storage::UpdateState as S;
            *match p.state {
                S::Downloading => &mut states.downloading,
                S::Installing => &mut states.installing,
                S::Rebooting => &mut states.rebooting,
                S::Succeeded => &mut states.succeeded,
                S::Failed => &mut states.failed,
                S::RolledBack => &mut states.rolled_back,
                S::RollbackFailed => &mut states.rollback_failed,
                S::Retrying => &mut states.retrying,
            } += 1;
        }
        let rollout = self.store.rollout(id)?.map(|r| RolloutSummary {
            state: super::rollouts::ShownState::of(&r),
            current_phase: r.started_at.and_then(|_| {
                crate::rules::rollouts::RolloutPlan::of(&r)
                    .and_then(|p| p.phases.get(r.phase as usize).map(|p| p.name.clone()))
            }),
        });
        Ok(DeploymentDetail {
            provenance: crate::provenance::of_package(&self.store, &d)?,
            rollout,
            deployment: DeploymentView::from(&d),
            device_results: results,
            device_states: states,
        })
    }

    pub async fn update_deployment(
        &self,
        pid: u64,
        id: u64,
        patch: DeploymentPatch,
    ) -> Result<DeploymentView> {
        let d = self
            .projects
            .write(pid, |reply| PipelineMsg::UpdateDeployment {
                id,
                patch: Box::new(patch.clone()),
                reply,
            })
            .await?;
        Ok(DeploymentView::from(&d))
    }

    pub async fn delete_deployment(&self, pid: u64, id: u64) -> Result<()> {
        self.projects
            .write(pid, |reply| PipelineMsg::DeleteDeployment { id, reply })
            .await
    }

    pub async fn transition(&self, pid: u64, id: u64, to: Transition) -> Result<DeploymentView> {
        let d = self
            .projects
            .write(pid, |reply| PipelineMsg::TransitionDeployment {
                id,
                to,
                reply,
            })
            .await?;
        // An activated package with a phase plan gets its controller.
        if matches!(to, Transition::Activate) && self.store.rollout(id)?.is_some() {
            self.start_controller(id).await;
        }
        Ok(DeploymentView::from(&d))
    }

    /// Records a device's rollout result (202 once durable); the project's actor publishes it
    /// on the rollout channel once it is on disk.
    pub async fn report(
        &self,
        pid: u64,
        id: u64,
        device_id: u64,
        status: String,
        message: Option<String>,
        any_state: bool,
    ) -> Result<ResultAccepted> {
        let r = self
            .projects
            .write(pid, |reply| PipelineMsg::ReportRollout {
                id,
                device_id,
                status: status.clone(),
                message: message.clone(),
                any_state,
                reply,
            })
            .await?;
        // A failure a completed rollout owes its gate: its controller judges it now.
        if r.state == fleetops_storage::UpdateState::Failed {
            let me = self.clone();
            let late = crate::off_thread(move || Ok(me.store.rollout(id)?))
                .await
                .ok()
                .flatten()
                .is_some_and(|r| r.late_owed);
            if late {
                self.start_controller(id).await;
            }
        }
        Ok(ResultAccepted {
            deployment_id: id,
            device_id,
            status: r.state,
            reported_at: fmt_ms(r.at),
        })
    }

    /// The rollout events, for the alert evaluator.
    pub fn subscribe_rollouts(&self) -> tokio::sync::broadcast::Receiver<RolloutEvent> {
        self.rollouts.subscribe()
    }
}
