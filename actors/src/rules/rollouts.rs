//! Rollout rules: the phase plan a package may carry (checked in full), which devices each
//! phase holds (stable: a hash of the device and the package orders the targets, so a pause
//! and resume never reshuffle), which package a device should run now, and the gate that
//! decides whether a phase may be followed by the next. Pure: the callers read the store.

use std::collections::HashMap;

use fleetops_storage::{Deployment, DeploymentStatus, RolloutState, pipeline::rollouts::Rollout};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// At most this many phases.
pub const MAX_PHASES: usize = 20;
/// At most this many gate rules.
pub const MAX_GATES: usize = 50;
/// A phase waits at most 30 days.
const MAX_WAIT_SECONDS: u64 = 30 * 24 * 3600;

/// `rollout` of a package, as sent and as kept (JSON bytes in the rollout record).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutPlan {
    pub phases: Vec<Phase>,
    #[serde(default)]
    pub gate_alert_rule_ids: Vec<u64>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub name: String,
    pub devices: PhaseDevices,
    #[serde(default)]
    pub min_wait_seconds: u64,
    /// Failed devices over the phase's devices; above it the phase fails.
    #[serde(default)]
    pub max_failure_rate: f64,
    /// Succeeded devices over the phase's devices (less the failures a resume accepted); the
    /// phase passes only at or above it. Default 1, or `1 - max_failure_rate` when that is
    /// given (the two then state one tolerance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_success_rate: Option<f64>,
    /// A device of the phase that reports no final result within this many seconds of the
    /// phase's start (or resume) counts against it: the phase fails its gate. Default
    /// [`DEFAULT_REPORT_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_timeout_seconds: Option<u64>,
}

/// A phase's devices have an hour to report a final result unless its plan says otherwise.
pub const DEFAULT_REPORT_TIMEOUT_SECONDS: u64 = 3600;

impl Phase {
    /// The success rate the phase needs to pass.
    pub fn success_needed(&self) -> f64 {
        self.min_success_rate
            .unwrap_or(1.0 - self.max_failure_rate)
            .clamp(0.0, 1.0)
    }

    /// How long its devices have to report, in seconds.
    pub fn report_timeout(&self) -> u64 {
        self.report_timeout_seconds
            .unwrap_or(DEFAULT_REPORT_TIMEOUT_SECONDS)
    }
}

/// Exactly one of the three.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PhaseDevices {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    #[default]
    Pause,
    Rollback,
}

