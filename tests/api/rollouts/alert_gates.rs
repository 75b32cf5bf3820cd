//! A gate alert rule firing on a canary: the rollout pauses, or its started phases roll back,
//! and the rule's integration is told.

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::configurations::capsule;
use crate::deployments::DEPS;
use crate::evaluation::{fast, heartbeat, rule, webhook};
use crate::peers::Sink;

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
