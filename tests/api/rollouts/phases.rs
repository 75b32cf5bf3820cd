//! Robots through the phases: fifty of them through three, a phase over its failure rate
//! pausing with a member resuming, pausing and aborting, and a resume racing the controller's
//! stop.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::configurations::capsule;
use crate::deployments::{DEPS, device};

each_backend!(a_resume_racing_the_paused_controllers_stop_is_not_lost);
/// A resume whose nudge reaches the controller while it stops (it had found its rollout
/// paused) is not lost: the rollout goes on at once, not at the housekeeper's next pass (60 s
/// by default). The controller is held just before it leaves while the member resumes.
async fn a_resume_racing_the_paused_controllers_stop_is_not_lost() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 4, json!({"fleet": "a"})).await;
    let plan = json!({"phases": [
        {"name": "canary", "devices": {"count": 1}, "min_wait_seconds": 1, "max_failure_rate": 0.5},
        {"name": "rest", "devices": {"percent": 100}, "max_failure_rate": 0.5}
    ]});
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1.0.0", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "a"}}], "rollout": plan}),
    )
    .await;
    activate(&s, dep).await;
    let (release, reached) = s.rt().pipeline.inject_rollout_stop_hold(dep).await.unwrap();
    let r = act(&s, dep, "pause").await;
    assert_eq!(r.body["state"], "paused", "{}", r.body);
    // The controller's next tick finds it paused and is held on its way out.
    let at_stop = || async { reached.load(std::sync::atomic::Ordering::SeqCst) };
    assert!(eventually(5, at_stop).await, "the controller stopped");
    let r = act(&s, dep, "resume").await;
    assert_eq!(r.body["state"], "running", "{}", r.body);
    release.notify_one();
    let r = until_state(&s, &mut fleet, dep, "completed", 15).await;
    assert_eq!(
        actions(&r),
        ["started", "paused", "resumed", "started", "completed"]
    );
}

