//! Restart budgets under load: the intake and dispatcher contained, every actor kind past its
//! budget, and a failed completion leaving the session taking appends.

use serde_json::json;

use super::*;

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
