//! Phased, health-gated rollouts through the real server, followed by simulated robots (a
//! helper that polls the device update API with its ETag and reports like a robot): 50
//! robots through three phases; a phase over its failure rate pausing (and a member's
//! resume, pause and abort); a gate alert rule firing on a canary (a `metric_threshold`
//! through heartbeats) pausing, or rolling the started phases back to the previous package,
//! and the notice reaching the rule's integration; kill -9 mid-rollout and continuing.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;
use crate::configurations::capsule;
use crate::deployments::{DEPS, device};
use crate::evaluation::{fast, heartbeat, rule, webhook};
use crate::peers::Sink;
use crate::updates::UPDATE;

/// A simulated robot: polls with its ETag; on a new package it reports downloading,
/// installing, rebooting, then succeeded (or failed when told to fail).
pub(crate) struct Robot {
    pub id: u64,
    pub token: String,
    pub fail: bool,
    pub etag: Option<String>,
    /// The package it runs (the last one it was told to run).
    pub running: Option<u64>,
    pub polls: u64,
    /// The status of its last poll.
    pub last_status: u16,
}

impl Robot {
    pub fn new(id: u64, token: String) -> Self {
        Self {
            id,
            token,
            fail: false,
            etag: None,
            running: None,
            polls: 0,
            last_status: 0,
        }
    }

    /// One poll, and the install when the answer is a package it does not run yet.
    pub async fn cycle(&mut self, c: &reqwest::Client, base: &str) -> Option<u64> {
        let mut rb = c.get(format!("{base}{UPDATE}")).bearer_auth(&self.token);
        if let Some(e) = &self.etag {
            rb = rb.header("If-None-Match", e);
        }
        let Ok(r) = rb.send().await else {
            return self.running;
        };
        self.polls += 1;
        self.last_status = r.status().as_u16();
        match r.status().as_u16() {
            200 => {
                self.etag = r
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                let body: Value = r.json().await.unwrap();
                let dep = body["deployment_id"].as_u64().unwrap();
                if self.running != Some(dep) {
                    let last = if self.fail { "failed" } else { "succeeded" };
                    for st in ["downloading", "installing", "rebooting", last] {
                        let r = c
                            .post(format!("{base}{UPDATE}/{dep}/status"))
                            .bearer_auth(&self.token)
                            .json(&json!({"status": st}))
                            .send()
                            .await;
                        if let Ok(r) = r {
                            assert_eq!(r.status(), 202, "{st}");
                        }
                    }
                    self.running = Some(dep);
                }
            }
            304 => {}
            204 => self.etag = None,
            other => panic!("poll answered {other}"),
        }
        self.running
    }
}

pub(crate) async fn robots(s: &Srv, n: usize, labels: Value) -> Vec<Robot> {
    let mut out = Vec::new();
    for i in 0..n {
        let (id, tok) = device(s, &format!("robot-{i}"), labels.clone()).await;
        out.push(Robot::new(id, tok));
    }
    out
}

pub(crate) async fn cycle_all(s: &Srv, fleet: &mut [Robot]) {
    for r in fleet.iter_mut() {
        r.cycle(&s.http, &s.base).await;
    }
}

