//! Notifications: retries with backoff, a pending one sent after a restart, and a tarpit tenant
//! or project holding only its share of the sending slots.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::peers::{Reply, Sink};
use crate::sessions::device;

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
