//! The ProjectActor's state changes for deployment packages: create, edit drafts, the
//! transitions, and devices' rollout results.

use super::ProjectState;
use crate::clock::now_ms;
use crate::error::Error;
use crate::error::Result;
use crate::rules::deployments::DeploymentPatch;
use crate::rules::deployments::DeploymentSpec;
use crate::rules::deployments::Transition;
use crate::rules::deployments::evaluate;
use crate::rules::rollouts::{self, RolloutAction, RolloutPlan};
use fleetops_storage::Deployment;
use fleetops_storage::DeploymentStatus;
use fleetops_storage::DeviceResult;
use fleetops_storage::RolloutStatus;
use fleetops_storage::UpdateState;
use fleetops_storage::accounts::Seq;
use fleetops_storage::pipeline::rollouts::{DeviceProgress, Rollout};

impl ProjectState {
    pub(super) fn deployment(&self, id: u64) -> Result<Deployment> {
        self.store
            .deployment(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Deployment"))
    }

    /// Checks `spec` in full; the first 422, else every 409, refuses it. Returns the
    /// normalized targets and the phase plan as kept, if one was given.
    pub(super) fn checked(&self, spec: &DeploymentSpec) -> Result<(Vec<u8>, Option<Vec<u8>>)> {
        let e = evaluate(&self.store, self.pid(), spec)?;
        let targets = e.targets_json.clone();
        let plan = e.rollout_json.clone();
        match e.into_error() {
            Some(err) => Err(err),
            None => Ok((targets, plan)),
        }
    }

    pub(super) fn create_deployment(&self, spec: DeploymentSpec) -> Result<Deployment> {
        let (targets, plan) = self.checked(&spec)?;
        let now = now_ms();
        let d = Deployment {
            id: self.store.new_id(Seq::Deployment)?,
            project_id: self.pid(),
            name: spec.name.trim().to_string(),
            description: spec.description,
            composition_tag: spec.composition_tag,
            capsule_id: spec.capsule_id,
            configuration_id: spec.configuration_id,
            status: DeploymentStatus::Draft,
            deployed_at: None,
            deprecated_at: None,
            target_devices_json: targets,
            created_at: now,
            updated_at: now,
        };
        let rollout = plan.map(|p| rollouts::planned(d.id, d.project_id, p));
        self.store
            .put_deployment_with_rollout(&d, rollout.as_ref())?;
        Ok(d)
    }

    pub(super) fn draft(&self, id: u64, action: &str) -> Result<Deployment> {
        let d = self.deployment(id)?;
        if d.status != DeploymentStatus::Draft {
            return Err(Error::Conflict(format!(
                "Deployment is {}; only a draft can be {action}",
                d.status
            )));
        }
        Ok(d)
    }

    pub(super) fn update_deployment(&self, id: u64, patch: DeploymentPatch) -> Result<Deployment> {
        let mut d = self.deployment(id)?;
        let mut spec = DeploymentSpec::of(&d);
        let new_plan = patch.rollout.clone();
        spec.apply(patch);
        // Order of checks: input (422) before state (409).
        let e = evaluate(&self.store, self.pid(), &spec)?;
        if let Some(b) = e.blockers.iter().find(|b| b.status == 422) {
            return Err(Error::unprocessable(&b.field, &b.reason));
        }
        d = self.draft(id, "changed")?;
        let (targets, plan) = self.checked(&spec)?;
        d.name = spec.name.trim().to_string();
        d.description = spec.description;
        d.composition_tag = spec.composition_tag;
        d.capsule_id = spec.capsule_id;
        d.configuration_id = spec.configuration_id;
        d.target_devices_json = targets;
        d.updated_at = now_ms();
        match new_plan {
            None => self.store.put_deployment(&d)?,
            Some(_) => {
                let rollout = plan.map(|p| rollouts::planned(d.id, d.project_id, p));
                self.store
                    .put_deployment_with_rollout(&d, rollout.as_ref())?
            }
        }
        Ok(d)
    }

    pub(super) fn delete_deployment(&self, id: u64) -> Result<()> {
        let d = self.draft(id, "deleted")?;
        Ok(self.store.delete_deployment(&d)?)
    }

    /// draft → active (`activate`, sets `deployed_at`), active → deprecated (`deprecate`,
    /// sets `deprecated_at`); anything else is 409.
    pub(super) fn transition(&self, id: u64, to: Transition) -> Result<Deployment> {
        let mut d = self.deployment(id)?;
        let now = now_ms();
        match (to, d.status) {
            (Transition::Activate, DeploymentStatus::Draft) => {
                // The capsule and configuration cannot change state once settled, and
                // references keep them from being deleted; checked again all the same.
                let e = evaluate(&self.store, self.pid(), &DeploymentSpec::of(&d))?;
                if let Some(err) = e.into_error() {
                    return Err(match err {
                        Error::Unprocessable(m) => Error::Conflict(m),
                        other => other,
                    });
                }
                self.check_policy(&d)?;
                d.status = DeploymentStatus::Active;
                d.deployed_at = Some(now);
                if let Some(mut r) = self.store.rollout(id)? {
                    let plan = RolloutPlan::of(&r).ok_or_else(|| {
                        Error::Internal(format!("package {id}: its rollout plan does not parse"))
                    })?;
                    rollouts::start(&mut r, &plan, now);
                    d.updated_at = now;
                    self.store.put_deployment_with_rollout(&d, Some(&r))?;
                    return Ok(d);
                }
            }
            (Transition::Deprecate, DeploymentStatus::Active) => {
                d.status = DeploymentStatus::Deprecated;
                d.deprecated_at = Some(now);
                // Its rollout ends with it, recorded in the same batch.
                if let Some(mut r) = self.store.rollout(id)?
                    && matches!(
                        r.state,
                        fleetops_storage::RolloutState::Running
                            | fleetops_storage::RolloutState::Paused
                    )
                {
                    r.state = fleetops_storage::RolloutState::Aborted;
                    r.decide(
                        now,
                        "aborted",
                        "package deprecated; its devices return to their previous package".into(),
                    );
                    d.updated_at = now;
                    self.store.put_deployment_with_rollout(&d, Some(&r))?;
                    return Ok(d);
                }
            }
            (Transition::Activate, s) => {
                return Err(Error::Conflict(format!(
                    "Deployment is {s}; only a draft can be activated"
                )));
            }
            (Transition::Deprecate, s) => {
                return Err(Error::Conflict(format!(
                    "Deployment is {s}; only an active deployment can be deprecated"
                )));
            }
        }
        d.updated_at = now;
        self.store.put_deployment(&d)?;
        Ok(d)
    }

    /// Records a device's report: its state with the package, its history and, for a final
    /// state, its rollout result, in one write. `any_state` admits the intermediate states
    /// (the device update API); the members' `device-status` route takes only the final ones.
    /// Replies with the report and, for a final one, the device's previous result.
    pub(super) fn report_rollout(
        &self,
        id: u64,
        device_id: u64,
        status: String,
        message: Option<String>,
        any_state: bool,
    ) -> Result<(DeviceProgress, Option<RolloutStatus>)> {
        let d = self.deployment(id)?;
        let state = UpdateState::parse(&status)
            .filter(|s| s.reportable() && (any_state || s.result().is_some()));
        let Some(state) = state else {
            return Err(Error::unprocessable(
                "status",
                if any_state {
                    "must be downloading, installing, rebooting, succeeded, failed, rolled_back or rollback_failed"
                } else {
                    "must be succeeded or failed"
                },
            ));
        };
        if message.as_ref().is_some_and(|m| m.chars().count() > 2000) {
            return Err(Error::unprocessable("message", "at most 2000 characters"));
        }
        if self.store.device(self.pid(), device_id)?.is_none() {
            return Err(Error::unprocessable(
                "device_id",
                format!("device {device_id} does not exist in this project"),
            ));
        }
        if d.status == DeploymentStatus::Draft {
            return Err(Error::Conflict(
                "Deployment is a draft; activate it before devices report results".into(),
            ));
        }
        let now = now_ms();
        let progress = DeviceProgress {
            deployment_id: id,
            device_id,
            state,
            message: message.clone(),
            at: now,
        };
        let result = state.result().map(|status| DeviceResult {
            deployment_id: id,
            device_id,
            status,
            message,
            reported_at: now,
        });
        let replaced = match result {
            Some(_) => self.store.device_result(id, device_id)?,
            None => None,
        };
        // A failure reported to a completed rollout is owed to its gate, in the same write.
        for _ in 0..32 {
            let late = match &result {
                Some(r)
                    if r.status == RolloutStatus::Failed
                        && d.status == DeploymentStatus::Active =>
                {
                    self.store.rollout(id)?.filter(|r| {
                        r.state == fleetops_storage::RolloutState::Completed && !r.late_owed
                    })
                }
                _ => None,
            };
            let owed = late.as_ref().map(|read| {
                let mut r = read.clone();
                r.late_owed = true;
                r
            });
            match self.store.record_update(
                self.pid(),
                &progress,
                result.as_ref(),
                replaced.as_ref(),
                owed.as_ref().zip(late.as_ref()),
            ) {
                Err(fleetops_storage::StorageError::Conflict(w)) if w == "rollout" => continue,
                other => other?,
            }
            return Ok((progress, replaced.map(|r| r.status)));
        }
        Err(Error::Unavailable {
            retry_after_secs: 1,
        })
    }

    /// Offers the package again to a device that failed it (a member's retry): 409 unless
    /// the package is active, the device's latest result with it is `failed`, its rollout was
    /// neither rolled back nor aborted, and the package is what the device should run now
    /// (its phase started, no later package supersedes it).
    pub(super) fn retry_device(&self, id: u64, device_id: u64, by: String) -> Result<u32> {
        let d = self.deployment(id)?;
        let Some(device) = self.store.device(self.pid(), device_id)? else {
            return Err(Error::not_found("Device"));
        };
        if d.status != DeploymentStatus::Active {
            return Err(Error::Conflict(format!(
                "Deployment is {}; only an active package can be offered again",
                d.status
            )));
        }
        if let Some(r) = self.store.rollout(id)?
            && matches!(
                r.state,
                fleetops_storage::RolloutState::RolledBack
                    | fleetops_storage::RolloutState::Aborted
            )
        {
            return Err(Error::Conflict(format!(
                "The rollout is {}; its devices are not offered the package again",
                r.state
            )));
        }
        let Some(read) = self
            .store
            .device_result(id, device_id)?
            .filter(|r| r.status == RolloutStatus::Failed)
        else {
            return Err(Error::Conflict(format!(
                "Device {device_id} has not failed this package; only a failed device can be retried"
            )));
        };
        let generation = self.assignments.generation(self.pid());
        if self
            .assignments
            .assigned(&self.store, &device, generation)?
            .is_none_or(|a| a.id != id)
        {
            return Err(Error::Conflict(format!(
                "Device {device_id} is not offered this package now: its phase has not started or a later package supersedes it"
            )));
        }
        let offer = self.store.retry_device(
            self.pid(),
            &read,
            format!("offered again by {by}"),
            now_ms(),
        )?;
        Ok(offer)
    }

    /// A rollout's step or a member's action on it; replies with the rollout and whether it
    /// changed. A step for a package no longer active changes nothing.
    /// Applies `action` to the stored rollout. Decided against the rollout as read: when
    /// another node changed it meanwhile, it is read and decided again (32 times at most,
    /// then 503, nothing written); a controller's step whose lease moved to another node
    /// (`fence`) is refused with 409.
    pub(super) fn rollout_action(
        &self,
        id: u64,
        action: RolloutAction,
        fence: Option<&fleetops_storage::leases::Fence>,
    ) -> Result<(Rollout, bool)> {
        let mut tries = 0;
        loop {
            match self.try_rollout_action(id, action.clone(), fence) {
                Err(Error::Conflict(what)) if what == "rollout" => {
                    if tries == 32 {
                        // Nothing written: the caller may try again.
                        return Err(Error::Unavailable {
                            retry_after_secs: 1,
                        });
                    }
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    fn try_rollout_action(
        &self,
        id: u64,
        action: RolloutAction,
        fence: Option<&fleetops_storage::leases::Fence>,
    ) -> Result<(Rollout, bool)> {
        let d = self.deployment(id)?;
        let mut r = self
            .store
            .rollout(id)?
            .ok_or_else(|| Error::not_found("Rollout"))?;
        let plan = RolloutPlan::of(&r).ok_or_else(|| {
            Error::Internal(format!("package {id}: its rollout plan does not parse"))
        })?;
        let member = !matches!(
            action,
            RolloutAction::Step { .. } | RolloutAction::NoticeSent | RolloutAction::Late { .. }
        );
        if d.status != DeploymentStatus::Active && action != RolloutAction::NoticeSent {
            if member {
                return Err(Error::Conflict(format!(
                    "Deployment is {}; only an active package's rollout can change",
                    d.status
                )));
            }
            return Ok((r, false));
        }
        // For the record: the active package activated last before this one.
        let mine = (d.deployed_at.unwrap_or(0), d.id);
        let previous = rollouts::by_activation(self.store.project_deployments(self.pid())?)
            .into_iter()
            .find(|p| p.id != id && (p.deployed_at.unwrap_or(0), p.id) < mine)
            .map(|p| p.id);
        let read = r.clone();
        let changed = rollouts::apply(&mut r, &plan, action, now_ms(), previous)?;
        if changed {
            self.store.put_rollout(&r, &read, fence)?;
        }
        Ok((r, changed))
    }

    /// A package of this project whose rollout is not over (a draft's plan, or running or
    /// paused) and whose plan `names` something: groups and gate rules it uses cannot go.
    pub(super) fn plan_naming(
        &self,
        names: impl Fn(&RolloutPlan) -> bool,
    ) -> Result<Option<(Deployment, Rollout)>> {
        for d in self.store.project_deployments(self.pid())? {
            if d.status == DeploymentStatus::Deprecated {
                continue;
            }
            let Some(r) = self.store.rollout(d.id)? else {
                continue;
            };
            let open = r.started_at.is_none()
                || matches!(
                    r.state,
                    fleetops_storage::RolloutState::Running
                        | fleetops_storage::RolloutState::Paused
                );
            if open && RolloutPlan::of(&r).is_some_and(|p| names(&p)) {
                return Ok(Some((d, r)));
            }
        }
        Ok(None)
    }

    /// The project's policy at activation: with `require_passed_test_run`, the capsule's
    /// commit must have a passed test run.
    fn check_policy(&self, d: &Deployment) -> Result<()> {
        match crate::provenance::policy_blocker(&self.store, self.pid(), d.capsule_id)? {
            Some(reason) => Err(Error::Conflict(reason)),
            None => Ok(()),
        }
    }

    pub(super) fn set_policy(
        &self,
        p: fleetops_storage::pipeline::rollouts::ProjectPolicy,
    ) -> Result<fleetops_storage::pipeline::rollouts::ProjectPolicy> {
        self.store.put_project_policy(self.pid(), &p)?;
        Ok(p)
    }
}