pub(crate) async fn rollout(s: &Srv, dep: u64) -> Value {
    let r = s.get(&format!("{DEPS}/{dep}/rollout"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Cycles the fleet until the rollout's state is `state`.
pub(crate) async fn until_state(
    s: &Srv,
    fleet: &mut [Robot],
    dep: u64,
    state: &str,
    secs: u64,
) -> Value {
    let t = Instant::now();
    loop {
        cycle_all(s, fleet).await;
        let r = rollout(s, dep).await;
        if r["state"] == state {
            return r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "rollout never {state}: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn actions(r: &Value) -> Vec<String> {
    r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["action"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn phase_devices(r: &Value, phase: usize) -> Vec<u64> {
    r["phases"][phase]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect()
}

pub(crate) async fn create(s: &Srv, body: Value) -> u64 {
    let r = s.post(DEPS, s.key(), body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

/// A member's pause, resume or abort of the package's rollout.
pub(crate) async fn act(s: &Srv, dep: u64, action: &str) -> Resp {
    s.post(
        &format!("{DEPS}/{dep}/rollout/{action}"),
        s.key(),
        json!({}),
    )
    .await
}

pub(crate) async fn activate(s: &Srv, dep: u64) {
    let r = s
        .post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

pub(crate) fn quick(c: &mut fleetops::config::Config) {
    c.pipeline.rollout_tick_ms = 50;
}

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

/// A gate rule (cpu > 90, held 0 s) fires on a canary through a heartbeat: the rollout stops
/// within 2 s; with `rollback` the canaries return to the package they ran before.
async fn gate_scenario(on_failure: &str) {
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
    let old = capsule(&s, "nav", "1.0.0").await;
    let new = capsule(&s, "nav", "2.0.0").await;
    let mut fleet = robots(&s, 10, json!({"fleet": "c"})).await;
    let targets = json!([{"labels": {"fleet": "c"}}]);
    let a = create(
        &s,
        json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": old, "target_devices": targets}),
    )
    .await;
    activate(&s, a).await;
    cycle_all(&s, &mut fleet).await;
    assert!(fleet.iter().all(|r| r.running == Some(a)));

    let b = create(
        &s,
        json!({"name": "nav 2", "composition_tag": "nav-2", "capsule_id": new, "target_devices": targets,
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 2}, "min_wait_seconds": 3600, "max_failure_rate": 0.5},
                {"name": "rest", "devices": {"percent": 100}}
            ], "gate_alert_rule_ids": [gate], "on_failure": on_failure}}),
    )
    .await;
    activate(&s, b).await;
    cycle_all(&s, &mut fleet).await;
    let canary = phase_devices(&rollout(&s, b).await, 0);
    for r in &fleet {
        let want = if canary.contains(&r.id) { b } else { a };
        assert_eq!(r.running, Some(want), "robot {}", r.id);
    }

    // A healthy heartbeat changes nothing; a hot one on a canary stops the rollout.
    let hot = fleet.iter().find(|r| r.id == canary[0]).unwrap();
    heartbeat(&s, hot.id, &hot.token, json!({"cpu": 40})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rollout(&s, b).await["state"], "running");
    let fired = Instant::now();
    heartbeat(&s, hot.id, &hot.token, json!({"cpu": 97})).await;
    let want = if on_failure == "pause" {
        "paused"
    } else {
        "rolled_back"
    };
    let r = loop {
        let r = rollout(&s, b).await;
        if r["state"] == want {
            break r;
        }
        assert!(fired.elapsed() < Duration::from_secs(5), "{r}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = fired.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let last = r["decisions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["action"], want);
    let reason = last["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("alert rule {gate} fired on device {}", canary[0])),
        "{reason}"
    );

    // The robots: paused keeps the canaries on b; a rollback returns them to a.
    cycle_all(&s, &mut fleet).await;
    let expect_canary = if on_failure == "pause" { b } else { a };
    for r in &fleet {
        let want = if canary.contains(&r.id) {
            expect_canary
        } else {
            a
        };
        assert_eq!(r.running, Some(want), "robot {}", r.id);
    }

    // The notice reaches the gate rule's integration (besides the alert itself).
    let t = Instant::now();
    loop {
        let got = sink.requests.lock().unwrap().clone();
        if got
            .iter()
            .any(|q| String::from_utf8_lossy(&q.body).contains(&format!("deployment {b})")))
        {
            let body = got
                .iter()
                .map(|q| String::from_utf8_lossy(&q.body).to_string())
                .find(|b| b.contains("rollout"))
                .unwrap();
            assert!(
                body.contains(if on_failure == "pause" {
                    "rollout paused"
                } else {
                    "rollout rolled back"
                }),
                "{body}"
            );
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no notice: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = Instant::now();
    while rollout(&s, b).await["notice_owed"] != false {
        assert!(t.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The gate rule cannot go while it gates an open rollout.
    if on_failure == "pause" {
        s.delete(&format!("{DEV}/alert-rules/{gate}"), s.key())
            .await
            .assert_error(409);
        // Deprecating the package ends its rollout; its canaries return to a.
        let r = s
            .post(&format!("{DEPS}/{b}/deprecate"), s.key(), json!({}))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        let r = rollout(&s, b).await;
        assert_eq!(r["state"], "aborted");
        assert!(
            r["decisions"].as_array().unwrap().last().unwrap()["reason"]
                .as_str()
                .unwrap()
                .contains("deprecated")
        );
        cycle_all(&s, &mut fleet).await;
        assert!(fleet.iter().all(|r| r.running == Some(a)));
        let r = s
            .delete(&format!("{DEV}/alert-rules/{gate}"), s.key())
            .await;
        assert_eq!(r.status, 204, "{}", r.body);
    }
    println!("gate {on_failure}: heartbeat -> {want} in {took:?}");
}

each_backend!(a_gate_rule_firing_on_a_canary_pauses_the_rollout);
async fn a_gate_rule_firing_on_a_canary_pauses_the_rollout() {
    gate_scenario("pause").await;
}

each_backend!(a_gate_rule_firing_on_a_canary_rolls_the_started_phases_back);
async fn a_gate_rule_firing_on_a_canary_rolls_the_started_phases_back() {
    gate_scenario("rollback").await;
}

each_backend!(a_rollout_continues_where_it_stood_after_kill_9);
/// kill -9 of the real binary while a rollout is between phases: after the restart the
/// controller continues from the stored decisions (no phase started twice, none skipped).
async fn a_rollout_continues_where_it_stood_after_kill_9() {
    use crate::cli::{client, field, serve};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[pipeline]\nrollout_tick_ms = 50\n[tiers.free]\nrequests_per_minute = 10000000\n",
    )
    .unwrap();
    let mut p = serve(dir.path(), &[]);
    let c = client();
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let secret = field(&p.stdout, "project secret:").unwrap().to_string();
    let cap = crate::crash::publish(&c, &p.base, &secret, "nav", "1.0.0")
        .await
        .unwrap();
    let mut fleet = Vec::new();
    for i in 0..12 {
        let r: Value = c
            .post(format!("{}{DEV}/devices", p.base))
            .bearer_auth(&key)
            .json(&json!({"name": format!("k{i}"), "labels": {"fleet": "k"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        fleet.push(Robot::new(
            r["id"].as_u64().unwrap(),
            r["device_token"].as_str().unwrap().to_string(),
        ));
    }
    let r: Value = c
        .post(format!("{}{DEPS}", p.base))
        .bearer_auth(&key)
        .json(
            &json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "k"}}],
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 3}, "min_wait_seconds": 1},
                {"name": "mid", "devices": {"count": 4}, "min_wait_seconds": 1},
                {"name": "rest", "devices": {"percent": 100}}
            ]}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let dep = r["id"].as_u64().unwrap();
    let act = c
        .post(format!("{}{DEPS}/{dep}/activate", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(act.status(), 200);
    let view = |base: String| {
        let (c, key) = (c.clone(), key.clone());
        async move {
            c.get(format!("{base}{DEPS}/{dep}/rollout"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // Follow it until the middle phase has started, then kill.
    let t = Instant::now();
    loop {
        for r in fleet.iter_mut() {
            r.cycle(&c, &p.base).await;
        }
        if view(p.base.clone()).await["current_phase"] == "mid" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "mid never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);
    let p = serve(dir.path(), &[]);
    let r = view(p.base.clone()).await;
    assert_eq!(r["current_phase"], "mid", "{r}");
    assert_eq!(r["state"], "running");
    let t = Instant::now();
    let r = loop {
        for r in fleet.iter_mut() {
            r.cycle(&c, &p.base).await;
        }
        let r = view(p.base.clone()).await;
        if r["state"] == "completed" {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "never completed: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let phases: Vec<&str> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["canary", "mid", "rest", "rest"], "{r}");
    // The last phase passed only once every robot had reported.
    assert!(fleet.iter().all(|r| r.running == Some(dep)));
}

/// Publishes a capsule that declares the commit it was built from.
async fn publish_from(s: &Srv, name: &str, version: &str, source: Value) -> Resp {
    use crate::capsules::{archive, secret_post, sha};
    let bytes = archive(".tar", format!("{name} {version}").as_bytes());
    let caps = "/api/v1/projects/default/default/capsules";
    let r = secret_post(
        s,
        &format!("{caps}/upload-url"),
        &s.admin.project_secret,
        json!({"name": name, "version": version, "capsule_type": "SW", "file_format": ".tar",
               "file_size_bytes": bytes.len(), "source": source}),
    )
    .await;
    if r.status != 201 {
        return r;
    }
    let id = r.body["capsule_id"].as_u64().unwrap();
    let put = s
        .http
        .put(r.body["upload_url"].as_str().unwrap())
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        s,
        &format!("{caps}/{id}/confirm"),
        &s.admin.project_secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

each_backend!(provenance_from_commit_to_robot_and_the_passed_test_run_policy);
/// device → package → capsule → commit → test runs, on the package, the device update API
/// and an alert naming the device; and the policy that wants a passed run of the commit.
async fn provenance_from_commit_to_robot_and_the_passed_test_run_policy() {
    use crate::webhooks::{REPO, SECRET, link, pr, run};
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
        c.scm.webhook_secret = SECRET.into();
    })
    .await;
    link(&s, REPO).await;
    let sha = "c0ffee".repeat(6) + "abcd";
    let source = json!({"repository": REPO, "commit_sha": sha.to_uppercase()});
    for bad in [
        json!({"repository": REPO, "commit_sha": "xyz"}),
        json!({"repository": REPO, "commit_sha": &sha[..12]}),
        json!({"repository": "no-slash", "commit_sha": sha}),
        json!({"repository": REPO}),
    ] {
        let r = publish_from(&s, "nav", "0.9.0", bad.clone()).await;
        assert_eq!(r.status, 422, "{bad}: {}", r.body);
    }
    let cap = publish_from(&s, "nav", "1.0.0", source).await.body["id"]
        .as_u64()
        .unwrap();
    let bare = capsule(&s, "arm", "1.0.0").await;
    let c = s
        .get(
            &format!("/api/v1/projects/default/default/capsules/{cap}"),
            s.key(),
        )
        .await;
    assert_eq!(
        c.body["source"],
        json!({"repository": REPO, "commit_sha": sha})
    );
    assert_eq!(c.body["test_runs"], json!([]));

    // The policy: off by default; an admin turns it on.
    let policy = "/api/v1/projects/default/default/policy";
    let r = s.get(policy, s.key()).await;
    assert_eq!(r.body, json!({"require_passed_test_run": false}));
    s.patch(policy, s.key(), json!({"require_passed_test_run": "yes"}))
        .await
        .assert_error(422);
    let r = s
        .patch(policy, s.key(), json!({"require_passed_test_run": true}))
        .await;
    assert_eq!(r.body, json!({"require_passed_test_run": true}));

    let (dev, tok) = device(&s, "r1", json!({})).await;
    let body = json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap, "target_devices": [dev]});
    let dep = create(&s, body.clone()).await;
    // No run of the commit yet: the plan names it, activation is 409 naming it.
    let p = s.post(&format!("{DEPS}/plan"), s.key(), body).await;
    assert_eq!(p.body["blocked"], true);
    assert_eq!(p.body["blockers"][0]["status"], 409);
    assert!(
        p.body["blockers"][0]["reason"]
            .as_str()
            .unwrap()
            .contains(&sha)
    );
    let act = format!("{DEPS}/{dep}/activate");
    let d = s
        .post(&act, s.key(), json!({}))
        .await
        .assert_error(409)
        .to_string();
    assert!(d.contains(&sha) && d.contains(REPO), "{d}");
    // A capsule that declares no commit cannot pass the policy either.
    let bare_dep = create(
        &s,
        json!({"name": "arm", "composition_tag": "arm-1", "capsule_id": bare, "target_devices": [dev]}),
    )
    .await;
    let d = s
        .post(&format!("{DEPS}/{bare_dep}/activate"), s.key(), json!({}))
        .await
        .assert_error(409)
        .to_string();
    assert!(d.contains("declares no source commit"), "{d}");

    // A pull request of the commit: its run is queued, still not passed.
    let d = run(&s, "pull_request", &pr("opened", 5, &sha, false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let run_id = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    let prov = &r.body["provenance"];
    assert_eq!(prov["capsule"]["id"], cap);
    assert_eq!(prov["source"]["commit_sha"], sha);
    assert_eq!(prov["test_runs"][0]["id"], run_id);
    assert_eq!(prov["test_runs"][0]["status"], "queued");
    assert_eq!(prov["passed_test_run"], false);
    s.post(&act, s.key(), json!({})).await.assert_error(409);

    // The runner passes it: activation goes through.
    let claim = s
        .post(&format!("{DEV}/test-runs/claim"), s.key(), json!({}))
        .await;
    assert_eq!(claim.body["id"], run_id);
    let r = s
        .post(
            &format!("{DEV}/test-runs/{run_id}/complete"),
            s.key(),
            json!({"status": "passed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.post(&act, s.key(), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // The robot sees the chain.
    let r = crate::updates::poll(&s, &tok, None).await;
    assert_eq!(r.status, 200);
    let prov = &r.body["provenance"];
    assert_eq!(prov["deployment"]["id"], dep);
    assert_eq!(
        prov["source"],
        json!({"repository": REPO, "commit_sha": sha})
    );
    assert_eq!(prov["test_runs"][0]["status"], "passed");
    assert_eq!(prov["passed_test_run"], true);

    // So does an alert naming the device.
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 90, "duration_seconds": 0}),
    )
    .await;
    heartbeat(&s, dev, &tok, json!({"cpu": 99})).await;
    let a = crate::evaluation::wait_alerts(&s, "state=firing", 1).await;
    let prov = &a["items"][0]["provenance"];
    assert_eq!(prov["deployment"]["id"], dep, "{a}");
    assert_eq!(prov["capsule"]["version"], "1.0.0");
    assert_eq!(prov["source"]["commit_sha"], sha);
    assert_eq!(prov["test_runs"][0]["id"], run_id);
}
