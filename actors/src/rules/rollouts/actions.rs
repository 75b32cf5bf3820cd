//! What an operator or a verdict does to a rollout: planned, started, paused, resumed,
//! aborted, rolled back, completed, each a checked change of its state.

use super::*;

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
