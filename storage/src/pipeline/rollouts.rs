//! Device updates: where each device stands with a package (the intermediate states a robot
//! passes through and the final result), each device's report history, phased rollout plans
//! with their durable decisions, capsule provenance and the project's rollout policy.
//!
//! These are separate records next to the packages and capsules they describe, so the layout
//! of those records is unchanged.

use serde::{Deserialize, Serialize};

use crate::{DeviceResult, Result, RolloutState, RolloutStatus, Store, UpdateState, Writes, keys};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Failures reported before this moment were accepted by a member's resume (or came
    /// before the activation): no gate counts them again. Set at activation and at each
    /// resume.
    pub accepted_before: i64,
    /// A device of a finished phase reported a failure that no gate judged yet (written with
    /// the report, so a crash before the controller looked loses nothing).
    pub late_owed: bool,
}

/// The layout of a rollout record before `accepted_before` and `late_owed`: read, never
/// written.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct RolloutV1 {
    deployment_id: u64,
    project_id: u64,
    plan_json: Vec<u8>,
    state: RolloutState,
    phase: u32,
    started_at: Option<i64>,
    phase_started_at: i64,
    rolled_back_to: Option<u64>,
    decisions: Vec<Decision>,
    notice_owed: Option<String>,
}

impl From<RolloutV1> for Rollout {
    fn from(r: RolloutV1) -> Self {
        // The last resume accepted the failures before it; without one, the activation.
        let accepted_before = r
            .decisions
            .iter()
            .rev()
            .find(|d| d.action == "resumed")
            .map(|d| d.at)
            .or(r.started_at)
            .unwrap_or(0);
        Rollout {
            deployment_id: r.deployment_id,
            project_id: r.project_id,
            plan_json: r.plan_json,
            state: r.state,
            phase: r.phase,
            started_at: r.started_at,
            phase_started_at: r.phase_started_at,
            rolled_back_to: r.rolled_back_to,
            decisions: r.decisions,
            notice_owed: r.notice_owed,
            accepted_before,
            late_owed: false,
        }
    }
}

/// A stored rollout in either layout (postcard reads fields in order, so an older record
/// runs out of bytes as the current layout and is read as the older one).
fn decode_rollout(bytes: &[u8]) -> Result<Rollout> {
    crate::codec::decode::<Rollout>(bytes)
        .or_else(|_| crate::codec::decode::<RolloutV1>(bytes).map(Rollout::from))
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

/// A result as the time index holds it ([`Store::recent_results`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecentResult {
    pub deployment_id: u64,
    pub device_id: u64,
    pub reported_at: i64,
    pub status: RolloutStatus,
}

/// The time index's entry of a result, key and value: the value is its status, so a read
/// of recent results reads no record.
fn by_time_entry(project: u64, r: &DeviceResult) -> Result<(Vec<u8>, Vec<u8>)> {
    Ok((
        keys::result_by_time(project, r.reported_at, r.deployment_id, r.device_id),
        crate::codec::encode(&r.status)?,
    ))
}