impl RolloutPlan {
    /// Parses and checks a plan; `group_exists` and `rule_exists` look ids up in the project.
    pub fn parse(
        v: &serde_json::Value,
        group_exists: impl Fn(u64) -> Result<bool>,
        rule_exists: impl Fn(u64) -> Result<bool>,
    ) -> Result<Self> {
        let plan: RolloutPlan = serde_json::from_value(v.clone())
            .map_err(|e| Error::unprocessable("rollout", e.to_string()))?;
        if plan.phases.is_empty() || plan.phases.len() > MAX_PHASES {
            return Err(Error::unprocessable(
                "rollout.phases",
                format!("must hold 1 to {MAX_PHASES} phases"),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, p) in plan.phases.iter().enumerate() {
            let at = |f: &str| format!("rollout.phases[{i}].{f}");
            crate::rules::name(&at("name"), &p.name, 64)?;
            if !names.insert(p.name.trim()) {
                return Err(Error::unprocessable(&at("name"), "phase names must differ"));
            }
            let d = &p.devices;
            let given = [d.percent.is_some(), d.count.is_some(), d.group_id.is_some()];
            if given.iter().filter(|g| **g).count() != 1 {
                return Err(Error::unprocessable(
                    &at("devices"),
                    "must give exactly one of percent, count or group_id",
                ));
            }
            if d.percent.is_some_and(|p| !(p > 0.0 && p <= 100.0)) {
                return Err(Error::unprocessable(
                    &at("devices.percent"),
                    "must be above 0 and at most 100",
                ));
            }
            if d.count == Some(0) {
                return Err(Error::unprocessable(
                    &at("devices.count"),
                    "must be at least 1",
                ));
            }
            if let Some(g) = d.group_id
                && !group_exists(g)?
            {
                return Err(Error::unprocessable(
                    &at("devices.group_id"),
                    format!("group {g} does not exist in this project"),
                ));
            }
            if p.min_wait_seconds > MAX_WAIT_SECONDS {
                return Err(Error::unprocessable(
                    &at("min_wait_seconds"),
                    "at most 30 days",
                ));
            }
            if !(0.0..=1.0).contains(&p.max_failure_rate) {
                return Err(Error::unprocessable(
                    &at("max_failure_rate"),
                    "must be from 0 to 1",
                ));
            }
            if p.min_success_rate
                .is_some_and(|r| !(0.0..=1.0).contains(&r))
            {
                return Err(Error::unprocessable(
                    &at("min_success_rate"),
                    "must be from 0 to 1",
                ));
            }
            if p.report_timeout_seconds
                .is_some_and(|t| t == 0 || t > MAX_WAIT_SECONDS)
            {
                return Err(Error::unprocessable(
                    &at("report_timeout_seconds"),
                    "must be from 1 s to 30 days",
                ));
            }
        }
        if plan.gate_alert_rule_ids.len() > MAX_GATES {
            return Err(Error::unprocessable(
                "rollout.gate_alert_rule_ids",
                format!("at most {MAX_GATES} rules"),
            ));
        }
        for &r in &plan.gate_alert_rule_ids {
            if !rule_exists(r)? {
                return Err(Error::unprocessable(
                    "rollout.gate_alert_rule_ids",
                    format!("alert rule {r} does not exist in this project"),
                ));
            }
        }
        Ok(plan)
    }

    /// The plan as kept (and shown).
    pub fn of(r: &Rollout) -> Option<Self> {
        serde_json::from_slice(&r.plan_json).ok()
    }
}

/// A stable, well-mixed order for a package's devices (splitmix64 of the pair): the same on
/// every start and every version, unlike std's hasher.
fn rank(device: u64, package: u64) -> u64 {
    let mut z = device ^ package.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The phase (0-based) of each of `targets`, the package's target devices now. Phases take
/// devices in order: a group phase its group's devices not already in a phase; a count or
/// percent phase the next devices in the package's stable order (a percent of all targets,
/// rounded up). Devices no phase took belong to the last phase, so a completed rollout reaches
/// every target.
pub fn phases_of(
    plan: &RolloutPlan,
    package: u64,
    targets: &[u64],
    group_devices: impl Fn(u64) -> Vec<u64>,
) -> HashMap<u64, u32> {
    let mut order: Vec<u64> = targets.to_vec();
    order.sort_by_key(|d| (rank(*d, package), *d));
    order.dedup();
    let total = order.len();
    let mut out: HashMap<u64, u32> = HashMap::with_capacity(total);
    let mut next = 0usize;
    let last = plan.phases.len().saturating_sub(1) as u32;
    for (i, p) in plan.phases.iter().enumerate() {
        let i = i as u32;
        if let Some(g) = p.devices.group_id {
            let members: std::collections::HashSet<u64> = group_devices(g).into_iter().collect();
            for d in &order {
                if members.contains(d) {
                    out.entry(*d).or_insert(i);
                }
            }
            continue;
        }
        let want = match (p.devices.count, p.devices.percent) {
            (Some(c), _) => usize::try_from(c).unwrap_or(usize::MAX),
            // Multiplied first: 7 % of 100 is 7, not ceil(7.000000000000001).
            (None, Some(pct)) => (pct * total as f64 / 100.0).ceil() as usize,
            _ => 0,
        };
        let mut taken = 0;
        while taken < want && next < order.len() {
            let d = order[next];
            next += 1;
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(d) {
                e.insert(i);
                taken += 1;
            }
        }
    }
    for d in order {
        out.entry(d).or_insert(last);
    }
    out
}

/// Whether the package `d`, which targets the device, reaches it now: a package without a
/// rollout reaches every target; with one, the device's phase must have started and the
/// rollout must not have been rolled back.
pub fn reaches(rollout: Option<&Rollout>, phase: Option<u32>) -> bool {
    match rollout {
        None => true,
        Some(r) => {
            r.started_at.is_some()
                && r.state != RolloutState::RolledBack
                && phase.is_some_and(|p| p <= r.phase)
        }
    }
}

/// The order in which a device's packages are considered: the most recently activated
/// active package first (the previously active one is next, which is what a rollback falls
/// back to).
pub fn by_activation(mut packages: Vec<Deployment>) -> Vec<Deployment> {
    packages.retain(|d| d.status == DeploymentStatus::Active);
    packages.sort_by_key(|d| std::cmp::Reverse((d.deployed_at.unwrap_or(0), d.id)));
    packages
}

/// What the controller does next with a running rollout.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing yet.
    Wait,
    /// Start the next phase.
    Advance,
    /// The last phase passed its gate.
    Complete,
    /// The phase failed its gate, for this reason.
    Fail(String),
}

/// A device of a phase, as its gate sees it: its final result with the package, if any.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Member {
    pub id: u64,
    /// `(failed?, reported_at)` of its latest final report.
    pub result: Option<(bool, i64)>,
}

/// What a phase's devices reported, counted for its gate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Tally {
    devices: usize,
    succeeded: usize,
    /// Failures since `accepted_before`.
    failed: usize,
    /// Failures a member's resume accepted (out of the count the success rate is taken on).
    accepted: usize,
    unfinished: usize,
    /// When the last of its finished devices finished.
    last_finished: i64,
}

