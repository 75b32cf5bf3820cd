//! A rollout's gates judged on what its robots reported, through the real server: the last
//! phase waits for every robot and pauses on a failure that came after its wait; robots that
//! do not report within the phase's timeout fail it by name (the offline ones said so); a
//! failure reported after the rollout completed is recorded and notified; a failed robot is
//! offered the package again; a robot's rollback is shown; a draft's rollout is `planned`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;
use crate::configurations::capsule;
use crate::deployments::DEPS;
use crate::evaluation::{fast, heartbeat, rule, webhook};
use crate::peers::Sink;
use crate::rollouts::{
    Robot, act, actions, activate, create, cycle_all, phase_devices, quick, robots, rollout,
    until_state,
};
use crate::updates::UPDATE;

/// Waits (cycling `fleet`) until `check` holds for the rollout's view.
async fn until(
    s: &Srv,
    fleet: &mut [Robot],
    dep: u64,
    secs: u64,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let t = Instant::now();
    loop {
        cycle_all(s, fleet).await;
        let r = rollout(s, dep).await;
        if check(&r) {
            return r;
        }
        assert!(t.elapsed() < Duration::from_secs(secs), "never: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn last_decision(r: &Value) -> Value {
    r["decisions"].as_array().unwrap().last().unwrap().clone()
}

each_backend!(the_last_phase_waits_for_its_robots_and_pauses_on_their_failure);
/// The scenario a new user tried: a canary of one, then the rest. The last phase does not
/// pass while two of its robots have said nothing, and when one of them fails (after the
/// canary's wait is long over) the rollout pauses.
async fn the_last_phase_waits_for_its_robots_and_pauses_on_their_failure() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let fleet = robots(&s, 3, json!({"fleet": "g"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "g"}}],
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 1}, "min_wait_seconds": 1},
                {"name": "rest", "devices": {"percent": 100}}
            ], "on_failure": "pause"}}),
    )
    .await;
    let plan = rollout(&s, dep).await;
    assert_eq!(plan["state"], "planned", "{plan}");
    assert_eq!(plan["current_phase"], Value::Null);
    let d = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(d.body["rollout"]["state"], "planned", "{}", d.body);
    let canary = phase_devices(&plan, 0);
    let (mut first, mut rest): (Vec<Robot>, Vec<Robot>) =
        fleet.into_iter().partition(|r| canary.contains(&r.id));
    activate(&s, dep).await;
    let r = until(&s, &mut first, dep, 10, |r| r["current_phase"] == "rest").await;
    assert_eq!(r["state"], "running");
    // One robot of the rest installs; the other has not polled. Well past any wait, the
    // phase has not passed.
    rest[0].cycle(&s.http, &s.base).await;
    assert_eq!(rest[0].running, Some(dep));
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_millis(1500) {
        let r = rollout(&s, dep).await;
        assert_eq!(r["state"], "running", "{r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = rollout(&s, dep).await;
    assert_eq!(r["phases"][1]["status"], "in_progress");
    assert_eq!(r["phases"][1]["counts"]["waiting"], 1, "{r}");
    // The last robot fails: 0.5 against 0, paused, naming the phase.
    rest[1].fail = true;
    let r = until(&s, &mut rest, dep, 10, |r| r["state"] == "paused").await;
    let last = last_decision(&r);
    assert_eq!(last["action"], "paused");
    assert_eq!(last["phase"], "rest");
    let reason = last["reason"].as_str().unwrap();
    assert!(
        reason.contains("failure rate 0.500 (1 of 2 devices) in phase rest"),
        "{reason}"
    );
    assert_eq!(actions(&r), ["started", "started", "paused"]);
    assert_eq!(r["phases"][1]["status"], "paused");
}

each_backend!(robots_that_do_not_report_in_time_fail_the_phase_by_name);
/// Robots that report nothing within the phase's `report_timeout_seconds` fail its gate; the
/// reason counts and names them, the offline one said so.
async fn robots_that_do_not_report_in_time_fail_the_phase_by_name() {
    let s = start_with(|c| {
        quick(c);
        c.devices.offline_after_seconds = 3600;
    })
    .await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 3, json!({"fleet": "t"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
        "target_devices": [{"labels": {"fleet": "t"}}],
        "rollout": {"phases": [
            {"name": "all", "devices": {"percent": 100}, "report_timeout_seconds": 2}
        ]}}),
    )
    .await;
    let r = rollout(&s, dep).await;
    assert_eq!(r["phases"][0]["report_timeout_seconds"], 2);
    assert_eq!(r["phases"][0]["min_success_rate"], 1.0);
    // robot-0 installs; robot-1 is online (it sends heartbeats) but never polls; robot-2
    // was never seen.
    fleet.sort_by_key(|r| r.id);
    heartbeat(&s, fleet[1].id, &fleet[1].token, json!({})).await;
    activate(&s, dep).await;
    let started = Instant::now();
    let r = until(&s, &mut fleet[..1], dep, 10, |r| r["state"] != "running").await;
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(r["state"], "paused", "{r}");
    assert_eq!(
        last_decision(&r)["reason"],
        "2 devices did not report within 2 s in phase all: robot-1, robot-2 (offline); 1 offline"
    );
    // The timeout starts over at a resume: the robots that still say nothing fail it again.
    let r = act(&s, dep, "resume").await;
    assert_eq!(r.body["state"], "running");
    let r = until(&s, &mut fleet[..1], dep, 10, |r| r["state"] == "paused").await;
    assert_eq!(actions(&r), ["started", "paused", "resumed", "paused"]);
}

