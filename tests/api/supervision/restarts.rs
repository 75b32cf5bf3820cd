//! Panics in the project, directory, session, worker and housekeeper actors: contained,
//! restarted from storage, and a graceful stop and restart on the same data.

use serde_json::json;

use super::*;

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
