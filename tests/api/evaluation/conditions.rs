//! Each condition through the real server: device status offline and online, metric thresholds,
//! log patterns and several log rules at once, and deployment status, with the evaluator
//! restarting meanwhile.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::peers::Sink;
use crate::sessions::{device, session};

/// One matching line from a new device of project `default` (just after its heartbeat, as a
/// robot starting up sends them, when `beat`); the device.
async fn device_logs_a_line(s: &Srv, name: &str, message: &str, beat: bool) -> u64 {
    let (d, tok) = device(s, name).await;
    if beat {
        heartbeat(s, d, &tok, json!({})).await;
    }
    let sid = session(s, d, &tok).await;
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            &tok,
            json!([{"level": "error", "message": message}]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    d
}

each_backend!(device_status_offline_fires_once_and_resolves_on_the_next_heartbeat);
async fn device_status_offline_fires_once_and_resolves_on_the_next_heartbeat() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let hook = webhook(&s, &sink).await;
    let rid = rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "offline", "duration_seconds": 1}),
    )
    .await;
    let (d, tok) = device(&s, "r1").await;
    let (_never_seen, _) = device(&s, "r2").await;
    heartbeat(&s, d, &tok, json!({})).await;
    let beat = Instant::now();
    // Offline after 1 s, for 1 s: due 2 s after the heartbeat.
    let l = wait_alerts(&s, "state=firing", 1).await;
    let fired_after = beat.elapsed();
    assert!(
        fired_after >= Duration::from_millis(1900),
        "{fired_after:?}"
    );
    assert!(fired_after <= Duration::from_secs(4), "{fired_after:?}");
    let a = &l["items"][0];
    assert_eq!(a["rule_id"], rid);
    assert_eq!(a["device_id"], d);
    assert_eq!(a["severity"], "critical");
    assert_eq!(a["state"], "firing");
    assert_eq!(a["resolved_at"], Value::Null);
    assert_eq!(
        a["related_deployment"],
        Value::Null,
        "no package was activated"
    );
    assert!(a["summary"].as_str().unwrap().contains("r1"), "{a}");
    let got = sink.wait_for(1).await;
    assert_eq!(events(&got), ["alert.firing"]);
    assert_eq!(got[0].json()["alert"]["device_id"], d);
    let a = wait_notified(&s, a["id"].as_u64().unwrap()).await;
    assert_eq!(
        a["notifications"],
        json!([{"integration_id": hook, "success": true, "attempts": 1, "last_error": null, "pending": false, "event": "firing"}])
    );
    // Still offline: no second firing; the device never seen fires nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(alerts(&s, "").await["total"], 1);
    assert_eq!(sink.count(), 1);

    // Back online: resolved, notified once more.
    heartbeat(&s, d, &tok, json!({})).await;
    let l = wait_alerts(&s, "state=resolved", 1).await;
    assert!(l["items"][0]["resolved_at"].is_string());
    let got = sink.wait_for(2).await;
    assert_eq!(events(&got), ["alert.firing", "alert.resolved"]);
    assert_eq!(alerts(&s, &format!("rule_id={rid}")).await["total"], 1);
    assert_eq!(alerts(&s, "rule_id=999").await["total"], 0);
    s.get(&format!("{ALERTS}?state=maybe"), s.key())
        .await
        .assert_error(422);
}