each_backend!(fifty_robots_follow_a_three_phase_rollout);
async fn fifty_robots_follow_a_three_phase_rollout() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 50, json!({"fleet": "a"})).await;
    let plan = json!({"phases": [
        {"name": "canary", "devices": {"count": 5}, "min_wait_seconds": 1, "max_failure_rate": 0.2},
        {"name": "half", "devices": {"percent": 50}, "min_wait_seconds": 1, "max_failure_rate": 0.2},
        {"name": "rest", "devices": {"percent": 100}, "max_failure_rate": 0.2}
    ]});
    let body = json!({"name": "nav 1", "composition_tag": "nav-1.0.0", "capsule_id": cap,
        "target_devices": [{"labels": {"fleet": "a"}}], "rollout": plan});

    // A bad plan is 422 naming the field; plan lists it as a blocker.
    let mut bad = body.clone();
    bad["rollout"]["phases"][1]["devices"] = json!({"percent": 50, "count": 3});
    let d = s
        .post(DEPS, s.key(), bad.clone())
        .await
        .assert_error(422)
        .to_string();
    assert!(d.contains("rollout.phases[1].devices"), "{d}");
    let p = s.post(&format!("{DEPS}/plan"), s.key(), bad).await;
    assert_eq!(p.body["blockers"][0]["field"], "rollout.phases[1].devices");

    // The draft: every phase pending, the split already fixed (5, 25, the other 20).
    let dep = create(&s, body).await;
    let r = rollout(&s, dep).await;
    assert_eq!(
        (&r["state"], &r["started_at"]),
        (&json!("planned"), &Value::Null)
    );
    let counts: Vec<u64> = (0..3)
        .map(|i| r["phases"][i]["device_count"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [5, 25, 20]);
    assert!(
        r["phases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"] == "pending")
    );
    act(&s, dep, "pause").await.assert_error(409);
    let canary = phase_devices(&r, 0);

    // Activation starts the canary only (held there by a member's pause while it is looked
    // at; the resume starts the canary's gate over).
    activate(&s, dep).await;
    let r = act(&s, dep, "pause").await;
    assert_eq!(
        (r.status.as_u16(), &r.body["state"]),
        (200, &json!("paused"))
    );
    cycle_all(&s, &mut fleet).await;
    let reached: Vec<u64> = fleet
        .iter()
        .filter(|r| r.running == Some(dep))
        .map(|r| r.id)
        .collect();
    let mut want = canary.clone();
    want.sort_unstable();
    assert_eq!(reached, want, "only the canary");
    assert!(
        fleet
            .iter()
            .all(|r| r.last_status == if want.contains(&r.id) { 200 } else { 204 })
    );
    let r = act(&s, dep, "resume").await;
    assert_eq!(r.status, 200, "{}", r.body);
    // A robot registered mid-rollout is one of its targets: it joins a phase and is reached.
    let (late, late_tok) = device(&s, "robot-late", json!({"fleet": "a"})).await;
    fleet.push(Robot::new(late, late_tok));

    // The controller panics: its supervisor restarts it from the stored rollout, and the
    // robots follow it to the end.
    s.rt().pipeline.inject_rollout_panic(dep).await.unwrap();
    let r = until_state(&s, &mut fleet, dep, "completed", 30).await;
    assert_eq!(
        actions(&r),
        [
            "started",
            "paused",
            "resumed",
            "started",
            "started",
            "completed"
        ]
    );
    // A phase passes only once every device of it reported, the last one too.
    let mut total = 0;
    for p in r["phases"].as_array().unwrap() {
        assert_eq!(p["status"], "passed", "{p}");
        assert_eq!(p["counts"]["succeeded"], p["device_count"], "{p}");
        assert_eq!(p["failure_rate"], 0.0);
        total += p["device_count"].as_u64().unwrap();
    }
    assert_eq!(total, 51, "the late robot is in a phase");
    // Each phase waited its minimum after the one before.
    let at = |i: usize| {
        time::OffsetDateTime::parse(
            r["decisions"][i]["at"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    assert!((at(3) - at(2)).whole_milliseconds() >= 1000);
    assert!((at(4) - at(3)).whole_milliseconds() >= 1000);
    assert!(fleet.iter().all(|r| r.running == Some(dep)));
    let d = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(
        d.body["device_results"],
        json!({"succeeded": 51, "failed": 0})
    );
    assert_eq!(
        d.body["rollout"],
        json!({"state": "completed", "current_phase": "rest"})
    );
    // Once settled, every poll is a 304.
    cycle_all(&s, &mut fleet).await;
    assert!(fleet.iter().all(|r| r.last_status == 304));
    // A robot registered after the rollout completed is a target of a finished rollout: its
    // first poll gets the package.
    let (after, after_tok) = device(&s, "robot-after", json!({"fleet": "a"})).await;
    let mut rb = Robot::new(after, after_tok);
    assert_eq!(rb.cycle(&s.http, &s.base).await, Some(dep));
    act(&s, dep, "abort").await.assert_error(409);
}

each_backend!(a_phase_over_its_failure_rate_pauses_and_members_resume_pause_and_abort);
async fn a_phase_over_its_failure_rate_pauses_and_members_resume_pause_and_abort() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 20, json!({"fleet": "b"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1.0.0", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "b"}}],
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 4}, "min_wait_seconds": 1, "max_failure_rate": 0.25},
                {"name": "rest", "devices": {"percent": 100}, "min_wait_seconds": 3600}
            ]}}),
    )
    .await;
    let canary = phase_devices(&rollout(&s, dep).await, 0);
    // A draft's plan can be removed (PATCH null) and given again; a group a plan uses
    // cannot be deleted.
    let other = create(
        &s,
        json!({"name": "x", "composition_tag": "x", "capsule_id": cap, "target_devices": [fleet[0].id],
            "rollout": {"phases": [{"name": "only", "devices": {"count": 1}}]}}),
    )
    .await;
    let r = s
        .patch(
            &format!("{DEPS}/{other}"),
            s.key(),
            json!({"rollout": null}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    s.get(&format!("{DEPS}/{other}/rollout"), s.key())
        .await
        .assert_error(404);
    let g = s
        .post(
            &format!("{DEV}/device-groups"),
            s.key(),
            json!({"name": "lab", "device_ids": [fleet[1].id]}),
        )
        .await;
    let g = g.body["id"].as_u64().unwrap();
    let r = s
        .patch(
            &format!("{DEPS}/{other}"),
            s.key(),
            json!({"rollout": {"phases": [{"name": "lab", "devices": {"group_id": g}}]}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(rollout(&s, other).await["phases"][0]["name"], "lab");
    s.delete(&format!("{DEV}/device-groups/{g}"), s.key())
        .await
        .assert_error(409);
    // Two of four canaries fail: 0.5 > 0.25.
    for r in fleet.iter_mut() {
        r.fail = canary[..2].contains(&r.id);
    }
    activate(&s, dep).await;
    let r = until_state(&s, &mut fleet, dep, "paused", 10).await;
    let last = r["decisions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["action"], "paused");
    assert_eq!(last["phase"], "canary");
    assert!(
        last["reason"]
            .as_str()
            .unwrap()
            .contains("failure rate 0.500 (2 of 4 devices)"),
        "{last}"
    );
    assert_eq!(r["phases"][0]["status"], "paused");
    assert_eq!(r["phases"][0]["counts"]["failed"], 2);
    assert_eq!(r["phases"][1]["status"], "pending");
    // Paused: the rest of the fleet still has nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cycle_all(&s, &mut fleet).await;
    let reached = fleet.iter().filter(|r| r.running == Some(dep)).count();
    assert_eq!(reached, 4);
    act(&s, dep, "pause").await.assert_error(409);

    // Resume: the phase's gate starts over (the earlier failures no longer count), so after
    // its wait the rest starts.
    let r = act(&s, dep, "resume").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "running");
    assert_eq!(*actions(&r.body).last().unwrap(), "resumed");
    let t = Instant::now();
    loop {
        cycle_all(&s, &mut fleet).await;
        if fleet.iter().all(|r| r.running == Some(dep)) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the rest never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = rollout(&s, dep).await;
    assert_eq!(r["current_phase"], "rest");
    assert_eq!(r["phases"][0]["status"], "passed");
    assert_eq!(r["phases"][1]["status"], "in_progress");

    // A member's pause and abort; an aborted rollout takes no more actions.
    let r = act(&s, dep, "pause").await;
    assert_eq!(
        (r.status.as_u16(), &r.body["state"]),
        (200, &json!("paused"))
    );
    let r = act(&s, dep, "abort").await;
    assert_eq!(
        (r.status.as_u16(), &r.body["state"]),
        (200, &json!("aborted"))
    );
    assert_eq!(
        actions(&r.body),
        [
            "started", "paused", "resumed", "started", "paused", "aborted"
        ]
    );
    act(&s, dep, "resume").await.assert_error(409);
    // The devices already in keep the package.
    let mut rb = fleet.remove(0);
    rb.cycle(&s.http, &s.base).await;
    assert_eq!(rb.running, Some(dep));
    s.get(&format!("{DEPS}/999999/rollout"), s.key())
        .await
        .assert_error(404);
}
