//! The gate: whether a phase's members' reports (and the rules that fired) let the rollout
//! go on, wait, or fail the phase; a late failure judged against its phase.

use super::*;

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
