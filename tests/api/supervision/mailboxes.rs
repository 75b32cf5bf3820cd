//! Deadlines and mailbox bounds: a panic after a write answered once, a call that timed out or
//! whose caller hung up never applied, a stalled actor holding only its mailbox limit, depths
//! on /metrics.

use serde_json::json;

use super::*;

/// Once the project's actor is free again (every try before that is itself a 503, dropped
/// unapplied) a new device is created, and the abandoned one named `never` was not: the
/// project holds `before` and `after` only.
async fn assert_never_applied(s: &Srv, k: &str, never: &str) {
    let after = eventually(20, || async {
        s.post(&format!("{DEV}/devices"), k, json!({"name": "after"}))
            .await
            .status
            == 201
    })
    .await;
    assert!(after);
    let mut names: Vec<String> =
        s.get(&format!("{DEV}/devices?page_size=10"), k).await.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
    names.sort();
    assert_eq!(names, ["after", "before"], "{never} must never appear");
}

/// A correctly signed `ping` delivery (an unsubscribed event: 202 ignored once claimed)
/// with the given id, as a future that owns what it needs (it may be spawned); its status.
fn signed_ping(s: &Srv, id: String, zen: String) -> impl Future<Output = u16> + use<> {
    use crate::webhooks::{SECRET, sign};
    let (http, url) = (s.http.clone(), s.url("/api/v1/scm/webhooks"));
    async move {
        let body = serde_json::to_vec(&json!({ "zen": zen })).unwrap();
        http.post(url)
            .header("content-type", "application/json")
            .header("X-Host-Event", "ping")
            .header("X-Host-Delivery", id)
            .header("X-Hub-Signature-256", sign(SECRET, &body))
            .body(body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}

each_backend!(
    a_panic_after_a_write_answers_the_original_result_once,
    threads = 2
);
/// A panic that strikes after a write (here in the live fan-out of a log batch) never makes
/// the write happen twice nor leaves its caller without the truth: the batch was answered as
/// soon as it was written, so the caller has its 202, the batch is stored once, and the
/// restarted actor goes on from storage.
async fn a_panic_after_a_write_answers_the_original_result_once() {
    let s = start().await;
    let k = s.key().to_string();
    let (sid, logs) = session_with_logs(&s, &k).await;
    let batch = |tag: &str| {
        serde_json::Value::Array(
            (0..3)
                .map(|j| json!({"level": "info", "message": format!("{tag}-{j}")}))
                .collect(),
        )
    };
    assert_eq!(s.post(&logs, &k, batch("before")).await.status, 202);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.sessions
        .inject_panic_after_next_write(sid)
        .await
        .unwrap();
    let r = s.post(&logs, &k, batch("struck")).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["accepted"], 3, "{}", r.body);
    assert!(eventually(5, || async { rt.restarts() >= 1 }).await);
    assert_eq!(s.post(&logs, &k, batch("after")).await.status, 202);
    let r = s.get(&format!("{logs}?limit=100"), &k).await;
    assert_eq!(r.body["total"], 9, "{}", r.body);
    let struck = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["message"].as_str().unwrap().starts_with("struck"))
        .count();
    assert_eq!(struck, 3);
    assert_eq!(
        s.get(&format!("{DEV}/sessions/{sid}"), &k).await.body["metrics"]["log_count"],
        9
    );
}

each_backend!(a_call_that_timed_out_never_takes_effect_later, threads = 2);
/// A call whose deadline passed while it waited (503) is never applied afterwards: the device
/// is not created behind the caller's back, so a retry cannot make it twice.
async fn a_call_that_timed_out_never_takes_effect_later() {
    let s = start_with(|c| c.supervision.call_timeout_ms = 300).await;
    let k = s.key().to_string();
    let pid = project_id(&s);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    // Started first, so the stall below holds the project's actor itself.
    let r = s
        .post(&format!("{DEV}/devices"), &k, json!({"name": "before"}))
        .await;
    assert_eq!(r.status, 201);
    rt.projects
        .inject_stall(pid, std::time::Duration::from_millis(3000))
        .await
        .unwrap();
    let r = s
        .post(&format!("{DEV}/devices"), &k, json!({"name": "late"}))
        .await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.header("retry-after").is_some());
    assert_never_applied(&s, &k, "late").await;
}

