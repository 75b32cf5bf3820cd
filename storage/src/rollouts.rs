//! Device updates: where each device stands with a package (the intermediate states a robot
//! passes through and the final result), each device's report history, phased rollout plans
//! with their durable decisions, capsule provenance and the project's rollout policy.
//!
//! These are separate records next to the packages and capsules they describe, so the layout
//! of those records is unchanged.

use serde::{Deserialize, Serialize};

use crate::{DeviceResult, Result, RolloutState, Store, UpdateState, Writes, keys};

/// A device's latest state with one package.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceProgress {
    pub deployment_id: u64,
    pub device_id: u64,
    pub state: UpdateState,
    pub message: Option<String>,
    pub at: i64,
}

/// One report in a device's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub deployment_id: u64,
    pub state: UpdateState,
    pub message: Option<String>,
    pub at: i64,
}

/// A device's history keeps its newest reports, at most this many.
pub const MAX_HISTORY: usize = 500;

/// One decision of a rollout's controller (or of a member): durable, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decision {
    pub at: i64,
    /// The phase it concerns (0-based).
    pub phase: u32,
    /// started, paused, resumed, aborted, rolled_back, completed.
    pub action: String,
    pub reason: String,
}

/// A rollout keeps its newest decisions, at most this many.
pub const MAX_DECISIONS: usize = 200;

/// A phased rollout of a package. The plan is kept as the JSON the package was created with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rollout {
    pub deployment_id: u64,
    pub project_id: u64,
    /// `{phases, gate_alert_rule_ids, on_failure}` as JSON bytes.
    pub plan_json: Vec<u8>,
    pub state: RolloutState,
    /// The last phase started (0-based); meaningful once `started_at` is set.
    pub phase: u32,
    /// When the package was activated (`None` while it is a draft).
    pub started_at: Option<i64>,
    /// When `phase` started.
    pub phase_started_at: i64,
    /// The package the devices went back to when it was rolled back.
    pub rolled_back_to: Option<u64>,
    pub decisions: Vec<Decision>,
    /// A failed gate's notice to the gate rules' integrations, owed until sent (so a crash
    /// between the decision and the notice sends it after the restart).
    pub notice_owed: Option<String>,
}

impl Rollout {
    /// Appends a decision, dropping the oldest past [`MAX_DECISIONS`].
    pub fn decide(&mut self, at: i64, action: &str, reason: String) {
        if self.decisions.len() >= MAX_DECISIONS {
            self.decisions.remove(0);
        }
        self.decisions.push(Decision {
            at,
            phase: self.phase,
            action: action.into(),
            reason,
        });
    }
}

/// Where a capsule's code came from, as declared at `upload-url`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CapsuleSource {
    pub repository: String,
    pub commit_sha: String,
}

/// A project's rollout policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProjectPolicy {
    /// Activation needs a passed test run of the capsule's commit.
    pub require_passed_test_run: bool,
}

impl Store {
    /// Records a device's report on a package: its latest state, an entry in its history
    /// (pruned to [`MAX_HISTORY`]) and, for a final state, its rollout result, in one batch.
    pub fn record_update(&self, p: &DeviceProgress, result: Option<&DeviceResult>) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::device_progress(p.deployment_id, p.device_id), p)?;
        let state = UpdateState::ALL
            .iter()
            .position(|s| *s == p.state)
            .unwrap_or(0) as u8;
        w.put(
            keys::device_history(p.device_id, p.at, p.deployment_id, state),
            &HistoryEntry {
                deployment_id: p.deployment_id,
                state: p.state,
                message: p.message.clone(),
                at: p.at,
            },
        )?;
        if let Some(r) = result {
            w.put(keys::device_result(r.deployment_id, r.device_id), r)?;
        }
        // Oldest first: drop what is over the bound once this entry is in.
        let prefix = keys::device_history_prefix(p.device_id);
        let held = self.inner.records.scan_prefix(&prefix).keys().count();
        if held >= MAX_HISTORY {
            for k in self
                .inner
                .records
                .scan_prefix(&prefix)
                .keys()
                .take(held + 1 - MAX_HISTORY)
            {
                w.delete(k?.to_vec());
            }
        }
        self.apply(w)
    }

    /// Every device's latest state with a package, by device id.
    pub fn device_progress(&self, deployment: u64) -> Result<Vec<DeviceProgress>> {
        let mut v: Vec<DeviceProgress> =
            self.scan_rev(&keys::device_progress_prefix(deployment))?;
        v.reverse();
        Ok(v)
    }

    pub fn device_progress_of(
        &self,
        deployment: u64,
        device: u64,
    ) -> Result<Option<DeviceProgress>> {
        self.get(&keys::device_progress(deployment, device))
    }

    /// A device's reports, newest first.
    pub fn device_history(&self, device: u64) -> Result<Vec<HistoryEntry>> {
        self.scan_rev(&keys::device_history_prefix(device))
    }

    pub fn rollout(&self, deployment: u64) -> Result<Option<Rollout>> {
        self.get(&keys::rollout(deployment))
    }

    pub fn put_rollout(&self, r: &Rollout) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::rollout(r.deployment_id), r)?;
        self.apply(w)
    }

    /// A package and its rollout plan in one batch: `Some` writes the plan, `None` removes any.
    pub fn put_deployment_with_rollout(
        &self,
        d: &crate::Deployment,
        r: Option<&Rollout>,
    ) -> Result<()> {
        let mut w = Writes::new();
        w.put_listed(keys::deployment(d.project_id, d.id), d)?;
        match r {
            Some(r) => w.put(keys::rollout(d.id), r)?,
            None => w.delete(keys::rollout(d.id)),
        }
        self.apply(w)
    }

    /// Every rollout a controller still has work for: running, or with a notice owed (the
    /// controllers at start-up; a paused one waits for its resume).
    pub fn open_rollouts(&self) -> Result<Vec<Rollout>> {
        let all: Vec<Rollout> = self.scan_rev(&keys::rollout_prefix())?;
        Ok(all
            .into_iter()
            .filter(|r| {
                r.started_at.is_some()
                    && (r.state == RolloutState::Running || r.notice_owed.is_some())
            })
            .collect())
    }

    pub fn capsule_source(&self, capsule: u64) -> Result<Option<CapsuleSource>> {
        self.get(&keys::capsule_source(capsule))
    }

    pub fn project_policy(&self, project: u64) -> Result<ProjectPolicy> {
        Ok(self
            .get(&keys::project_policy(project))?
            .unwrap_or_default())
    }

    pub fn put_project_policy(&self, project: u64, p: &ProjectPolicy) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::project_policy(project), p)?;
        self.apply(w)
    }
}