each_backend!(a_failure_after_the_rollout_completed_is_recorded_and_notified);
/// A failure reported after the rollout completed is judged against its phase: recorded as a
/// `late_failure` decision and notified to the gate rules' integrations; the rollout stays
/// completed.
async fn a_failure_after_the_rollout_completed_is_recorded_and_notified() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        quick(c);
        c.devices.offline_after_seconds = 3600;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    let gate = rule(
        &s,
        hook,
        json!({"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 90, "duration_seconds": 0}),
    )
    .await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 4, json!({"fleet": "l"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "l"}}],
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 1}},
                {"name": "rest", "devices": {"percent": 100}}
            ], "gate_alert_rule_ids": [gate]}}),
    )
    .await;
    activate(&s, dep).await;
    let r = until_state(&s, &mut fleet, dep, "completed", 15).await;
    // Completed only once every robot reported.
    assert_eq!(r["phases"][1]["counts"]["succeeded"], 3, "{r}");
    // A robot of the rest finds out later that the package broke it.
    let late = phase_devices(&r, 1)[0];
    let tok = fleet.iter().find(|x| x.id == late).unwrap().token.clone();
    let rep = s
        .post(
            &format!("{UPDATE}/{dep}/status"),
            &tok,
            json!({"status": "failed", "message": "lidar timeout on /scan"}),
        )
        .await;
    assert_eq!(rep.status, 202, "{}", rep.body);
    let t = Instant::now();
    let r = loop {
        let r = rollout(&s, dep).await;
        if last_decision(&r)["action"] == "late_failure" {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(r["state"], "completed");
    let reason = last_decision(&r)["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("late failure: failure rate 0.333 (1 of 3 devices) in phase rest"),
        "{reason}"
    );
    assert_eq!(
        actions(&r),
        ["started", "started", "completed", "late_failure"]
    );
    // The notice reaches the gate rule's integration, once.
    let t = Instant::now();
    loop {
        let got: Vec<String> = sink
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|q| String::from_utf8_lossy(&q.body).to_string())
            .collect();
        if let Some(b) = got
            .iter()
            .find(|b| b.contains("after the rollout completed"))
        {
            assert!(b.contains(&format!("deployment {dep}")), "{b}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no notice: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = Instant::now();
    while rollout(&s, dep).await["notice_owed"] != false {
        assert!(t.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Judged once: nothing more is decided.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(actions(&rollout(&s, dep).await).len(), 4);
}

async fn poll(s: &Srv, token: &str, etag: Option<&str>) -> reqwest::Response {
    let mut rb = s.http.get(format!("{}{UPDATE}", s.base)).bearer_auth(token);
    if let Some(e) = etag {
        rb = rb.header("If-None-Match", e);
    }
    rb.send().await.unwrap()
}

fn etag_of(r: &reqwest::Response) -> String {
    r.headers()
        .get("etag")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

each_backend!(a_failed_robot_retried_is_offered_the_package_again);
/// A member retries a robot that failed: the package is offered to it again under another
/// ETag, its failure no longer counts, and once it succeeds the paused rollout goes on after
/// a resume. Only a failed device of an active package can be retried; a viewer cannot.
async fn a_failed_robot_retried_is_offered_the_package_again() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 3, json!({"fleet": "r"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
        "target_devices": [{"labels": {"fleet": "r"}}],
        "rollout": {"phases": [
            {"name": "canary", "devices": {"count": 1}},
            {"name": "rest", "devices": {"percent": 100}}
        ]}}),
    )
    .await;
    let canary = phase_devices(&rollout(&s, dep).await, 0)[0];
    let retry = |dev: u64| format!("{DEPS}/{dep}/rollout/devices/{dev}/retry");
    // A draft cannot be retried.
    s.post(&retry(canary), s.key(), json!({}))
        .await
        .assert_error(409);
    activate(&s, dep).await;
    let robot = fleet.iter_mut().find(|r| r.id == canary).unwrap();
    robot.fail = true;
    let first = poll(&s, &robot.token.clone(), None).await;
    assert_eq!(first.status(), 200);
    let etag = etag_of(&first);
    robot.cycle(&s.http, &s.base).await;
    let r = until(&s, &mut Vec::<Robot>::new(), dep, 10, |r| {
        r["state"] == "paused"
    })
    .await;
    assert_eq!(r["phases"][0]["counts"]["failed"], 1);
    let tok = fleet.iter().find(|r| r.id == canary).unwrap().token.clone();
    assert_eq!(poll(&s, &tok, Some(&etag)).await.status(), 304);

    // Refusals: a viewer; an unknown device; a device that has not failed.
    let viewer = s.member_key("viewer").await;
    s.post(&retry(canary), &viewer, json!({}))
        .await
        .assert_error(403);
    s.post(&retry(999_999), s.key(), json!({}))
        .await
        .assert_error(404);
    let other = fleet.iter().find(|r| r.id != canary).unwrap().id;
    let d = s
        .post(&retry(other), s.key(), json!({}))
        .await
        .assert_error(409)
        .to_string();
    assert!(d.contains("has not failed"), "{d}");

    let r = s.post(&retry(canary), s.key(), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body,
        json!({"deployment_id": dep, "device_id": canary, "state": "retrying", "offers": 1})
    );
    // A second retry before it reported again: it has not failed (any more).
    s.post(&retry(canary), s.key(), json!({}))
        .await
        .assert_error(409);
    let view = rollout(&s, dep).await;
    assert_eq!(view["phases"][0]["counts"]["retrying"], 1, "{view}");
    assert_eq!(view["phases"][0]["failure_rate"], 0.0);
    let h = s
        .get(&format!("{DEV}/devices/{canary}/history"), s.key())
        .await;
    let reports = &h.body["items"][0]["reports"];
    let last = reports.as_array().unwrap().last().unwrap();
    assert_eq!(last["state"], "retrying", "{}", h.body);
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("offered again by"),
        "{last}"
    );
    // The robot's poll with its old ETag is now a new answer, under another ETag.
    let again = poll(&s, &tok, Some(&etag)).await;
    assert_eq!(again.status(), 200);
    let etag2 = etag_of(&again);
    assert_ne!(etag2, etag);
    assert_eq!(poll(&s, &tok, Some(&etag2)).await.status(), 304);
    // It installs again, this time well; a resume lets the rollout finish.
    for st in ["downloading", "installing", "succeeded"] {
        let r = s
            .post(
                &format!("{UPDATE}/{dep}/status"),
                &tok,
                json!({"status": st}),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.body);
    }
    act(&s, dep, "resume").await;
    for r in fleet.iter_mut() {
        r.fail = false;
    }
    let r = until_state(&s, &mut fleet, dep, "completed", 15).await;
    assert_eq!(r["phases"][0]["counts"]["succeeded"], 1);
}

each_backend!(a_robot_of_a_rolled_back_rollout_cannot_be_retried);
/// A robot that failed a rollout which then rolled back is not offered the package again:
/// the retry is 409 and names the rollout's state.
async fn a_robot_of_a_rolled_back_rollout_cannot_be_retried() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let mut fleet = robots(&s, 2, json!({"fleet": "r"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
        "target_devices": [{"labels": {"fleet": "r"}}],
        "rollout": {"phases": [
            {"name": "canary", "devices": {"count": 1}},
            {"name": "rest", "devices": {"percent": 100}}
        ], "on_failure": "rollback"}}),
    )
    .await;
    let canary = phase_devices(&rollout(&s, dep).await, 0)[0];
    activate(&s, dep).await;
    for r in fleet.iter_mut() {
        r.fail = r.id == canary;
    }
    until_state(&s, &mut fleet, dep, "rolled_back", 15).await;
    let d = s
        .post(
            &format!("{DEPS}/{dep}/rollout/devices/{canary}/retry"),
            s.key(),
            json!({}),
        )
        .await
        .assert_error(409)
        .to_string();
    assert!(d.contains("rolled_back"), "{d}");
}

each_backend!(a_robots_rollback_is_shown_in_its_history_and_the_rollout);
/// A robot reports its rollback hook's outcome after a failure: the device's history and the
/// rollout view show it; the service's own `retrying` cannot be reported.
async fn a_robots_rollback_is_shown_in_its_history_and_the_rollout() {
    let s = start_with(quick).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let fleet = robots(&s, 2, json!({"fleet": "b"})).await;
    let dep = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "b"}}],
            "rollout": {"phases": [{"name": "all", "devices": {"percent": 100}, "max_failure_rate": 1}]}}),
    )
    .await;
    activate(&s, dep).await;
    let report = |tok: String, body: Value| {
        let s = &s;
        async move { s.post(&format!("{UPDATE}/{dep}/status"), &tok, body).await }
    };
    let (a, b) = (&fleet[0], &fleet[1]);
    for (r, last) in [(a, "rolled_back"), (b, "rollback_failed")] {
        let rep = report(
            r.token.clone(),
            json!({"status": "failed", "message": "exit 3"}),
        )
        .await;
        assert_eq!(rep.status, 202);
        let rep = report(
            r.token.clone(),
            json!({"status": last, "message": "restore: no snapshot"}),
        )
        .await;
        assert_eq!(rep.status, 202, "{}", rep.body);
        assert_eq!(rep.body["status"], last);
    }
    report(a.token.clone(), json!({"status": "retrying"}))
        .await
        .assert_error(422);
    let r = rollout(&s, dep).await;
    let c = &r["phases"][0]["counts"];
    assert_eq!(
        (&c["rolled_back"], &c["rollback_failed"]),
        (&json!(1), &json!(1)),
        "{r}"
    );
    assert_eq!(r["phases"][0]["failure_rate"], 1.0);
    let shown = r["phases"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["id"] == b.id)
        .unwrap()
        .clone();
    assert_eq!(shown["state"], "rollback_failed");
    assert_eq!(shown["message"], "restore: no snapshot");
    let h = s
        .get(&format!("{DEV}/devices/{}/history", a.id), s.key())
        .await;
    let states: Vec<&str> = h.body["items"][0]["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["failed", "rolled_back"]);
    let d = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(
        d.body["device_results"],
        json!({"succeeded": 0, "failed": 2})
    );
}