each_backend!(a_delivery_taken_on_is_answered_with_the_truth, threads = 2);
/// A delivery whose batch write is under way when its deadline passes gets the truth (202,
/// stored), never a 503 for a delivery that was claimed.
async fn a_delivery_taken_on_is_answered_with_the_truth() {
    use crate::webhooks::{SECRET, deliver};
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.supervision.call_timeout_ms = 300;
    })
    .await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.webhooks
        .inject_write_stall(std::time::Duration::from_millis(1200));
    let started = std::time::Instant::now();
    let (id, r) = deliver(&s, "ping", &json!({"zen": "slow disk"})).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert!(started.elapsed() >= std::time::Duration::from_millis(1200));
    // It is claimed: the host's redelivery is a duplicate of a delivery that was accepted.
    let r = s.get("/api/v1/scm/deliveries?page_size=50", s.key()).await;
    assert_eq!(r.status, 200);
    let ids: Vec<&str> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["delivery_id"].as_str())
        .collect();
    assert!(ids.contains(&id.as_str()), "{ids:?}");
}

each_backend!(
    a_caller_that_hung_up_before_its_turn_is_never_applied,
    threads = 2
);
/// A caller that goes away (its client hung up) before its request was taken on leaves
/// nothing behind: the request waiting in the mailbox is never applied, so a client that
/// retries after its own timeout cannot create the device twice.
async fn a_caller_that_hung_up_before_its_turn_is_never_applied() {
    let s = start().await;
    let k = s.key().to_string();
    let pid = project_id(&s);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    assert_eq!(
        s.post(&format!("{DEV}/devices"), &k, json!({"name": "before"}))
            .await
            .status,
        201
    );
    rt.projects
        .inject_stall(pid, std::time::Duration::from_millis(1500))
        .await
        .unwrap();
    let (http, url, key) = (s.http.clone(), s.url(&format!("{DEV}/devices")), k.clone());
    let caller = tokio::spawn(async move {
        http.post(url)
            .bearer_auth(key)
            .json(&json!({"name": "hung-up"}))
            .send()
            .await
    });
    // Once its request waits in the actor's mailbox, the client goes away.
    assert!(eventually(10, || async { rt.projects.waiting(pid) == 1 }).await);
    caller.abort();
    let _ = caller.await;
    assert_never_applied(&s, &k, "hung-up").await;
}

each_backend!(
    a_stalled_actor_holds_at_most_its_mailbox_limit_of_messages,
    threads = 2
);
/// The mailbox bound counts messages, not waiting callers: a call whose caller timed out
/// keeps its place (and its payload) until the actor reaches it, so a stalled actor holds at
/// most `mailbox_limit` messages however many callers give up and come again.
async fn a_stalled_actor_holds_at_most_its_mailbox_limit_of_messages() {
    use crate::webhooks::SECRET;
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.supervision.call_timeout_ms = 300;
        c.supervision.mailbox_limit = 4;
    })
    .await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let send = |zen: u32| signed_ping(&s, uuid::Uuid::new_v4().to_string(), zen.to_string());
    // The intake's write is held: the first delivery waits in its batch, the rest queue.
    let hold = rt.webhooks.inject_write_hold();
    let first = tokio::spawn(send(0));
    // Its batch closed and held: what comes next queues for the following one.
    assert!(eventually(10, || async { hold.reached() }).await);
    assert_eq!(rt.webhooks.intake_waiting(), 1);
    // Three more time out (503) and stay queued, so the mailbox is full: the rest are turned
    // away at once, not queued behind them.
    for zen in 1..=3 {
        assert_eq!(send(zen).await, 503);
    }
    assert_eq!(rt.webhooks.intake_waiting(), 4);
    for zen in 4..=9 {
        let t = std::time::Instant::now();
        assert_eq!(send(zen).await, 503);
        assert!(
            t.elapsed() < std::time::Duration::from_millis(250),
            "refused at once"
        );
    }
    assert_eq!(rt.webhooks.intake_waiting(), 4);
    hold.release();
    assert_eq!(first.await.unwrap(), 202);
    assert!(eventually(10, || async { rt.webhooks.intake_waiting() == 0 }).await);
}