each_backend!(metric_threshold_fires_after_holding_and_pairs_incident_trigger_and_resolve);
async fn metric_threshold_fires_after_holding_and_pairs_incident_trigger_and_resolve() {
    let sink = Sink::start().await;
    let pd = sink.url("/v2/enqueue");
    let s = start_with(move |c| {
        fast(c);
        c.devices.offline_after_seconds = 60;
        c.alerts.pagerduty_events_url = pd;
    })
    .await;
    let r = s
        .post(
            INTEGRATIONS,
            s.key(),
            json!({"type": "incident", "name": "pd", "config": {"integration_key": "rk-1", "severity_mapping": {"critical": "error"}}}),
        )
        .await;
    let pdi = r.body["id"].as_u64().unwrap();
    rule(
        &s,
        pdi,
        json!({"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 80.0, "duration_seconds": 3}),
    )
    .await;
    let (d, tok) = device(&s, "r1").await;
    let hot = Instant::now();
    heartbeat(&s, d, &tok, json!({"temp": 85.0})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    heartbeat(&s, d, &tok, json!({"temp": 90.0})).await;
    if hot.elapsed() < Duration::from_millis(2500) {
        assert_eq!(alerts(&s, "").await["total"], 0, "not yet held for 3 s");
    }
    let l = wait_alerts(&s, "state=firing", 1).await;
    assert!(
        hot.elapsed() >= Duration::from_millis(2900),
        "{:?}",
        hot.elapsed()
    );
    assert!(
        l["items"][0]["summary"]
            .as_str()
            .unwrap()
            .contains("temp > 80")
    );
    let got = sink.wait_for(1).await;
    let trigger = got[0].json();
    assert_eq!(trigger["event_action"], "trigger");
    assert_eq!(trigger["payload"]["severity"], "error");
    // Back under the threshold: resolved with the same dedup key.
    heartbeat(&s, d, &tok, json!({"temp": 70.0})).await;
    wait_alerts(&s, "state=resolved", 1).await;
    let got = sink.wait_for(2).await;
    let resolve = got[1].json();
    assert_eq!(resolve["event_action"], "resolve");
    assert_eq!(resolve["dedup_key"], trigger["dedup_key"]);
    // A spike that does not hold long enough fires nothing.
    heartbeat(&s, d, &tok, json!({"temp": 99.0})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    heartbeat(&s, d, &tok, json!({"temp": 10.0})).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(alerts(&s, "").await["total"], 1);
}

each_backend!(log_pattern_counts_in_its_window_and_resolves_when_the_count_falls);
async fn log_pattern_counts_in_its_window_and_resolves_when_the_count_falls() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 60;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "log_pattern", "pattern": "over(heat|temp)", "level": "error", "module": "arm", "count": 2, "window_seconds": 2}),
    )
    .await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let send = |entries: Value| {
        let (s, logs, tok) = (&s, logs.clone(), tok.clone());
        async move {
            let r = s.post(&logs, &tok, entries).await;
            assert_eq!(r.status, 202, "{}", r.body);
        }
    };
    // Near misses: wrong level, wrong module, no match; then one real match.
    send(json!([
        {"level": "warning", "module": "arm", "message": "overheat"},
        {"level": "error", "module": "base", "message": "overheat"},
        {"level": "error", "module": "arm", "message": "all good"},
        {"level": "error", "module": "arm", "message": "motor overheat"},
    ]))
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(alerts(&s, "").await["total"], 0, "one match of two");
    send(json!([{"level": "error", "module": "arm", "message": "overtemp again"}])).await;
    let l = wait_alerts(&s, "state=firing", 1).await;
    assert_eq!(l["items"][0]["device_id"], d);
    // No more matches: the count falls below 2 when the window passes.
    let l = wait_alerts(&s, "state=resolved", 1).await;
    assert_eq!(l["total"], 1);
    assert_eq!(
        events(&sink.wait_for(2).await),
        ["alert.firing", "alert.resolved"]
    );
}

/// A server whose evaluators restart after a 1.5 s backoff, a `deployment_status` rule on
/// `failed` notifying `sink`, and a device with an activated package: the device, and a
/// report of its result (202 asserted).
struct RolloutRule {
    s: Srv,
    _sink: Sink,
    pid: u64,
    device: u64,
    url: String,
}

impl RolloutRule {
    async fn start() -> Self {
        let sink = Sink::start().await;
        let s = start_with(|c| {
            fast(c);
            c.supervision.restart_backoff_ms = 1500;
            c.supervision.max_restart_backoff_ms = 1500;
        })
        .await;
        let hook = webhook(&s, &sink).await;
        rule(
            &s,
            hook,
            json!({"type": "deployment_status", "status": "failed"}),
        )
        .await;
        let (device, dep) = activated_package(&s).await;
        let pid = s.project_id("default");
        let url = format!("{}/{dep}/device-status", crate::deployments::DEPS);
        Self {
            s,
            _sink: sink,
            pid,
            device,
            url,
        }
    }

    async fn report(&self, status: &str) {
        let body = json!({"device_id": self.device, "status": status});
        let r = self.s.post(&self.url, self.s.key(), body).await;
        assert_eq!(r.status, 202, "{}", r.body);
    }