impl Tally {
    fn of(members: &[Member], accepted_before: i64) -> Self {
        let mut t = Tally {
            devices: members.len(),
            last_finished: i64::MIN,
            ..Tally::default()
        };
        for m in members {
            match m.result {
                None => t.unfinished += 1,
                Some((false, at)) => {
                    t.succeeded += 1;
                    t.last_finished = t.last_finished.max(at);
                }
                Some((true, at)) if at < accepted_before => {
                    t.accepted += 1;
                    t.last_finished = t.last_finished.max(at);
                }
                Some((true, at)) => {
                    t.failed += 1;
                    t.last_finished = t.last_finished.max(at);
                }
            }
        }
        t
    }

    /// Failed over devices.
    fn failure_rate(&self) -> f64 {
        if self.devices == 0 {
            0.0
        } else {
            self.failed as f64 / self.devices as f64
        }
    }

    /// The devices the success rate is taken on: all less the accepted failures.
    fn judged(&self) -> usize {
        self.devices - self.accepted
    }

    /// Why the phase fails on what its devices reported so far, if it does: a failure rate
    /// above the limit, or a success rate that is (or can only end) below the minimum.
    fn verdict(&self, p: &Phase) -> Option<String> {
        let rate = self.failure_rate();
        if rate > p.max_failure_rate {
            return Some(format!(
                "failure rate {rate:.3} ({} of {} devices) in phase {} is above {}",
                self.failed, self.devices, p.name, p.max_failure_rate
            ));
        }
        self.success_verdict(p)
    }

    /// The success part of [`Tally::verdict`].
    fn success_verdict(&self, p: &Phase) -> Option<String> {
        let judged = self.judged();
        if judged == 0 {
            return None;
        }
        let need = p.success_needed();
        // Compared in whole devices, so 0.9 of 10 is 9 and not 9.000000000000002.
        let enough = |n: usize| n as f64 >= (need * judged as f64) - 1e-9;
        if self.unfinished == 0 && !enough(self.succeeded) {
            return Some(format!(
                "success rate {:.3} ({} of {judged} devices) in phase {} is below {need}",
                self.succeeded as f64 / judged as f64,
                self.succeeded,
                p.name
            ));
        }
        if self.unfinished > 0 && !enough(self.succeeded + self.unfinished) {
            return Some(format!(
                "success rate can reach at most {:.3} ({} of {judged} devices) in phase {}, below {need}",
                (self.succeeded + self.unfinished) as f64 / judged as f64,
                self.succeeded + self.unfinished,
                p.name
            ));
        }
        None
    }
}