each_backend!(a_redelivery_after_a_503_is_the_delivery, threads = 2);
/// A host answered 503 claimed nothing, so its redelivery is the delivery, also when the
/// first attempt still waits in the intake's mailbox as the redelivery arrives.
async fn a_redelivery_after_a_503_is_the_delivery() {
    use crate::webhooks::SECRET;
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.supervision.call_timeout_ms = 1000;
    })
    .await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let send = |id: String, zen: &'static str| signed_ping(&s, id, zen.to_string());
    // A first delivery's batch write is held: the intake's mailbox queues what comes next.
    let hold = rt.webhooks.inject_write_hold();
    let first = tokio::spawn(send(uuid::Uuid::new_v4().to_string(), "first"));
    // Its batch closed and held: what comes next queues for the following one.
    assert!(eventually(10, || async { hold.reached() }).await);
    assert_eq!(rt.webhooks.intake_waiting(), 1);
    let x = uuid::Uuid::new_v4().to_string();
    // Its deadline passes in the mailbox: 503, nothing claimed.
    assert_eq!(send(x.clone(), "x").await, 503);
    // The host redelivers while that attempt is still queued (it keeps its place in the
    // bounded mailbox until the intake reaches it and drops it unapplied); then the write
    // goes on.
    let again = tokio::spawn(send(x.clone(), "x"));
    assert!(eventually(10, || async { rt.webhooks.intake_waiting() == 3 }).await);
    hold.release();
    assert_eq!(first.await.unwrap(), 202);
    assert_eq!(again.await.unwrap(), 202);
    let r = s.get(&format!("/api/v1/scm/deliveries/{x}"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // And it is claimed now: a third attempt is the duplicate.
    assert_eq!(send(x.clone(), "x").await, 401);
}

each_backend!(mailbox_depths_are_on_metrics);
/// Mailbox depths are on /metrics: calls waiting on a stalled project actor show under
/// `actor="project"`, and the gauge falls back once it answers.
async fn mailbox_depths_are_on_metrics() {
    let s = start_with(|c| c.supervision.call_timeout_ms = 5000).await;
    let k = s.key().to_string();
    let pid = project_id(&s);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let r = s
        .post(&format!("{DEV}/devices"), &k, json!({"name": "first"}))
        .await;
    assert_eq!(r.status, 201);
    async fn waiting(s: &Srv) -> f64 {
        s.metrics_text()
            .await
            .lines()
            .find_map(|l| l.strip_prefix("fleetops_mailbox_calls_waiting{actor=\"project\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    }
    assert_eq!(waiting(&s).await, 0.0);
    rt.projects
        .inject_stall(pid, std::time::Duration::from_millis(1500))
        .await
        .unwrap();
    let queued = tokio::spawn({
        let (http, url, k) = (s.http.clone(), s.url(&format!("{DEV}/devices")), k.clone());
        async move {
            http.post(url)
                .bearer_auth(k)
                .json(&json!({"name": "queued"}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    assert!(eventually(2, || async { waiting(&s).await >= 1.0 }).await);
    let text = s.metrics_text().await;
    assert!(
        text.contains("fleetops_mailbox_deepest{actor=\"project\"} "),
        "{text}"
    );
    assert_eq!(queued.await.unwrap(), 201);
    assert!(eventually(5, || async { waiting(&s).await == 0.0 }).await);
}