impl Store {
    /// Records a device's report on a package: its latest state, an entry in its history
    /// (pruned to [`MAX_HISTORY`]) and, for a final state, its rollout result, in one batch.
    /// `project` is the package's project: a result is also indexed by time in it
    /// ([`Store::recent_results`]); `replaced` is the device's result for the package as
    /// stored now (the caller, the project's actor, reads it anyway and is the one writer of
    /// its packages' results), whose entry goes.
    ///
    /// `rollout`, `(changed, as read)`, writes the package's rollout in the same batch, while
    /// it is still as read (a late failure owed to a finished rollout's gate).
    pub fn record_update(
        &self,
        project: u64,
        p: &DeviceProgress,
        result: Option<&DeviceResult>,
        replaced: Option<&DeviceResult>,
        rollout: Option<(&Rollout, &Rollout)>,
    ) -> Result<()> {
        let mut w = Writes::new();
        if let Some((r, read)) = rollout {
            let read = read.clone();
            w.guard(keys::rollout(r.deployment_id), "rollout", move |v| {
                v.and_then(|v| decode_rollout(v).ok()).as_ref() == Some(&read)
            });
            w.put(keys::rollout(r.deployment_id), r)?;
        }
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
            if let Some(old) = replaced {
                w.delete(keys::result_by_time(
                    project,
                    old.reported_at,
                    old.deployment_id,
                    old.device_id,
                ));
            }
            w.put(keys::device_result(r.deployment_id, r.device_id), r)?;
            let (k, v) = by_time_entry(project, r)?;
            w.0.insert(k, v);
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

    /// Offers a package again to a device whose result with it is `failed` (as `read`): its
    /// result goes (so no gate counts it), its state becomes `retrying` with an entry in its
    /// history, and its offer count moves on (the device update API's ETag names it, so the
    /// robot sees a new answer). Refused with [`StorageError::Conflict`]`("result")` when the
    /// result changed meanwhile. Returns the new offer count.
    pub fn retry_device(
        &self,
        project: u64,
        read: &DeviceResult,
        message: String,
        at: i64,
    ) -> Result<u32> {
        let (dep, dev) = (read.deployment_id, read.device_id);
        let offer = self.device_offer(dep, dev)?.saturating_add(1);
        // With the time it was offered: its report timeout runs from then.
        let record: (u32, i64) = (offer, at);
        let mut w = Writes::new();
        w.guard_record(keys::device_result(dep, dev), read, "result");
        w.delete(keys::device_result(dep, dev));
        w.delete(keys::result_by_time(project, read.reported_at, dep, dev));
        w.put(keys::device_offer(dep, dev), &record)?;
        let p = DeviceProgress {
            deployment_id: dep,
            device_id: dev,
            state: UpdateState::Retrying,
            message: Some(message),
            at,
        };
        w.put(keys::device_progress(dep, dev), &p)?;
        let state = UpdateState::ALL
            .iter()
            .position(|s| *s == p.state)
            .unwrap_or(0) as u8;
        w.put(
            keys::device_history(dev, at, dep, state),
            &HistoryEntry {
                deployment_id: dep,
                state: p.state,
                message: p.message.clone(),
                at,
            },
        )?;
        self.apply(w)?;
        Ok(offer)
    }

    /// How many times the package was offered again to the device (0: never).
    pub fn device_offer(&self, deployment: u64, device: u64) -> Result<u32> {
        Ok(self.offered(deployment, device)?.map_or(0, |(n, _)| n))
    }

    /// When the package was last offered again to the device (`None`: never).
    pub fn device_offered_at(&self, deployment: u64, device: u64) -> Result<Option<i64>> {
        Ok(self.offered(deployment, device)?.map(|(_, at)| at))
    }

    fn offered(&self, deployment: u64, device: u64) -> Result<Option<(u32, i64)>> {
        self.get(&keys::device_offer(deployment, device))
    }

    /// The project's rollout results reported at `since` or later, oldest first, from the
    /// time index alone (an entry carries its status): no record is read, and each costs a
    /// few dozen bytes, whatever the results' messages.
    pub fn recent_results(&self, project: u64, since: i64) -> Result<Vec<RecentResult>> {
        let prefix = keys::result_by_time_prefix(project);
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .range(keys::result_by_time_from(project, since)..)
        {
            let (k, v) = kv?;
            let Some(rest) = k.strip_prefix(prefix.as_slice()) else {
                break;
            };
            // `{at}/{deployment}/{device}`, each 8 bytes.
            let id = |at: usize| {
                rest.get(at..at + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
            };
            let (Some(at), Some(deployment_id), Some(device_id)) = (id(0), id(9), id(18)) else {
                continue;
            };
            out.push(RecentResult {
                deployment_id,
                device_id,
                reported_at: i64::try_from(at).unwrap_or(i64::MAX),
                status: crate::codec::decode(&v)?,
            });
        }
        Ok(out)
    }

    /// Indexes by time the rollout results stored before the index existed, once per data
    /// directory.
    pub fn backfill_results_by_time(&self) -> Result<()> {
        self.once("ix_results_by_time_v1", || {
            let mut project_of = std::collections::HashMap::new();
            for kv in self
                .inner
                .records
                .scan_prefix(keys::all_deployments_prefix())
            {
                let (_, v) = kv?;
                let d: crate::Deployment = crate::codec::decode(&v)?;
                project_of.insert(d.id, d.project_id);
            }
            // In batches of bounded size; entries written before a crash are written again.
            let (mut batch, mut held) = (crate::engine::Batch::default(), 0);
            for kv in self
                .inner
                .records
                .scan_prefix(keys::all_device_results_prefix())
            {
                let (_, v) = kv?;
                let r: DeviceResult = crate::codec::decode(&v)?;
                if let Some(&p) = project_of.get(&r.deployment_id) {
                    let (k, v) = by_time_entry(p, &r)?;
                    batch.insert(k, v);
                    held += 1;
                }
                if held == 10_000 {
                    self.inner.records.apply_batch(std::mem::take(&mut batch))?;
                    held = 0;
                }
            }
            self.inner.records.apply_batch(batch)
        })
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
        match self.inner.records.get(keys::rollout(deployment))? {
            Some(v) => decode_rollout(&v).map(Some),
            None => Ok(None),
        }
    }

    /// Writes a rollout changed from `read`, while the stored one is still `read` (another
    /// server changed it meanwhile: [`StorageError::Conflict`]`("rollout")`, and the caller
    /// reads it again), and, for a controller's decision, while its lease is still its own
    /// (`fence`; [`StorageError::Conflict`]`("lease")` otherwise).
    pub fn put_rollout(
        &self,
        r: &Rollout,
        read: &Rollout,
        fence: Option<&crate::leases::Fence>,
    ) -> Result<()> {
        let mut w = Writes::new();
        let read = read.clone();
        w.guard(keys::rollout(r.deployment_id), "rollout", move |v| {
            v.and_then(|v| decode_rollout(v).ok()).as_ref() == Some(&read)
        });
        if let Some(f) = fence {
            w.fence(f);
        }
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

    /// Every rollout a controller still has work for: running, with a notice owed, or with a
    /// late failure to judge (the controllers at start-up; a paused one waits for its resume).
    pub fn open_rollouts(&self) -> Result<Vec<Rollout>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(keys::rollout_prefix()).rev() {
            let r = decode_rollout(&kv?.1)?;
            if r.started_at.is_some()
                && (r.state == RolloutState::Running || r.notice_owed.is_some() || r.late_owed)
            {
                out.push(r);
            }
        }
        Ok(out)
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

#[cfg(test)]
mod tests;
