//! What happens to alerts over time: restarts, backtests, resolution when devices, groups or
//! rules change, budgets, panics under load, retention, and the caps on rules and integrations.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::peers::Sink;
use crate::sessions::{device, session};

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