/// The gate of the current phase, judged on what its devices reported. It **fails** at once
/// when a gate rule fired on a device of a started phase since the phase began (`fired`), its
/// failure rate is above `max_failure_rate`, its success rate is (or can only end) below
/// `min_success_rate`, or devices have not reported a final result within
/// `report_timeout_seconds` of the phase's start, or of the moment the package was offered to
/// them again if a member retried them since (`offered_at`; `unreported` names them for the
/// reason). It
/// **passes** only once every device reported, and then `min_wait_seconds` after the last of
/// them finished (and after the phase began): the next phase starts, or the rollout completes.
pub fn gate(
    plan: &RolloutPlan,
    r: &Rollout,
    now: i64,
    members: &[Member],
    fired: Option<(u64, u64)>,
    offered_at: impl Fn(u64) -> Option<i64>,
    unreported: impl FnOnce(&[u64]) -> String,
) -> Step {
    let Some(p) = plan.phases.get(r.phase as usize) else {
        return Step::Complete;
    };
    if let Some((rule, device)) = fired {
        return Step::Fail(format!(
            "alert rule {rule} fired on device {device} during phase {}",
            p.name
        ));
    }
    let t = Tally::of(members, r.accepted_before);
    if let Some(why) = t.verdict(p) {
        return Step::Fail(why);
    }
    if t.unfinished > 0 {
        let timeout = p.report_timeout();
        let limit = (timeout as i64).saturating_mul(1000);
        // No device can be late before the phase itself is: a retry only starts later.
        if now.saturating_sub(r.phase_started_at) >= limit {
            let ids: Vec<u64> = members
                .iter()
                .filter(|m| m.result.is_none())
                .filter(|m| {
                    let from = offered_at(m.id)
                        .map_or(r.phase_started_at, |at| at.max(r.phase_started_at));
                    now.saturating_sub(from) >= limit
                })
                .map(|m| m.id)
                .collect();
            if ids.is_empty() {
                return Step::Wait;
            }
            let n = ids.len();
            return Step::Fail(format!(
                "{n} device{} did not report within {timeout} s in phase {}: {}",
                if n == 1 { "" } else { "s" },
                p.name,
                unreported(&ids)
            ));
        }
        return Step::Wait;
    }
    let from = t.last_finished.max(r.phase_started_at);
    if now.saturating_sub(from) < (p.min_wait_seconds as i64).saturating_mul(1000) {
        return Step::Wait;
    }
    if r.phase as usize + 1 >= plan.phases.len() {
        Step::Complete
    } else {
        Step::Advance
    }
}

/// A phase that already passed, judged again on what its devices reported since (a late
/// failure): the reason it now fails, if it does. Only what was reported counts: a device
/// that has not reported (a new target, a retried device) is not held against it.
pub fn late_verdict(
    plan: &RolloutPlan,
    phase: u32,
    r: &Rollout,
    members: &[Member],
) -> Option<String> {
    let p = plan.phases.get(phase as usize)?;
    let mut t = Tally::of(members, r.accepted_before);
    if t.failed == 0 {
        return None;
    }
    // Judged as if the unreported devices were not in the phase, but the failure rate stays
    // over all of its devices, as when it passed.
    let all = t.devices;
    t.unfinished = 0;
    let rate = t.failure_rate();
    if rate > p.max_failure_rate {
        return Some(format!(
            "late failure: failure rate {rate:.3} ({} of {all} devices) in phase {} is above {}",
            t.failed, p.name, p.max_failure_rate
        ));
    }
    t.devices = members.iter().filter(|m| m.result.is_some()).count();
    t.success_verdict(p).map(|w| format!("late failure: {w}"))
}

/// A change to a rollout: the controller's step, or a member's action.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutAction {
    /// The controller's verdict on phase `from_phase` as it began (or was resumed) at
    /// `since`; ignored if the rollout has moved on since (another phase, a pause and resume).
    Step {
        from_phase: u32,
        since: i64,
        step: Step,
    },
    Pause,
    Resume,
    Abort,
    /// The failed gate's notice went out.
    NoticeSent,
    /// The controller judged a completed rollout's late failures: `reason` when a phase now
    /// fails its gate (recorded as a `late_failure` decision, its notice owed).
    Late {
        reason: Option<String>,
    },
}

/// The notice a failed gate's decision owes the gate rules' integrations (`None` for any
/// other decision): the controller finds the decision that owes a notice by it.
pub fn notice_for(action: &str, reason: &str) -> Option<String> {
    match action {
        "paused" => Some(format!("rollout paused: {reason}")),
        "rolled_back" => Some(format!("rollout rolled back: {reason}")),
        "late_failure" => Some(format!("after the rollout completed: {reason}")),
        _ => None,
    }
}

/// A new rollout for a package being created or edited: not started.
pub fn planned(deployment: u64, project: u64, plan_json: Vec<u8>) -> Rollout {
    Rollout {
        deployment_id: deployment,
        project_id: project,
        plan_json,
        state: RolloutState::Running,
        phase: 0,
        started_at: None,
        phase_started_at: 0,
        rolled_back_to: None,
        decisions: Vec::new(),
        notice_owed: None,
        accepted_before: 0,
        late_owed: false,
    }
}

