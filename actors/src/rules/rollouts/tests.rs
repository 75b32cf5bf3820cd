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
    let p = plan(serde_json::json!({"phases": [{"name": "a", "devices": {"count": 1}}]})).unwrap();
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