    /// Two injected panics: the first restarts the evaluator at once, the second waits out
    /// the backoff, so a result reported next finds no evaluator for its event.
    async fn restart_evaluator_slowly(&self) {
        for _ in 0..2 {
            self.s
                .rt()
                .alerts
                .inject_evaluator_panic(self.pid)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

each_backend!(a_failed_rollout_reported_while_the_evaluator_restarts_still_fires);
/// A rollout result that reaches the evaluator while it is down (restarting after a panic)
/// is not lost: the restarted evaluator starts from the stored results, so the rule fires.
async fn a_failed_rollout_reported_while_the_evaluator_restarts_still_fires() {
    let t = RolloutRule::start().await;
    t.restart_evaluator_slowly().await;
    t.report("failed").await;
    let l = wait_alerts(&t.s, "state=firing", 1).await;
    assert_eq!(l["items"][0]["device_id"], t.device, "{l}");
}

each_backend!(a_success_reported_while_the_evaluator_restarts_resolves_its_alert);
/// The other half of reconciliation: a success reported while the evaluator restarts
/// resolves the alert an earlier failure fired, even when the evaluator comes back past the
/// 15 minutes in which a missed result may fire (its clock is moved on): it reads the
/// latest result of each device it has firing, not only the project's recent results.
async fn a_success_reported_while_the_evaluator_restarts_resolves_its_alert() {
    let t = RolloutRule::start().await;
    t.report("failed").await;
    wait_alerts(&t.s, "state=firing", 1).await;
    t.restart_evaluator_slowly().await;
    t.report("succeeded").await;
    t.s.rt().clock.advance(Duration::from_secs(16 * 60));
    let l = wait_alerts(&t.s, "state=resolved", 1).await;
    assert_eq!(l["items"][0]["device_id"], t.device, "{l}");
    assert_eq!(alerts(&t.s, "state=firing").await["total"], 0);
}

each_backend!(deployment_status_fires_on_a_failed_rollout_and_resolves_on_success);
async fn deployment_status_fires_on_a_failed_rollout_and_resolves_on_success() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "deployment_status", "status": "failed"}),
    )
    .await;
    let (d, dep) = activated_package(&s).await;
    let deps = crate::deployments::DEPS;
    let report = |status: &'static str| {
        let (s, url) = (&s, format!("{deps}/{dep}/device-status"));
        async move {
            let r = s
                .post(&url, s.key(), json!({"device_id": d, "status": status}))
                .await;
            assert_eq!(r.status, 202, "{}", r.body);
        }
    };
    report("failed").await;
    let l = wait_alerts(&s, "state=firing", 1).await;
    // Fired within the correlation window of the activation: the package is named, in the
    // alert and in the notification.
    let rel = &l["items"][0]["related_deployment"];
    assert_eq!(
        (rel["id"].clone(), rel["name"].clone()),
        (json!(dep), json!("n")),
        "{l}"
    );
    assert!(rel["activated_at"].as_str().unwrap().ends_with('Z'));
    let first = sink.wait_for(1).await[0].json();
    assert_eq!(first["alert"]["related_deployment"]["id"], dep);
    report("failed").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        alerts(&s, "").await["total"],
        1,
        "fires once per device and rule"
    );
    report("succeeded").await;
    wait_alerts(&s, "state=resolved", 1).await;
    assert_eq!(
        events(&sink.wait_for(2).await),
        ["alert.firing", "alert.resolved"]
    );
    // A backtest sees the device's stored result (the latest, succeeded): a rule on
    // `succeeded` would have fired for it, one on `failed` no longer shows.
    let bt = |status: &str| {
        let s = &s;
        let body = json!({"condition": {"type": "deployment_status", "status": status}});
        async move {
            let r = s.post(&format!("{RULES}/backtest"), s.key(), body).await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.body
        }
    };
    let r = bt("succeeded").await;
    assert_eq!(r["devices"][0]["device_id"], d, "{r}");
    assert_eq!(r["devices"][0]["firings"].as_array().unwrap().len(), 1);
    assert_eq!(bt("failed").await["devices"], json!([]));
}

