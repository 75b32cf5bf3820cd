//! A panic inside an actor is contained: the actor restarts from storage, requests queued
//! behind the panic are answered by its replacement, and the server keeps answering.

use serde_json::json;

use crate::common::*;

fn project_id(s: &Srv) -> u64 {
    s.project_id("default")
}

/// A device and an active session of it; the session's id and its logs route.
async fn session_with_logs(s: &Srv, k: &str) -> (u64, String) {
    let d = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "d"}))
        .await
        .body["id"]
        .as_u64()
        .unwrap();
    let sid = s
        .post(&format!("{DEV}/sessions"), k, json!({"device_id": d}))
        .await
        .body["id"]
        .as_u64()
        .unwrap();
    (sid, format!("{DEV}/sessions/{sid}/logs"))
}

each_backend!(
    project_actor_panic_is_contained_and_restarts_from_storage,
    threads = 2
);
async fn project_actor_panic_is_contained_and_restarts_from_storage() {
    let s = start().await;
    let k = s.key().to_string();
    let r = s
        .post(&format!("{DEV}/devices"), &k, json!({"name": "before"}))
        .await;
    assert_eq!(r.status, 201);
    let before = r.body["id"].as_u64().unwrap();
    let pid = project_id(&s);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    assert_eq!(rt.restarts(), 0);

    // Writes in flight while the actor panics: every one must still be answered 201.
    let s = std::sync::Arc::new(s);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let s = s.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            s.post(
                &format!("{DEV}/devices"),
                &k,
                json!({"name": format!("during-{i}")}),
            )
            .await
            .status
        }));
        if i == 10 {
            rt.projects.inject_panic(pid).await.unwrap();
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 201);
    }
    assert!(
        eventually(5, || async { rt.restarts() >= 1 }).await,
        "the supervisor restarted it"
    );

    // State survived (it lives in storage), and the project keeps working.
    assert_eq!(
        s.get(&format!("{DEV}/devices/{before}"), &k).await.status,
        200
    );
    assert_eq!(s.get(&format!("{DEV}/devices"), &k).await.body["total"], 41);
    let r = s
        .post(&format!("{DEV}/devices"), &k, json!({"name": "after"}))
        .await;
    assert_eq!(r.status, 201);
    let text = s
        .http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("fleetops_actor_restarts 0\n"), "{text}");
}

each_backend!(directory_actor_panic_is_contained, threads = 2);
async fn directory_actor_panic_is_contained() {
    let s = start().await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.directory.inject_panic();
    assert!(eventually(5, || async { rt.restarts() >= 1 }).await);
    // Writes through the restarted actor work, and reads never stopped.
    let r = s
        .post(
            "/api/v1/organizations",
            s.key(),
            json!({"slug": "after-panic"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(s.get("/api/v1/users/me", s.key()).await.status, 200);
}

each_backend!(restart_budget_leaves_a_crashing_actor_down, threads = 2);
async fn restart_budget_leaves_a_crashing_actor_down() {
    // A window far longer than the test: once the budget is spent the actor is down for the
    // rest of it, whatever the machine's speed (recovery after the window is the budget's
    // unit test, with instants given by the test).
    let s = start_with(|c| {
        c.supervision.max_restarts = 2;
        c.supervision.restart_window_seconds = 600;
        c.supervision.restart_backoff_ms = 10;
    })
    .await;
    let k = s.key();
    assert_eq!(
        s.post(&format!("{DEV}/devices"), k, json!({"name": "x"}))
            .await
            .status,
        201
    );
    let pid = project_id(&s);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    for n in 1..=3 {
        // Wait for the actor to be back before crashing it again.
        assert!(eventually(5, || async { rt.projects.inject_panic(pid).await.is_ok() }).await);
        assert!(eventually(5, || async { rt.restarts() >= n }).await);
    }
    // Budget spent: writes to this project are 503 with Retry-After for the rest of the window.
    let r = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "y"}))
        .await;
    r.assert_error(503);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((500..=600).contains(&retry), "{retry}");
    // Reads never stopped, other projects never noticed.
    assert_eq!(s.get(&format!("{DEV}/devices"), k).await.status, 200);
    s.post(
        "/api/v1/organizations/default/projects",
        k,
        json!({"slug": "other"}),
    )
    .await;
    let r = s
        .post(
            "/api/v1/organizations/default/projects/other/devices",
            k,
            json!({"name": "z"}),
        )
        .await;
    assert_eq!(r.status, 201);
    // Nothing of the refused write was kept.
    let names: Vec<String> = s.get(&format!("{DEV}/devices"), k).await.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, vec!["x"]);
}

