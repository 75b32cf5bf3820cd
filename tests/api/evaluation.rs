//! The rule evaluator and the notifier through the real server: every condition type fires
//! once and resolves, with short durations, notifications reach a real HTTP sink, failures
//! are retried with backoff (and `Retry-After`), and a restart neither loses nor repeats an
//! alert.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;
use crate::peers::{Recorded, Reply, Sink};
use crate::sessions::{device, session};

const INTEGRATIONS: &str = "/api/v1/organizations/default/projects/default/integrations";
const RULES: &str = "/api/v1/organizations/default/projects/default/alert-rules";
const ALERTS: &str = "/api/v1/organizations/default/projects/default/alerts";

pub(crate) fn fast(c: &mut fleetops::config::Config) {
    c.alerts.allow_private_targets = true;
    c.alerts.tick_ms = 50;
    c.alerts.retry_base_ms = 200;
    c.alerts.request_timeout_seconds = 2;
    c.devices.offline_after_seconds = 1;
}

pub(crate) async fn webhook(s: &Srv, sink: &Sink) -> u64 {
    let r = s
        .post(
            INTEGRATIONS,
            s.key(),
            json!({"type": "webhook", "name": "sink", "config": {"url": sink.url("/alerts"), "signing_secret": "s3cret"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

pub(crate) async fn rule(s: &Srv, integration: u64, condition: Value) -> u64 {
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "r", "condition": condition, "severity": "critical", "integration_ids": [integration]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

pub(crate) async fn heartbeat(s: &Srv, d: u64, tok: &str, metrics: Value) {
    let r = s
        .post(
            &format!("{DEV}/devices/{d}/heartbeat"),
            tok,
            json!({"metrics": metrics}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
}

/// A device and an activated package targeting it: (device id, package id).
async fn activated_package(s: &Srv) -> (u64, u64) {
    let nav = crate::configurations::capsule(s, "nav", "1.0.0").await;
    let (d, _) = device(s, "r1").await;
    let deps = crate::deployments::DEPS;
    let r = s
        .post(
            deps,
            s.key(),
            json!({"name": "n", "composition_tag": "t", "capsule_id": nav, "target_devices": [d]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{deps}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    (d, dep)
}

pub(crate) async fn alerts(s: &Srv, query: &str) -> Value {
    let r = s.get(&format!("{ALERTS}?{query}"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Waits until the alert list (with `query`) has `n` items.
pub(crate) async fn wait_alerts(s: &Srv, query: &str, n: usize) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        last = alerts(s, query).await;
        if last["items"].as_array().map_or(0, Vec::len) >= n {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} alerts ({query}) never came: {last}");
}

fn events(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .map(|r| r.header("x-fleetops-event").unwrap_or("").to_string())
        .collect()
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

/// The alert once its notifications are no longer pending.
async fn wait_notified(s: &Srv, id: u64) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        let r = s.get(&format!("{ALERTS}/{id}"), s.key()).await;
        last = r.body;
        if last["notifications"]
            .as_array()
            .is_some_and(|n| !n.is_empty() && n.iter().all(|x| x["pending"] == false))
        {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("alert {id} was never notified: {last}");
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

each_backend!(notifications_retry_5xx_and_429_with_backoff_and_stop_at_other_4xx);
async fn notifications_retry_5xx_and_429_with_backoff_and_stop_at_other_4xx() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.alerts.max_attempts = 4;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "deployment_status", "status": "failed"}),
    )
    .await;
    sink.script([
        Reply::Status(500, vec![]),
        Reply::Status(429, vec![("retry-after", "1".into())]),
        Reply::Status(200, vec![]),
        // The resolve: refused for good.
        Reply::Status(400, vec![]),
    ]);
    let (d, dep) = activated_package(&s).await;
    let deps = crate::deployments::DEPS;
    let url = format!("{deps}/{dep}/device-status");
    s.post(&url, s.key(), json!({"device_id": d, "status": "failed"}))
        .await;
    let got = sink.wait_for(3).await;
    // Backoff: 200 ms after the 500, then the 429's Retry-After of 1 s.
    let gap1 = got[1].at - got[0].at;
    let gap2 = got[2].at - got[1].at;
    assert!(gap1 >= Duration::from_millis(180), "{gap1:?}");
    assert!(gap2 >= Duration::from_millis(950), "{gap2:?}");
    assert_eq!(
        got[0].header("x-fleetops-delivery"),
        got[2].header("x-fleetops-delivery"),
        "one delivery id across the attempts of one notification"
    );
    let id = wait_alerts(&s, "", 1).await["items"][0]["id"]
        .as_u64()
        .unwrap();
    let a = wait_notified(&s, id).await;
    assert_eq!(a["notifications"][0]["success"], true);
    assert_eq!(a["notifications"][0]["attempts"], 3);
    assert_eq!(a["notifications"][0]["last_error"], Value::Null);

    s.post(
        &url,
        s.key(),
        json!({"device_id": d, "status": "succeeded"}),
    )
    .await;
    sink.wait_for(4).await;
    let a = wait_notified(&s, id).await;
    let n = &a["notifications"][0];
    assert_eq!(
        (
            n["event"].clone(),
            n["success"].clone(),
            n["attempts"].clone()
        ),
        (json!("resolved"), json!(false), json!(1))
    );
    assert_eq!(n["last_error"], "HTTP 400");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(sink.count(), 4, "a 400 is not retried");
    // Each attempt's outcome is counted on /metrics.
    assert_eq!(s.metric("fleetops_alert_notifications_sent").await, 1.0);
    assert_eq!(s.metric("fleetops_alert_notifications_retried").await, 2.0);
    assert_eq!(s.metric("fleetops_alert_notifications_failed").await, 1.0);
}

each_backend!(a_restart_keeps_a_firing_alert_without_firing_it_again);
async fn a_restart_keeps_a_firing_alert_without_firing_it_again() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "offline", "duration_seconds": 1}),
    )
    .await;
    let (d, tok) = device(&s, "r1").await;
    heartbeat(&s, d, &tok, json!({})).await;
    let l = wait_alerts(&s, "state=firing", 1).await;
    let id = l["items"][0]["id"].clone();
    sink.wait_for(1).await;
    let s = s.restart_with(fast).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let l = alerts(&s, "").await;
    assert_eq!(l["total"], 1, "{l}");
    assert_eq!(l["items"][0]["state"], "firing");
    assert_eq!(sink.count(), 1, "not notified again");
    heartbeat(&s, d, &tok, json!({})).await;
    let l = wait_alerts(&s, "state=resolved", 1).await;
    assert_eq!(l["items"][0]["id"], id);
    assert_eq!(
        events(&sink.wait_for(2).await),
        ["alert.firing", "alert.resolved"]
    );
}

each_backend!(a_pending_notification_is_sent_after_a_restart);
async fn a_pending_notification_is_sent_after_a_restart() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.alerts.max_attempts = 10;
        c.alerts.retry_base_ms = 3_000;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "offline", "duration_seconds": 0}),
    )
    .await;
    sink.script([Reply::Status(503, vec![])]);
    let (d, tok) = device(&s, "r1").await;
    heartbeat(&s, d, &tok, json!({})).await;
    sink.wait_for(1).await;
    let id = wait_alerts(&s, "", 1).await["items"][0]["id"]
        .as_u64()
        .unwrap();
    let a = s.get(&format!("{ALERTS}/{id}"), s.key()).await.body;
    assert_eq!(a["notifications"][0]["pending"], true, "{a}");
    assert_eq!(a["notifications"][0]["last_error"], "HTTP 503");
    // Stopped before the retry is due (1 s after the first attempt); the new server sends it.
    let s = s.restart_with(fast).await;
    let restarted = Instant::now();
    let a = wait_notified(&s, id).await;
    assert_eq!(a["notifications"][0]["success"], true, "{a}");
    assert_eq!(a["notifications"][0]["attempts"], 2);
    let got = sink.wait_for(2).await;
    assert_eq!(got.len(), 2);
    assert!(
        got[1].at >= restarted,
        "the retry came from the restarted server"
    );
}

each_backend!(backtest_replays_stored_history_without_sending_anything);
async fn backtest_replays_stored_history_without_sending_anything() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 60;
    })
    .await;
    let clock = s.running.as_ref().unwrap().runtime.clock.clone();
    let hook = webhook(&s, &sink).await;
    let (d, tok) = device(&s, "r1").await;
    let (_quiet, _) = device(&s, "r2").await;
    // temp: 90 at t0, 95 at t0+20 s, 10 at t0+40 s; then silence for 200 s.
    let t0 = clock.now_ms();
    for (temp, step) in [(90.0, 20), (95.0, 20), (10.0, 200)] {
        heartbeat(&s, d, &tok, json!({"temp": temp})).await;
        clock.advance(Duration::from_secs(step));
    }
    let bt = |condition: Value| {
        let s = &s;
        async move {
            let r = s
                .post(
                    &format!("{RULES}/backtest"),
                    s.key(),
                    json!({"condition": condition}),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            r.body
        }
    };
    let ms = |v: &Value| fleetops_actors::clock::parse_ms(v.as_str().unwrap()).unwrap();
    let r = bt(json!({"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 80, "duration_seconds": 30})).await;
    assert_eq!(r["devices_evaluated"], 2);
    let f = &r["devices"][0]["firings"];
    assert_eq!(r["devices"][0]["device_id"], d);
    assert_eq!(f.as_array().unwrap().len(), 1, "{r}");
    assert!((ms(&f[0]["fired_at"]) - (t0 + 30_000)).abs() < 2_000, "{r}");
    assert!(
        (ms(&f[0]["resolved_at"]) - (t0 + 40_000)).abs() < 2_000,
        "{r}"
    );
    // Offline 60 s after the last heartbeat (t0+40 s), for 30 s: fired at t0+130 s, unresolved.
    let r = bt(json!({"type": "device_status", "status": "offline", "duration_seconds": 30})).await;
    let f = &r["devices"][0]["firings"];
    assert_eq!(f.as_array().unwrap().len(), 1, "{r}");
    assert!(
        (ms(&f[0]["fired_at"]) - (t0 + 130_000)).abs() < 2_000,
        "{r}"
    );
    assert_eq!(f[0]["resolved_at"], Value::Null);
    // A threshold never held long enough fires nothing.
    let r = bt(json!({"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 92, "duration_seconds": 30})).await;
    assert_eq!(r["devices"], json!([]));
    // Logs, by their own timestamps: two error lines of module arm within 10 s fire at the
    // second and resolve 10 s after the first of them; other levels and modules do not count.
    let sid = session(&s, d, &tok).await;
    let at = |secs: i64| fleetops_actors::clock::fmt_ms(t0 + secs * 1000);
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            &tok,
            json!([
                {"timestamp": at(1), "level": "error", "module": "arm", "message": "overheat 1"},
                {"timestamp": at(2), "level": "info", "module": "arm", "message": "overheat (info)"},
                {"timestamp": at(3), "level": "error", "module": "base", "message": "overheat (base)"},
                {"timestamp": at(4), "level": "error", "module": "arm", "message": "overheat 2"},
            ]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let r = bt(json!({"type": "log_pattern", "pattern": "overheat", "level": "error", "module": "arm", "count": 2, "window_seconds": 10})).await;
    let f = &r["devices"][0]["firings"];
    assert_eq!(f.as_array().unwrap().len(), 1, "{r}");
    assert_eq!(ms(&f[0]["fired_at"]), t0 + 4_000, "{r}");
    assert_eq!(ms(&f[0]["resolved_at"]), t0 + 11_000, "{r}");
    assert_eq!(r["log_lines_scanned"], 4);
    // Bad input.
    for bad in [
        json!({"condition": {"type": "log_pattern", "pattern": "("}}),
        json!({"condition": {"type": "deployment_status", "status": "failed"}, "from": "yesterday"}),
        json!({"condition": {"type": "deployment_status", "status": "failed"}, "device_group_ids": [999]}),
    ] {
        s.post(&format!("{RULES}/backtest"), s.key(), bad)
            .await
            .assert_error(422);
    }
    // Nothing was sent or recorded.
    let _ = hook;
    assert_eq!(alerts(&s, "").await["total"], 0);
    assert_eq!(sink.count(), 0);
}

each_backend!(alerts_resolve_when_devices_groups_or_rules_change);
/// The states follow the fleet and the rules: a deleted device, a device that leaves the group
/// a rule names, and a rule changed or disabled while firing all resolve (notified), and a
/// rule enabled again judges devices by their current heartbeats.
async fn alerts_resolve_when_devices_groups_or_rules_change() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 2;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    let (d1, tok1) = device(&s, "r1").await;
    let (d2, tok2) = device(&s, "r2").await;
    let g = s
        .post(
            &format!("{DEV}/device-groups"),
            s.key(),
            json!({"name": "g", "device_ids": [d1, d2]}),
        )
        .await;
    let gid = g.body["id"].as_u64().unwrap();
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "hot", "severity": "warning", "integration_ids": [hook], "device_group_ids": [gid],
                   "condition": {"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 80, "duration_seconds": 0}}),
        )
        .await;
    let rid = r.body["id"].as_u64().unwrap();
    heartbeat(&s, d1, &tok1, json!({"temp": 90})).await;
    heartbeat(&s, d2, &tok2, json!({"temp": 90})).await;
    wait_alerts(&s, "state=firing", 2).await;

    // d2 leaves the group: its alert resolves.
    s.patch(
        &format!("{DEV}/device-groups/{gid}"),
        s.key(),
        json!({"device_ids": [d1]}),
    )
    .await;
    let l = wait_alerts(&s, "state=resolved", 1).await;
    assert_eq!(l["items"][0]["device_id"], d2);

    // The rule changes while d1's alert fires: resolved (and notified), then judged again.
    let r = s
        .patch(
            &format!("{RULES}/{rid}"),
            s.key(),
            json!({"condition": {"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 95, "duration_seconds": 0}}),
        )
        .await;
    assert_eq!(r.status, 200);
    wait_alerts(&s, "state=resolved", 2).await;
    assert_eq!(
        alerts(&s, "state=firing").await["total"],
        0,
        "90 is not above 95"
    );

    // A device deleted while firing: resolved.
    s.patch(
        &format!("{RULES}/{rid}"),
        s.key(),
        json!({"condition": {"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 80, "duration_seconds": 0}}),
    )
    .await;
    wait_alerts(&s, "state=firing", 1).await;
    assert_eq!(
        s.delete(&format!("{DEV}/devices/{d1}"), s.key())
            .await
            .status,
        204
    );
    wait_alerts(&s, "state=resolved", 3).await;
    assert_eq!(alerts(&s, "state=firing").await["total"], 0);
    let ev = events(&sink.wait_for(6).await);
    assert_eq!(
        (
            ev.iter().filter(|e| *e == "alert.firing").count(),
            ev.iter().filter(|e| *e == "alert.resolved").count()
        ),
        (3, 3),
        "{ev:?}"
    );

    // Disabled while nothing listens, then enabled again: d2, heartbeating, is not offline.
    let off = s
        .post(
            RULES,
            s.key(),
            json!({"name": "down", "severity": "critical", "integration_ids": [hook], "enabled": false,
                   "condition": {"type": "device_status", "status": "offline", "duration_seconds": 0}}),
        )
        .await;
    let oid = off.body["id"].as_u64().unwrap();
    s.patch(
        &format!("{RULES}/{rid}"),
        s.key(),
        json!({"enabled": false}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    heartbeat(&s, d2, &tok2, json!({})).await;
    s.patch(&format!("{RULES}/{oid}"), s.key(), json!({"enabled": true}))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        alerts(&s, &format!("rule_id={oid}")).await["total"],
        0,
        "d2 heartbeated just now"
    );
}

each_backend!(log_batches_over_the_budget_are_counted_not_queued);
/// Past the byte budget for batches waiting on evaluators, a batch is not seen by the rules
/// (the ingest itself still answers 202) and `/metrics` counts it.
async fn log_batches_over_the_budget_are_counted_not_queued() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.alerts.max_log_bytes_in_flight = 1;
    })
    .await;
    let hook = webhook(&s, &sink).await;
    rule(&s, hook, json!({"type": "log_pattern", "pattern": "panic"})).await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            &tok,
            json!([{"level": "error", "module": "m", "message": "kernel panic"}]),
        )
        .await;
    assert_eq!(r.status, 202);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(alerts(&s, "").await["total"], 0);
    assert_eq!(s.metric("fleetops_alert_log_batches_dropped").await, 1.0);
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

each_backend!(evaluator_and_notifier_panics_under_load_are_contained);
/// A panic injected into the rule evaluator and into the notifier while heartbeats and log
/// batches keep arriving: every request still succeeds, both actors restart (counted), and
/// the restarted pair still fires an alert and delivers its notification.
async fn evaluator_and_notifier_panics_under_load_are_contained() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "offline", "duration_seconds": 0}),
    )
    .await;
    let (busy, busy_tok) = device(&s, "busy").await;
    let sid = session(&s, busy, &busy_tok).await;
    let (quiet, quiet_tok) = device(&s, "quiet").await;
    let rt = s.rt();
    let pid = s.project_id("default");
    let restarts = s.metric("fleetops_actor_restarts").await;
    // Load: heartbeats and log batches from the busy device, all of which must succeed.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = tokio::spawn({
        let (http, base, tok, stop) = (
            s.http.clone(),
            s.base.clone(),
            busy_tok.clone(),
            stop.clone(),
        );
        async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let beat = http
                    .post(format!("{base}{DEV}/devices/{busy}/heartbeat"))
                    .bearer_auth(&tok)
                    .json(&json!({}))
                    .send()
                    .await
                    .unwrap()
                    .status();
                assert_eq!(beat, 202);
                let logs = http
                    .post(format!("{base}{DEV}/sessions/{sid}/logs"))
                    .bearer_auth(&tok)
                    .json(&json!([{"level": "info", "message": "working"}]))
                    .send()
                    .await
                    .unwrap()
                    .status();
                assert_eq!(logs, 202);
                n += 1;
            }
            n
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    rt.alerts.inject_evaluator_panic(pid).await.unwrap();
    rt.alerts.inject_notifier_panic(pid).await.unwrap();
    assert!(
        eventually(5, || async {
            s.metric("fleetops_actor_restarts").await >= restarts + 2.0
        })
        .await,
        "both actors restarted"
    );
    // After the restarts: the quiet device's one heartbeat, then silence, fires and notifies.
    heartbeat(&s, quiet, &quiet_tok, json!({})).await;
    let l = wait_alerts(&s, "state=firing", 1).await;
    assert_eq!(l["items"][0]["device_id"], quiet, "{l}");
    let got = sink.wait_for(1).await;
    assert_eq!(got[0].header("x-fleetops-event"), Some("alert.firing"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(load.await.unwrap() > 0);
    let r = s.get("/healthz", s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
}

each_backend!(metric_history_is_pruned_after_its_retention);
/// Heartbeat samples (what backtests replay) are kept `[alerts] history_days` (7): with the
/// injectable clock, the housekeeper's pass drops a sample 8 days old and keeps one 5 days
/// old.
async fn metric_history_is_pruned_after_its_retention() {
    let s = start_with(fast).await;
    let rt = s.rt();
    let pid = s.project_id("default");
    let (d, tok) = device(&s, "r1").await;
    let day = Duration::from_secs(86_400);
    heartbeat(&s, d, &tok, json!({"temp": 40.0})).await;
    rt.clock.advance(3 * day);
    heartbeat(&s, d, &tok, json!({"temp": 41.0})).await;
    let kept = |rt: &fleetops_actors::Runtime| {
        rt.store()
            .metric_history(pid, d, 0, rt.clock.now_ms())
            .unwrap()
            .into_iter()
            .map(|(_, m)| m["temp"])
            .collect::<Vec<f64>>()
    };
    assert_eq!(kept(&rt), vec![40.0, 41.0]);
    rt.clock.advance(5 * day);
    rt.housekeep_now();
    assert!(
        eventually(5, || async { kept(&rt) == vec![41.0] }).await,
        "{:?}",
        kept(&rt)
    );
}

each_backend!(resolved_alerts_are_pruned_after_their_retention);
/// Resolved alerts are kept `[alerts] retention_days` (90) after they resolved, then the
/// housekeeper's pass deletes them with their notifications; a firing alert is kept however
/// old (with the injectable clock).
async fn resolved_alerts_are_pruned_after_their_retention() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let rt = s.rt();
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "device_status", "status": "offline", "duration_seconds": 1}),
    )
    .await;
    let (d1, tok1) = device(&s, "r1").await;
    let (d2, tok2) = device(&s, "r2").await;
    heartbeat(&s, d1, &tok1, json!({})).await;
    heartbeat(&s, d2, &tok2, json!({})).await;
    let l = wait_alerts(&s, "state=firing", 2).await;
    let id_of = |l: &Value, d: u64| {
        l["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["device_id"] == d)
            .unwrap()["id"]
            .as_u64()
            .unwrap()
    };
    let (resolved, firing) = (id_of(&l, d1), id_of(&l, d2));
    // r1 comes back: its alert resolves and both notifications go out.
    heartbeat(&s, d1, &tok1, json!({})).await;
    wait_alerts(&s, "state=resolved", 1).await;
    assert!(
        eventually(10, || async {
            let a = s.get(&format!("{ALERTS}/{resolved}"), s.key()).await.body;
            a["notifications"].as_array().is_some_and(|n| {
                n.iter().any(|x| x["event"] == "resolved")
                    && n.iter().all(|x| x["pending"] == false)
            })
        })
        .await,
        "{}",
        s.get(&format!("{ALERTS}/{resolved}"), s.key()).await.body
    );
    assert_eq!(rt.store().alert_notifications(resolved).unwrap().len(), 2);
    let status = |id: u64| {
        let s = &s;
        async move { s.get(&format!("{ALERTS}/{id}"), s.key()).await.status }
    };
    let day = Duration::from_secs(86_400);
    rt.clock.advance(89 * day);
    // Within its retention: the pass that the housekeeper runs deletes nothing.
    let cutoff = rt.clock.now_ms() - 90 * 86_400_000;
    assert_eq!(rt.store().prune_alerts(cutoff, 10_000).unwrap(), 0);
    assert_eq!(status(resolved).await, 200, "kept within its retention");
    rt.clock.advance(2 * day);
    rt.housekeep_now();
    assert!(eventually(5, || async { status(resolved).await == 404 }).await);
    assert_eq!(status(firing).await, 200, "a firing alert is kept");
    assert_eq!(alerts(&s, "state=resolved").await["total"], 0);
    let notifications = rt.store().alert_notifications(resolved).unwrap();
    assert!(notifications.is_empty(), "{notifications:?}");
}

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

/// In `org`'s project `project` (made by the superuser when new): a webhook integration to
/// `sink`, a `metric_threshold` rule on `temp` > 50 at once, and `n` devices whose heartbeat
/// crosses it, so `n` alerts each owe one notification; when the last heartbeat was answered.
async fn hot_devices(s: &Srv, org: &str, project: &str, sink: &Sink, n: usize) -> Instant {
    if org != "default" {
        let r = s
            .post("/api/v1/organizations", s.key(), json!({"slug": org}))
            .await;
        assert!(r.status == 201 || r.status == 409, "{}", r.body);
    }
    if project != "default" {
        let r = s
            .post(
                &format!("/api/v1/organizations/{org}/projects"),
                s.key(),
                json!({"slug": project}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let base = format!("/api/v1/organizations/{org}/projects/{project}");
    let r = s
        .post(
            &format!("{base}/integrations"),
            s.key(),
            json!({"type": "webhook", "name": "w", "config": {"url": sink.url("/alerts"), "signing_secret": "s3cret"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let hook = r.body["id"].as_u64().unwrap();
    let r = s
        .post(
            &format!("{base}/alert-rules"),
            s.key(),
            json!({"name": "hot", "condition": {"type": "metric_threshold", "metric": "temp", "operator": "gt", "threshold": 50, "duration_seconds": 0}, "severity": "critical", "integration_ids": [hook]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    for i in 0..n {
        let r = s
            .post(
                &format!("{base}/devices"),
                s.key(),
                json!({"name": format!("hot-{i}")}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        let (d, tok) = (
            r.body["id"].as_u64().unwrap(),
            r.body["device_token"].as_str().unwrap().to_string(),
        );
        let r = s
            .post(
                &format!("{base}/devices/{d}/heartbeat"),
                &tok,
                json!({"metrics": {"temp": 90}}),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.body);
    }
    Instant::now()
}

each_backend!(a_tarpit_tenant_holds_its_share_of_notification_slots_not_the_pool);
/// One organization's projects whose targets hang (each attempt held for the whole request
/// timeout) hold their shares of the notification slots, never the whole pool: another
/// organization's alert is notified within the contract's 2 s.
async fn a_tarpit_tenant_holds_its_share_of_notification_slots_not_the_pool() {
    let tarpit = Sink::start().await;
    tarpit.script(std::iter::repeat_n(Reply::Hang, 64));
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
        c.alerts.request_timeout_seconds = 30;
        c.alerts.max_in_flight = 6;
        c.alerts.max_in_flight_per_project = 2;
        c.alerts.max_in_flight_per_org = 3;
    })
    .await;
    // Two projects of one organization, six hanging notifications each.
    hot_devices(&s, "evil", "a", &tarpit, 6).await;
    hot_devices(&s, "evil", "b", &tarpit, 6).await;
    // Its share is taken: three attempts hang (the organization's share), no more.
    assert!(
        eventually(5, || async { tarpit.count() >= 3 }).await,
        "the tarpit got {}",
        tarpit.count()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        tarpit.count(),
        3,
        "one organization holds at most its share"
    );
    // Another organization's alert (and the first one's other project, had it one) goes out.
    let fired = hot_devices(&s, "good", "p", &sink, 1).await;
    sink.wait_for(1).await;
    assert!(
        fired.elapsed() < Duration::from_secs(2),
        "notified after {:?}",
        fired.elapsed()
    );
}

each_backend!(a_tarpit_project_holds_its_share_and_its_neighbour_is_notified);
/// Within one organization, a project whose targets hang holds its own share: the
/// organization's other project is notified at once.
async fn a_tarpit_project_holds_its_share_and_its_neighbour_is_notified() {
    let tarpit = Sink::start().await;
    tarpit.script(std::iter::repeat_n(Reply::Hang, 64));
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
        c.alerts.request_timeout_seconds = 30;
        c.alerts.max_in_flight = 6;
        c.alerts.max_in_flight_per_project = 2;
        c.alerts.max_in_flight_per_org = 6;
    })
    .await;
    hot_devices(&s, "default", "default", &tarpit, 6).await;
    assert!(eventually(5, || async { tarpit.count() >= 2 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(tarpit.count(), 2, "one project holds at most its share");
    let fired = hot_devices(&s, "default", "other", &sink, 1).await;
    sink.wait_for(1).await;
    assert!(
        fired.elapsed() < Duration::from_secs(2),
        "notified after {:?}",
        fired.elapsed()
    );
}

each_backend!(rules_past_the_project_cap_and_integrations_past_the_rule_cap_are_refused);
/// Rules per project and integrations per rule are capped (422 with the envelope).
async fn rules_past_the_project_cap_and_integrations_past_the_rule_cap_are_refused() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.alerts.max_rules_per_project = 2;
        c.alerts.max_integrations_per_rule = 2;
    })
    .await;
    let hooks = [
        webhook(&s, &sink).await,
        webhook(&s, &sink).await,
        webhook(&s, &sink).await,
    ];
    let cond = json!({"type": "log_pattern", "pattern": "x"});
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "r", "condition": cond, "severity": "critical", "integration_ids": hooks}),
        )
        .await;
    let detail = r.assert_error(422);
    assert!(detail.starts_with("integration_ids"), "{detail}");
    let first = rule(&s, hooks[0], cond.clone()).await;
    let r = s
        .patch(
            &format!("{RULES}/{first}"),
            s.key(),
            json!({"integration_ids": hooks}),
        )
        .await;
    r.assert_error(422);
    rule(&s, hooks[1], cond.clone()).await;
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "third", "condition": cond, "severity": "critical", "integration_ids": [hooks[2]]}),
        )
        .await;
    let detail = r.assert_error(422);
    assert!(detail.contains("at most 2 alert rules"), "{detail}");
    assert_eq!(
        s.get(RULES, s.key()).await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

each_backend!(a_rule_over_a_lowered_cap_can_still_be_changed_not_grown);
/// A rule written under a higher `max_integrations_per_rule` can still be changed after the
/// cap is lowered (disabled, renamed), but not grown.
async fn a_rule_over_a_lowered_cap_can_still_be_changed_not_grown() {
    let sink = Sink::start().await;
    let s = start_with(fast).await;
    let mut hooks = Vec::new();
    for _ in 0..4 {
        hooks.push(webhook(&s, &sink).await);
    }
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "r", "condition": {"type": "log_pattern", "pattern": "x"}, "severity": "critical", "integration_ids": &hooks[..3]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["id"].as_u64().unwrap();
    let s = s
        .restart_with(|c| {
            fast(c);
            c.alerts.max_integrations_per_rule = 2;
        })
        .await;
    let r = s
        .patch(
            &format!("{RULES}/{id}"),
            s.key(),
            json!({"enabled": false, "name": "renamed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .patch(
            &format!("{RULES}/{id}"),
            s.key(),
            json!({"integration_ids": hooks}),
        )
        .await;
    r.assert_error(422);
}