each_backend!(device_status_online_fires_after_the_duration_and_resolves_when_offline);
async fn device_status_online_fires_after_the_duration_and_resolves_when_offline() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 2;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "online", "duration_seconds": 2}),
    )
    .await;
    let (d, tok) = device(&s, "r1").await;
    let (_never, _) = device(&s, "r2").await;
    let first = Instant::now();
    for _ in 0..3 {
        heartbeat(&s, d, &tok, json!({})).await;
        if first.elapsed() < Duration::from_millis(1500) {
            assert_eq!(alerts(&s, "").await["total"], 0, "online for less than 2 s");
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    let l = wait_alerts(&s, "state=firing", 1).await;
    assert!(first.elapsed() >= Duration::from_millis(1900));
    assert_eq!(l["total"], 1, "r2 was never seen: {l}");
    assert_eq!(l["items"][0]["device_id"], d);
    // Silent: offline 2 s after the last heartbeat, and the alert resolves.
    let l = wait_alerts(&s, "state=resolved", 1).await;
    assert!(l["items"][0]["resolved_at"].is_string());
    assert_eq!(
        events(&sink.wait_for(2).await),
        ["alert.firing", "alert.resolved"]
    );
}

each_backend!(a_device_back_online_counts_the_duration_from_its_return);
/// A device that went offline and comes back counts an online rule's duration from its
/// return, also when a rule change makes the evaluator reread the devices just before the
/// returning heartbeat (which then finds the device online already).
async fn a_device_back_online_counts_the_duration_from_its_return() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let hook = webhook(&s, &sink).await;
    let r = rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "online", "duration_seconds": 3}),
    )
    .await;
    let (d, tok) = device(&s, "r1").await;
    heartbeat(&s, d, &tok, json!({})).await;
    // Offline after 1 s, and away for longer than the rule's duration.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(alerts(&s, "").await["total"], 0, "online for 1 s only");
    let p = s
        .patch(&format!("{RULES}/{r}"), s.key(), json!({"name": "renamed"}))
        .await;
    assert_eq!(p.status, 200, "{}", p.body);
    let back = Instant::now();
    while back.elapsed() < Duration::from_millis(2500) {
        heartbeat(&s, d, &tok, json!({})).await;
        assert_eq!(
            alerts(&s, "").await["total"],
            0,
            "online again for {:?} only",
            back.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    heartbeat(&s, d, &tok, json!({})).await;
    let l = wait_alerts(&s, "state=firing", 1).await;
    assert_eq!(l["items"][0]["device_id"], d);
    assert!(back.elapsed() >= Duration::from_millis(2900));
}

each_backend!(a_second_log_rule_fires_on_the_line_sent_right_after_it);
/// A rule added to a project whose evaluator already runs is judged on the next line, not
/// only after the evaluator's next tick (the slowest tick here makes the line come first
/// almost always; the second device sends no heartbeat, so the line alone must reread).
async fn a_second_log_rule_fires_on_the_line_sent_right_after_it() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 60;
        c.alerts.tick_ms = 1000;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    let first = rule(&s, hook, json!({"type": "log_pattern", "pattern": "panic"})).await;
    let d1 = device_logs_a_line(&s, "r1", "kernel panic", true).await;
    let l = wait_alerts(&s, &format!("rule_id={first}"), 1).await;
    assert_eq!(l["items"][0]["device_id"], d1);
    let second = rule(
        &s,
        hook,
        json!({"type": "log_pattern", "pattern": "overheat"}),
    )
    .await;
    let d2 = device_logs_a_line(&s, "r2", "motor overheat", false).await;
    let l = wait_alerts(&s, &format!("rule_id={second}"), 1).await;
    assert_eq!(l["items"][0]["device_id"], d2);
    assert_eq!(l["items"][0]["state"], "firing");
}

each_backend!(log_rules_whose_set_cannot_compile_are_matched_one_by_one_and_say_so);
/// When a project's log patterns cannot be compiled into one set, each rule is matched on
/// its own: both still fire, and each says so in its `health`.
async fn log_rules_whose_set_cannot_compile_are_matched_one_by_one_and_say_so() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 60;
    })
    .await;
    s.rt().alerts.inject_log_set_failure();
    let hook = webhook(&s, &sink).await;
    let a = rule(&s, hook, json!({"type": "log_pattern", "pattern": "panic"})).await;
    let b = rule(
        &s,
        hook,
        json!({"type": "log_pattern", "pattern": "overheat"}),
    )
    .await;
    let d1 = device_logs_a_line(&s, "r1", "kernel panic", true).await;
    let d2 = device_logs_a_line(&s, "r2", "motor overheat", true).await;
    let l = wait_alerts(&s, &format!("rule_id={a}"), 1).await;
    assert_eq!(l["items"][0]["device_id"], d1);
    let l = wait_alerts(&s, &format!("rule_id={b}"), 1).await;
    assert_eq!(l["items"][0]["device_id"], d2);
    for id in [a, b] {
        let v = s.get(&format!("{RULES}/{id}"), s.key()).await.body;
        assert_eq!(v["health"], "degraded", "{v}");
        let why = v["health_detail"].as_str().unwrap();
        assert!(why.contains("could not be compiled together"), "{why}");
    }
    // A metric rule beside them is untouched.
    let m = rule(
        &s,
        hook,
        json!({"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 90, "duration_seconds": 0}),
    )
    .await;
    let v = s.get(&format!("{RULES}/{m}"), s.key()).await.body;
    assert_eq!(
        (v["health"].as_str(), &v["health_detail"]),
        (Some("ok"), &Value::Null),
        "{v}"
    );
}