each_backend!(
    a_failing_restart_is_contained_and_named_by_healthz,
    threads = 2
);
/// A restart that fails leaves the rest of the tree serving; `/healthz` names the part that
/// is down until a later attempt brings it back.
async fn a_failing_restart_is_contained_and_named_by_healthz() {
    let s = start().await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.health.inject_start_failure("directory");
    rt.directory.inject_panic();
    assert!(eventually(5, || async { rt.restarts() >= 1 }).await);
    let r = s.send(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.body["down"], json!(["directory"]));
    assert_eq!(r.body["status"], "degraded");
    // Everything else keeps serving (project writes, reads through the caches).
    let k = s.key();
    assert_eq!(
        s.post(&format!("{DEV}/devices"), k, json!({"name": "meanwhile"}))
            .await
            .status,
        201
    );
    assert_eq!(s.get("/api/v1/users/me", k).await.status, 200);
    // The next attempt (a second later) succeeds: healthy again, and directory writes work.
    assert!(
        eventually(10, || async {
            s.send(reqwest::Method::GET, "/healthz", None, None)
                .await
                .status
                == 200
        })
        .await
    );
    let r = s
        .post("/api/v1/organizations", k, json!({"slug": "back"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
}

each_backend!(worker_and_housekeeper_restart_after_a_panic, threads = 2);
/// The webhook worker and the housekeeper are supervised: a panic restarts them (counted),
/// and no accepted delivery is left unworked.
async fn worker_and_housekeeper_restart_after_a_panic() {
    use crate::webhooks::{SECRET, deliver};
    let s = start_with(|c| c.scm.webhook_secret = SECRET.into()).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let mut ids = Vec::new();
    for i in 0..20 {
        if i == 10 {
            rt.inject_worker_panic();
        }
        let (id, r) = deliver(
            &s,
            "push",
            &json!({"ref": "refs/heads/main", "after": "ab"}),
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.body);
        ids.push(id);
    }
    assert!(eventually(5, || async { rt.restarts() >= 1 }).await);
    // Every delivery is worked (none linked: skipped), none left queued.
    assert!(
        eventually(10, || async {
            let r = s
                .get("/api/v1/scm/deliveries?outcome=queued", s.key())
                .await;
            r.body["total"] == 0
        })
        .await
    );
    for id in &ids {
        let r = s
            .get(&format!("/api/v1/scm/deliveries/{id}"), s.key())
            .await;
        assert_eq!(r.status, 200);
        assert_ne!(r.body["outcome"], "queued", "{}", r.body);
    }
    rt.inject_housekeeper_panic();
    assert!(eventually(5, || async { rt.restarts() >= 2 }).await);
    assert!(
        eventually(5, || async {
            s.send(reqwest::Method::GET, "/healthz", None, None)
                .await
                .status
                == 200
        })
        .await
    );
    let text = s
        .http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("fleetops_actor_restarts 2\n"), "{text}");
}

each_backend!(
    graceful_stop_and_restart_on_the_same_data_keeps_everything,
    threads = 2
);
async fn graceful_stop_and_restart_on_the_same_data_keeps_everything() {
    let s = start().await;
    let k = s.key().to_string();
    let jwt = s.login("admin@localhost", ADMIN_PASSWORD).await;
    let r = s
        .post("/api/v1/auth/api-keys", &jwt, json!({"name": "kept"}))
        .await;
    let kept = r.body["key"].as_str().unwrap().to_string();
    s.post("/api/v1/organizations", &k, json!({"slug": "acme"}))
        .await;
    let d = s
        .post(
            &format!("{DEV}/devices"),
            &k,
            json!({"name": "d", "labels": {"a": "b"}}),
        )
        .await;
    let token = d.body["device_token"].as_str().unwrap().to_string();
    let id = d.body["id"].as_u64().unwrap();
    s.post(
        &format!("{DEV}/devices/{id}/heartbeat"),
        &token,
        json!({"metrics": {"t": 1.5}}),
    )
    .await;
    s.post(
        &format!("{DEV}/device-groups"),
        &k,
        json!({"name": "g", "device_ids": [id]}),
    )
    .await;

    let s = s.restart().await;
    let d = s.get(&format!("{DEV}/devices/{id}"), &k).await;
    assert_eq!(d.status, 200);
    assert_eq!(d.body["labels"], json!({"a": "b"}));
    assert_eq!(d.body["metrics"], json!({"t": 1.5}));
    assert_eq!(d.body["group_ids"].as_array().unwrap().len(), 1);
    assert_eq!(s.get("/api/v1/users/me", &kept).await.status, 200);
    assert_eq!(
        s.post(&format!("{DEV}/devices/{id}/heartbeat"), &token, json!({}))
            .await
            .status,
        202
    );
    let orgs = s.get("/api/v1/organizations", &k).await;
    assert_eq!(orgs.body["items"].as_array().unwrap().len(), 2);
    // Tokens signed before the restart still verify (the generated secret is kept).
    assert_eq!(s.get("/api/v1/users/me", &jwt).await.status, 200);
    assert!(!s.login("admin@localhost", ADMIN_PASSWORD).await.is_empty());
}

each_backend!(session_actor_panic_loses_no_acknowledged_line, threads = 2);
async fn session_actor_panic_loses_no_acknowledged_line() {
    let s = start().await;
    let k = s.key().to_string();
    let (sid, logs) = session_with_logs(&s, &k).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let s = std::sync::Arc::new(s);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let (s, k, logs) = (s.clone(), k.clone(), logs.clone());
        tasks.push(tokio::spawn(async move {
            let batch: Vec<_> = (0..10)
                .map(|j| json!({"level": "info", "message": format!("b{i}-{j}")}))
                .collect();
            s.post(&logs, &k, serde_json::Value::Array(batch))
                .await
                .status
        }));
        if i == 5 {
            rt.sessions.inject_panic(sid).await.unwrap();
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 202);
    }
    assert!(eventually(5, || async { rt.restarts() >= 1 }).await);
    let r = s.get(&format!("{logs}?limit=1"), &k).await;
    assert_eq!(r.body["total"], 300);
    assert_eq!(
        s.get(&format!("{DEV}/sessions/{sid}"), &k).await.body["metrics"]["log_count"],
        300
    );
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

each_backend!(
    intake_and_dispatcher_panics_under_load_are_contained,
    threads = 2
);
/// Panics injected into the webhook intake and the dispatcher while deliveries and heartbeats
/// keep arriving: heartbeats all succeed, a delivery refused at the panic (5xx) is redelivered
/// as a host would until it is accepted, both actors restart, and every accepted delivery is
/// worked into exactly one test run.
async fn intake_and_dispatcher_panics_under_load_are_contained() {
    use crate::webhooks::{SECRET, pr, sign};
    let s = start_with(|c| c.scm.webhook_secret = SECRET.into()).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let r = s
        .post(
            &format!("{DEV}/repositories"),
            s.key(),
            json!({"full_name": "Codertocat/Hello-World"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let restarts = s.metric("fleetops_actor_restarts").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beats = tokio::spawn({
        let (http, url, tok, stop) = (
            s.http.clone(),
            s.url(&format!("{DEV}/devices/{d}/heartbeat")),
            tok.clone(),
            stop.clone(),
        );
        async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let st = http
                    .post(&url)
                    .bearer_auth(&tok)
                    .json(&json!({}))
                    .send()
                    .await
                    .unwrap()
                    .status();
                assert_eq!(st, 202);
            }
        }
    });
    let n = 60u64;
    let deliveries = tokio::spawn({
        let (http, url) = (s.http.clone(), s.url("/api/v1/scm/webhooks"));
        async move {
            let mut redelivered = 0;
            for i in 0..n {
                let id = uuid::Uuid::new_v4().to_string();
                let body =
                    serde_json::to_vec(&pr("opened", i + 1, &format!("{i:040}"), false)).unwrap();
                loop {
                    let st = http
                        .post(&url)
                        .header("X-Host-Event", "pull_request")
                        .header("X-Host-Delivery", &id)
                        .header("X-Hub-Signature-256", sign(SECRET, &body))
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap()
                        .status()
                        .as_u16();
                    match st {
                        202 => break,
                        // Claimed by the attempt whose answer the panic took: accepted.
                        401 if redelivered > 0 => break,
                        500 | 503 => {
                            redelivered += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                        other => panic!("delivery {i}: {other}"),
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            redelivered
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    rt.webhooks.inject_intake_panic();
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    rt.webhooks.inject_dispatcher_panic();
    deliveries.await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    beats.await.unwrap();
    assert!(s.metric("fleetops_actor_restarts").await >= restarts + 2.0);
    let total = |q: String| {
        let s = &s;
        async move { s.get(&q, s.key()).await.body["total"].as_u64().unwrap_or(0) }
    };
    assert!(
        eventually(20, || async {
            total("/api/v1/scm/deliveries?outcome=dispatched&page_size=1".into()).await == n
        })
        .await,
        "not every accepted delivery was dispatched"
    );
    assert_eq!(total(format!("{DEV}/test-runs?page_size=1")).await, n);
    assert_eq!(s.get("/healthz", s.key()).await.status, 200);
}

each_backend!(past_the_budget_every_actor_kind_is_contained, threads = 2);
/// Past its restart budget each kind of actor stays down and is contained: a session's, an
/// evaluator's and an installation's requests are refused (503) and `/healthz` names them
/// while answering 200 for the rest; a singleton of the tree (the webhook intake) is named as
/// down (503) while every other route serves. Nothing loops: the restart count stops growing.
async fn past_the_budget_every_actor_kind_is_contained() {
    use crate::webhooks::{SECRET, deliver, payload, settled};
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.supervision.max_restarts = 1;
        c.supervision.restart_window_seconds = 600;
        c.supervision.restart_backoff_ms = 10;
    })
    .await;
    let k = s.key();
    let rt = s.rt();
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let crashing = crate::sessions::session(&s, d, &tok).await;
    let healthy = crate::sessions::session(&s, d, &tok).await;
    let pid = s.project_id("default");
    // An installation, through the host's own payload.
    let (id, r) = deliver(&s, "installation", &payload("installation.created")).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let inst = settled(&s, &id).await["installation_id"].as_u64().unwrap();

    // Two failures each: the first is restarted, the second spends the budget.
    let mut n = rt.restarts();
    for _ in 0..2 {
        assert!(
            eventually(5, || async {
                rt.sessions.inject_panic(crashing).await.is_ok()
            })
            .await
        );
        assert!(eventually(5, || async { rt.restarts() > n }).await);
        n = rt.restarts();
        assert!(
            eventually(5, || async {
                rt.alerts.inject_evaluator_panic(pid).await.is_ok()
            })
            .await
        );
        assert!(eventually(5, || async { rt.restarts() > n }).await);
        n = rt.restarts();
        assert!(eventually(5, || async { rt.webhooks.inject_panic(inst).await.is_ok() }).await);
        assert!(eventually(5, || async { rt.restarts() > n }).await);
        n = rt.restarts();
        assert!(
            eventually(5, || async {
                rt.alerts.inject_notifier_panic(pid).await.is_ok()
            })
            .await
        );
        assert!(eventually(5, || async { rt.restarts() > n }).await);
        n = rt.restarts();
    }
    let logs = |sid: u64| format!("{DEV}/sessions/{sid}/logs");
    let line = json!([{"level": "info", "message": "m"}]);
    let r = s.post(&logs(crashing), &tok, line.clone()).await;
    r.assert_error(503);
    assert!(r.header("retry-after").is_some());
    assert_eq!(s.post(&logs(healthy), &tok, line.clone()).await.status, 202);
    assert!(rt.webhooks.inject_panic(inst).await.is_err());
    assert!(rt.alerts.inject_evaluator_panic(pid).await.is_err());
    // Heartbeats still answer (the evaluator only reads them).
    let beat = format!("{DEV}/devices/{d}/heartbeat");
    assert_eq!(
        s.post(&beat, &tok, json!({"metrics": {"t": 1}}))
            .await
            .status,
        202
    );
    let h = s.send(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(h.status, 200, "{}", h.body);
    let mut named: Vec<String> = h.body["contained"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    named.sort();
    let mut want = vec![
        format!("alert-evaluator {pid}"),
        format!("installation {inst}"),
        format!("notifier {pid}"),
        format!("session {crashing}"),
    ];
    want.sort();
    assert_eq!(named, want, "{}", h.body);
    assert_eq!(h.body["contained_count"], 4);

    // The intake and the dispatcher, singletons: past their budgets the tree names them down.
    for _ in 0..2 {
        rt.webhooks.inject_intake_panic();
        assert!(eventually(5, || async { rt.restarts() > n }).await);
        n = rt.restarts();
        rt.webhooks.inject_dispatcher_panic();
        assert!(eventually(5, || async { rt.restarts() > n }).await);
        n = rt.restarts();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        eventually(5, || async {
            let h = s.send(reqwest::Method::GET, "/healthz", None, None).await;
            h.status == 503 && h.body["down"] == json!(["job-dispatcher", "webhook-intake"])
        })
        .await
    );
    let r = s
        .post(&format!("{DEV}/test-runs/claim"), k, json!({}))
        .await;
    r.assert_error(503);
    let (_, r) = deliver(&s, "ping", &json!({"zen": "Keep it logically awesome."})).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(s.get(&format!("{DEV}/devices"), k).await.status, 200);
    assert_eq!(s.post(&logs(healthy), &tok, line).await.status, 202);
    // Nothing loops: no restart happens while everything past its budget stays down.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(rt.restarts(), n);
}

each_backend!(
    a_completion_that_failed_leaves_the_session_taking_appends,
    threads = 2
);
/// A completion whose write fails (here its call timed out behind a stalled project actor,
/// so it is never applied) gives the session back: it takes appends again at once, stays
/// active, and a later completion ends it with every line kept.
async fn a_completion_that_failed_leaves_the_session_taking_appends() {
    let s = start_with(|c| c.supervision.call_timeout_ms = 300).await;
    let pid = project_id(&s);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let (d, tok) = crate::sessions::device(&s, "sealer").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let complete = format!("{DEV}/sessions/{sid}/complete");
    let line = |m: &str| json!([{"level": "info", "message": m}]);
    assert_eq!(s.post(&logs, &tok, line("before")).await.status, 202);
    rt.projects
        .inject_stall(pid, std::time::Duration::from_millis(1500))
        .await
        .unwrap();
    let r = s
        .post(&complete, &tok, json!({"status": "completed"}))
        .await;
    assert_eq!(r.status, 503, "{}", r.body);
    // The seal that guarded the failed write is lifted before the 503 is answered.
    let r = s.post(&logs, &tok, line("after")).await;
    assert_eq!(r.status, 202, "{}", r.body);
    let done = eventually(10, || async {
        s.post(&complete, &tok, json!({"status": "completed"}))
            .await
            .status
            == 200
    })
    .await;
    assert!(done, "a later completion ends the session");
    let r = s.get(&logs, s.key()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 2, "{}", r.body);
}