/// Starts phase 1 of a package being activated.
pub fn start(r: &mut Rollout, plan: &RolloutPlan, now: i64) {
    r.state = RolloutState::Running;
    r.phase = 0;
    r.started_at = Some(now);
    r.phase_started_at = now;
    r.accepted_before = now;
    let name = plan.phases.first().map_or("1", |p| p.name.as_str());
    r.decide(
        now,
        "started",
        format!("package activated; phase {name} started"),
    );
}

/// Applies `action`; a member's action the rollout's state does not allow is 409, a stale
/// controller step is `Ok(false)` (nothing changed). `previous` is the package the devices
/// fall back to on a rollback, for the record.
pub fn apply(
    r: &mut Rollout,
    plan: &RolloutPlan,
    action: RolloutAction,
    now: i64,
    previous: Option<u64>,
) -> Result<bool> {
    use RolloutState as S;
    let phase_name = |i: u32| {
        plan.phases
            .get(i as usize)
            .map_or_else(|| (i + 1).to_string(), |p| p.name.clone())
    };
    if r.started_at.is_none() && action != RolloutAction::NoticeSent {
        return Err(Error::Conflict(
            "The package is a draft; its rollout starts when it is activated".into(),
        ));
    }
    match action {
        RolloutAction::Step {
            from_phase,
            since,
            step,
        } => {
            if r.state != S::Running || r.phase != from_phase || r.phase_started_at != since {
                return Ok(false);
            }
            match step {
                Step::Wait => return Ok(false),
                Step::Advance => {
                    let passed = phase_name(r.phase);
                    r.phase += 1;
                    r.phase_started_at = now;
                    let next = phase_name(r.phase);
                    r.decide(
                        now,
                        "started",
                        format!("phase {passed} passed its gate; phase {next} started"),
                    );
                }
                Step::Complete => {
                    r.state = S::Completed;
                    // A failure reported while this step was on its way saw a running
                    // rollout and owed nothing: the completed rollout is judged once more.
                    r.late_owed = true;
                    let last = phase_name(r.phase);
                    r.decide(now, "completed", format!("phase {last} passed its gate"));
                }
                Step::Fail(reason) => match plan.on_failure {
                    OnFailure::Pause => {
                        r.state = S::Paused;
                        r.notice_owed = notice_for("paused", &reason);
                        r.decide(now, "paused", reason);
                    }
                    OnFailure::Rollback => {
                        r.state = S::RolledBack;
                        r.rolled_back_to = previous;
                        let to = previous.map_or_else(
                            || "no earlier package".to_string(),
                            |p| format!("package {p}"),
                        );
                        let why = format!(
                            "{reason}; the devices of the started phases return to their previous package ({to} for most)"
                        );
                        r.notice_owed = notice_for("rolled_back", &why);
                        r.decide(now, "rolled_back", why);
                    }
                },
            }
        }
        RolloutAction::Pause => {
            if r.state != S::Running {
                return Err(Error::Conflict(format!(
                    "The rollout is {}; only a running rollout can be paused",
                    r.state
                )));
            }
            r.state = S::Paused;
            r.decide(now, "paused", "paused by a member".into());
        }
        RolloutAction::Resume => {
            if r.state != S::Paused {
                return Err(Error::Conflict(format!(
                    "The rollout is {}; only a paused rollout can be resumed",
                    r.state
                )));
            }
            // The phase's gate starts over: its wait, and failures and alerts from now.
            r.state = S::Running;
            r.phase_started_at = now;
            r.accepted_before = now;
            r.decide(
                now,
                "resumed",
                format!(
                    "resumed by a member; phase {} gate starts over",
                    phase_name(r.phase)
                ),
            );
        }
        RolloutAction::Abort => {
            if !matches!(r.state, S::Running | S::Paused) {
                return Err(Error::Conflict(format!(
                    "The rollout is {}; only a running or paused rollout can be aborted",
                    r.state
                )));
            }
            r.state = S::Aborted;
            r.decide(
                now,
                "aborted",
                "aborted by a member; the devices already in keep the package".into(),
            );
        }
        RolloutAction::NoticeSent => {
            if r.notice_owed.is_none() {
                return Ok(false);
            }
            r.notice_owed = None;
        }
        RolloutAction::Late { reason } => {
            if !r.late_owed {
                return Ok(false);
            }
            r.late_owed = false;
            if let Some(reason) = reason
                && r.state == S::Completed
            {
                r.notice_owed = notice_for("late_failure", &reason);
                r.decide(now, "late_failure", reason);
                // Recorded once: what was reported up to now is judged, the next late
                // failure is judged on its own.
                r.accepted_before = now;
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn plan(v: serde_json::Value) -> Result<RolloutPlan> {
        RolloutPlan::parse(&v, |g| Ok(g == 7), |r| Ok(r == 3))
    }

    #[test]
    fn plans_are_checked_in_full() {
        let ok = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 2}, "min_wait_seconds": 60, "max_failure_rate": 0.1},
            {"name": "lab", "devices": {"group_id": 7}},
            {"name": "rest", "devices": {"percent": 100}}
        ], "gate_alert_rule_ids": [3], "on_failure": "rollback"}))
        .unwrap();
        assert_eq!(ok.on_failure, OnFailure::Rollback);
        for bad in [
            serde_json::json!({"phases": []}),
            serde_json::json!({"phases": [{"name": "a", "devices": {}}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1, "percent": 5}}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"percent": 0}}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"group_id": 8}}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}, "max_failure_rate": 2}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}}, {"name": "a", "devices": {"count": 1}}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}}], "gate_alert_rule_ids": [4]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}}], "on_failure": "explode"}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}, "extra": 1}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}, "min_success_rate": 1.5}]}),
            serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}, "report_timeout_seconds": 0}]}),
        ] {
            assert!(
                matches!(plan(bad.clone()), Err(Error::Unprocessable(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn phases_are_stable_and_cover_every_target() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 3}},
            {"name": "lab", "devices": {"group_id": 7}},
            {"name": "half", "devices": {"percent": 50}},
            {"name": "rest", "devices": {"count": 1}}
        ]}))
        .unwrap();
        let targets: Vec<u64> = (1..=50).collect();
        let lab = vec![10, 11, 12];
        let a = phases_of(&p, 9, &targets, |_| lab.clone());
        assert_eq!(a.len(), 50);
        assert_eq!(a.values().filter(|p| **p == 0).count(), 3);
        // The group's devices are in the lab phase unless the canary took them first.
        for d in &lab {
            assert!(a[d] <= 1);
        }
        assert_eq!(a.values().filter(|p| **p == 2).count(), 25);
        // The same on another call and with the targets in another order; another package
        // orders devices otherwise.
        let mut rev = targets.clone();
        rev.reverse();
        assert_eq!(phases_of(&p, 9, &rev, |_| lab.clone()), a);
        assert_ne!(phases_of(&p, 10, &targets, |_| lab.clone()), a);
        // Percents of the whole target set, rounded up: 7 % of 100 is 7, 14 % of 50 is 7.
        for (pct, n, want) in [(7.0, 100u64, 7usize), (14.0, 50, 7), (0.5, 10, 1)] {
            let p = plan(serde_json::json!({"phases": [
                {"name": "a", "devices": {"percent": pct}},
                {"name": "b", "devices": {"percent": 100}}
            ]}))
            .unwrap();
            let t: Vec<u64> = (1..=n).collect();
            let m = phases_of(&p, 1, &t, |_| Vec::new());
            assert_eq!(
                m.values().filter(|x| **x == 0).count(),
                want,
                "{pct} % of {n}"
            );
        }
    }

    fn running(phase: u32, phase_started_at: i64) -> Rollout {
        Rollout {
            deployment_id: 1,
            project_id: 1,
            plan_json: Vec::new(),
            state: RolloutState::Running,
            phase,
            started_at: Some(0),
            phase_started_at,
            rolled_back_to: None,
            decisions: Vec::new(),
            notice_owed: None,
            accepted_before: 0,
            late_owed: false,
        }
    }

    fn ok(id: u64, at: i64) -> Member {
        Member {
            id,
            result: Some((false, at)),
        }
    }
    fn bad(id: u64, at: i64) -> Member {
        Member {
            id,
            result: Some((true, at)),
        }
    }
    fn silent(id: u64) -> Member {
        Member { id, result: None }
    }
    fn never(_: u64) -> Option<i64> {
        None
    }
    fn names(ids: &[u64]) -> String {
        ids.iter()
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    #[test]
    fn a_phase_waits_for_every_device_then_its_wait_from_the_last_report() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 2}, "min_wait_seconds": 10},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let r = running(0, 1_000);
        // Long past the wait, but one device has not reported: it waits.
        let m = [ok(1, 2_000), silent(2)];
        assert_eq!(gate(&p, &r, 100_000, &m, None, never, names), Step::Wait);
        // Both reported; the wait runs from the last report (5 s), not the phase's start.
        let m = [ok(1, 2_000), ok(2, 5_000)];
        assert_eq!(gate(&p, &r, 14_999, &m, None, never, names), Step::Wait);
        assert_eq!(gate(&p, &r, 15_000, &m, None, never, names), Step::Advance);
        assert_eq!(
            gate(&p, &running(1, 1_000), 15_000, &[], None, never, names),
            Step::Complete
        );
    }

    #[test]
    fn a_failure_or_a_gate_rule_fails_the_phase_at_once() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 4}, "min_wait_seconds": 10, "max_failure_rate": 0.25},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let r = running(0, 1_000);
        let one = [bad(1, 2_000), silent(2), silent(3), silent(4)];
        assert_eq!(gate(&p, &r, 2_000, &one, None, never, names), Step::Wait);
        let two = [bad(1, 2_000), bad(2, 2_000), silent(3), silent(4)];
        assert!(
            matches!(gate(&p, &r, 2_000, &two, None, never, names), Step::Fail(m) if m.contains("failure rate 0.500 (2 of 4 devices)"))
        );
        assert!(
            matches!(gate(&p, &r, 2_000, &one, Some((3, 5)), never, names), Step::Fail(m) if m.contains("device 5"))
        );
        // One of four failed, 0.25 allowed: with 1 - 0.25 the success needed, it passes.
        let done = [bad(1, 2_000), ok(2, 2_000), ok(3, 2_000), ok(4, 2_000)];
        assert_eq!(
            gate(&p, &r, 12_000, &done, None, never, names),
            Step::Advance
        );
    }

    #[test]
    fn a_success_rate_below_its_minimum_fails_once_it_cannot_be_reached() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 4}, "max_failure_rate": 0.5, "min_success_rate": 0.75},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let r = running(0, 1_000);
        // One failed of four: three may still succeed (0.75).
        let m = [bad(1, 2_000), silent(2), silent(3), ok(4, 2_000)];
        assert_eq!(gate(&p, &r, 3_000, &m, None, never, names), Step::Wait);
        // Two failed (0.5 is not above 0.5): 0.75 can no longer be reached.
        let m = [bad(1, 2_000), bad(2, 2_000), silent(3), ok(4, 2_000)];
        assert!(
            matches!(gate(&p, &r, 3_000, &m, None, never, names), Step::Fail(m) if m.contains("at most 0.500"))
        );
    }

    #[test]
    fn devices_that_do_not_report_in_time_fail_the_phase_by_name() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 3}, "report_timeout_seconds": 60},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let r = running(0, 1_000);
        let m = [ok(1, 2_000), silent(2), silent(3)];
        assert_eq!(gate(&p, &r, 60_999, &m, None, never, names), Step::Wait);
        match gate(&p, &r, 61_000, &m, None, never, names) {
            Step::Fail(why) => assert_eq!(
                why,
                "2 devices did not report within 60 s in phase canary: d2, d3"
            ),
            other => panic!("{other:?}"),
        }
        // Without a timeout in the plan, the default hour.
        let p =
            plan(serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}}]})).unwrap();
        let m = [silent(1)];
        assert_eq!(gate(&p, &r, 3_600_999, &m, None, never, names), Step::Wait);
        assert!(matches!(
            gate(&p, &r, 3_601_000, &m, None, never, names),
            Step::Fail(_)
        ));
    }

    #[test]
    fn a_resume_accepts_the_failures_before_it() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 4}},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let mut r = running(0, 10_000);
        r.accepted_before = 10_000;
        // Failed before the resume: out of the count; the other three succeeded.
        let m = [bad(1, 5_000), ok(2, 11_000), ok(3, 11_000), ok(4, 12_000)];
        assert_eq!(gate(&p, &r, 12_000, &m, None, never, names), Step::Advance);
        // A failure after it fails the phase.
        let m = [bad(1, 5_000), bad(2, 11_000), ok(3, 11_000), ok(4, 12_000)];
        assert!(matches!(
            gate(&p, &r, 12_000, &m, None, never, names),
            Step::Fail(_)
        ));
    }

    #[test]
    fn a_late_failure_is_judged_against_its_phase() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 4}, "max_failure_rate": 0.25},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let r = running(1, 10_000);
        // One failure of four is within 0.25; a second is not.
        let m = [bad(1, 2_000), ok(2, 2_000), ok(3, 2_000), ok(4, 2_000)];
        assert_eq!(late_verdict(&p, 0, &r, &m), None);
        let m = [bad(1, 2_000), bad(2, 20_000), ok(3, 2_000), ok(4, 2_000)];
        let why = late_verdict(&p, 0, &r, &m).unwrap();
        assert!(
            why.starts_with("late failure: failure rate 0.500 (2 of 4 devices) in phase canary"),
            "{why}"
        );
        // A device that has not reported (retried, or new) is not held against it.
        let m = [ok(1, 2_000), silent(2), ok(3, 2_000), ok(4, 2_000)];
        assert_eq!(late_verdict(&p, 0, &r, &m), None);
        // Failures a resume accepted are not judged again.
        let mut r = running(1, 30_000);
        r.accepted_before = 30_000;
        let m = [bad(1, 2_000), bad(2, 20_000), ok(3, 2_000), ok(4, 2_000)];
        assert_eq!(late_verdict(&p, 0, &r, &m), None);
    }

    #[test]
    fn a_retried_device_has_its_report_timeout_from_its_retry() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 2}, "report_timeout_seconds": 60},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        let r = running(0, 1_000);
        let m = [ok(1, 2_000), silent(2)];
        // Device 2 was offered again at 50 s: not late at 61 s, late at 110 s.
        let retried = |id: u64| (id == 2).then_some(50_000);
        assert_eq!(gate(&p, &r, 61_000, &m, None, retried, names), Step::Wait);
        assert_eq!(gate(&p, &r, 109_999, &m, None, retried, names), Step::Wait);
        match gate(&p, &r, 110_000, &m, None, retried, names) {
            Step::Fail(why) => assert_eq!(
                why,
                "1 device did not report within 60 s in phase canary: d2"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failure_reported_before_its_phase_started_counts_against_it() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 1}},
            {"name": "rest", "devices": {"percent": 100}}
        ]}))
        .unwrap();
        // Phase rest began at 20 s; device 3 failed at 15 s (it had the package before its
        // phase reached it, as a target moved between phases does). Only a resume accepts it.
        let mut r = running(1, 20_000);
        r.accepted_before = 1_000;
        let m = [bad(3, 15_000), ok(4, 21_000)];
        assert!(matches!(
            gate(&p, &r, 100_000, &m, None, never, names),
            Step::Fail(why) if why.contains("1 of 2 devices")
        ));
    }

    #[test]
    fn completing_owes_one_more_look_and_a_late_failure_is_recorded_once() {
        let p = plan(serde_json::json!({"phases": [
            {"name": "canary", "devices": {"count": 1}}
        ]}))
        .unwrap();
        let mut r = running(0, 1_000);
        let complete = RolloutAction::Step {
            from_phase: 0,
            since: 1_000,
            step: Step::Complete,
        };
        assert!(apply(&mut r, &p, complete, 5_000, None).unwrap());
        assert_eq!(r.state, RolloutState::Completed);
        // A failure reported while the step was on its way is looked at once more.
        assert!(r.late_owed);
        let late = RolloutAction::Late {
            reason: Some("late failure: x".into()),
        };
        assert!(apply(&mut r, &p, late.clone(), 6_000, None).unwrap());
        assert_eq!(r.decisions.last().unwrap().action, "late_failure");
        assert!(!r.late_owed);
        // The failures judged are not judged again.
        assert_eq!(r.accepted_before, 6_000);
        let m = [bad(1, 5_500)];
        assert_eq!(late_verdict(&p, 0, &r, &m), None);
        let m = [bad(1, 6_500)];
        assert!(late_verdict(&p, 0, &r, &m).is_some());
    }

    #[test]
    fn rollouts_reach_only_started_phases() {
        let mut r = running(1, 1_000);
        assert!(reaches(Some(&r), Some(1)));
        assert!(!reaches(Some(&r), Some(2)));
        r.state = RolloutState::RolledBack;
        assert!(!reaches(Some(&r), Some(0)));
        assert!(reaches(None, None));
    }
}
