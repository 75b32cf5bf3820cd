//! A session's record: created, read, completed and listed; tags, deletion (also while it
//! receives) and tenancy; idle sessions passivated and back on append.

use serde_json::{Value, json};

use super::*;

every_log_store!(create_detail_complete_and_list);
async fn create_detail_complete_and_list() {
    let s = start().await;
    let (d1, tok1) = device(&s, "arm-1").await;
    let (d2, _) = device(&s, "arm-2").await;
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            &tok1,
            json!({"device_id": d1, "tags": ["run:7", "calib", "calib"]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let b = &r.body;
    assert_eq!(b["status"], "active");
    assert_eq!(b["ended_at"], Value::Null);
    assert_eq!(b["device_id"], d1);
    assert_eq!(b["device_name"], "arm-1");
    assert_eq!(b["tags"], json!(["calib", "run:7"]));
    assert_eq!(
        b["metrics"],
        json!({"log_count": 0, "artifact_count": 0, "artifact_size_bytes": 0})
    );
    assert_eq!(b["package"], Value::Null);
    assert_eq!(b["artifact_count"], 0);
    assert!(b["duration_seconds"].as_i64().unwrap() >= 0);
    let s1 = b["id"].as_u64().unwrap();
    // A device token creates sessions only for its own device.
    s.post(&format!("{DEV}/sessions"), &tok1, json!({"device_id": d2}))
        .await
        .assert_error(403);
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": 999_999}),
    )
    .await
    .assert_error(422);
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": d1, "tags": ["bad tag"]}),
    )
    .await
    .assert_error(422);
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": "x"}),
    )
    .await
    .assert_error(422);
    let s2 = session(&s, d2, s.key()).await;

    // Complete: 200 with ended_at and duration; then 409 for more logs or another completion.
    let r = s
        .post(
            &format!("{DEV}/sessions/{s1}/complete"),
            &tok1,
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "completed");
    assert!(r.body["ended_at"].as_str().unwrap().ends_with('Z'));
    assert!(r.body["duration_seconds"].as_i64().is_some());
    s.post(
        &format!("{DEV}/sessions/{s1}/complete"),
        &tok1,
        json!({"status": "failed"}),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/sessions/{s1}/logs"),
        &tok1,
        json!([{"level": "info", "message": "late"}]),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/sessions/{s2}/complete"),
        s.key(),
        json!({"status": "done"}),
    )
    .await
    .assert_error(422);
    // A device token cannot complete another device's session.
    s.post(
        &format!("{DEV}/sessions/{s2}/complete"),
        &tok1,
        json!({"status": "failed"}),
    )
    .await
    .assert_error(403);

    // List: newest first, filters, pagination.
    let r = s.get(&format!("{DEV}/sessions"), s.key()).await;
    assert_eq!(r.body["total"], 2);
    assert_eq!(r.body["items"][0]["id"], s2);
    assert!(r.body["items"][0].get("metrics").is_none());
    assert_eq!(
        s.get(&format!("{DEV}/sessions?status=completed"), s.key())
            .await
            .body["total"],
        1
    );
    assert_eq!(
        s.get(&format!("{DEV}/sessions?status=active"), s.key())
            .await
            .body["items"][0]["id"],
        s2
    );
    assert_eq!(
        s.get(&format!("{DEV}/sessions?device_id={d1}"), s.key())
            .await
            .body["items"][0]["id"],
        s1
    );
    s.get(&format!("{DEV}/sessions?status=paused"), s.key())
        .await
        .assert_error(422);
    s.get(&format!("{DEV}/sessions?since=yesterday"), s.key())
        .await
        .assert_error(422);
    let r = s
        .get(&format!("{DEV}/sessions?page=2&page_size=1"), s.key())
        .await;
    assert_eq!(r.body["items"][0]["id"], s1);
    assert_eq!(r.body["has_more"], false);
    let future = "2999-01-01T00:00:00Z";
    assert_eq!(
        s.get(&format!("{DEV}/sessions?since={future}"), s.key())
            .await
            .body["total"],
        0
    );
    assert_eq!(
        s.get(&format!("{DEV}/sessions?until={future}"), s.key())
            .await
            .body["total"],
        2
    );
    let started = s.get(&format!("{DEV}/sessions/{s2}"), s.key()).await.body["started_at"]
        .as_str()
        .unwrap()
        .to_string();
    let enc = started.replace(':', "%3A");
    let r = s.get(&format!("{DEV}/sessions?since={enc}"), s.key()).await;
    assert!(
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == s2),
        "since is inclusive"
    );
    let r = s.get(&format!("{DEV}/sessions?until={enc}"), s.key()).await;
    assert!(
        !r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == s2),
        "until is exclusive"
    );
}

every_log_store!(tags_delete_and_tenancy);
async fn tags_delete_and_tenancy() {
    let s = start().await;
    let sid = seeded(&s).await;
    let k = s.key();
    let base = format!("{DEV}/sessions/{sid}");
    let r = s
        .post(&format!("{base}/tags"), k, json!({"tag": "field-test"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["tags"], json!(["field-test"]));
    assert_eq!(
        s.post(&format!("{base}/tags"), k, json!({"tag": "field-test"}))
            .await
            .body["tags"],
        json!(["field-test"])
    );
    s.post(&format!("{base}/tags"), k, json!({"tag": ""}))
        .await
        .assert_error(422);
    s.post(&format!("{base}/tags"), k, json!({"tag": "x".repeat(65)}))
        .await
        .assert_error(422);
    s.post(&format!("{base}/tags"), k, json!({"tag": "a/b"}))
        .await
        .assert_error(422);
    let r = s.delete(&format!("{base}/tags/absent"), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["tags"], json!(["field-test"]));
    let r = s.delete(&format!("{base}/tags/field-test"), k).await;
    assert_eq!(r.body["tags"], json!([]));
    // Tags can be edited after completion.
    s.post(&format!("{base}/complete"), k, json!({"status": "failed"}))
        .await;
    assert_eq!(
        s.post(&format!("{base}/tags"), k, json!({"tag": "post.mortem"}))
            .await
            .status,
        200
    );

    // Another project's session is 404.
    s.post(
        "/api/v1/organizations/default/projects",
        k,
        json!({"slug": "other"}),
    )
    .await;
    s.get(
        &format!("/api/v1/organizations/default/projects/other/sessions/{sid}"),
        k,
    )
    .await
    .assert_error(404);
    s.get(
        &format!("/api/v1/organizations/default/projects/other/sessions/{sid}/logs"),
        k,
    )
    .await
    .assert_error(404);
    s.delete(
        &format!("/api/v1/organizations/default/projects/other/sessions/{sid}"),
        k,
    )
    .await
    .assert_error(404);

    // Delete for good.
    assert_eq!(s.delete(&base, k).await.status, 204);
    assert_eq!(s.get(&base, k).await.assert_error(404), "Session not found");
    s.get(&format!("{base}/logs"), k).await.assert_error(404);
    s.delete(&base, k).await.assert_error(404);
    assert_eq!(s.get(&format!("{DEV}/sessions"), k).await.body["total"], 0);
}

every_log_store!(deleting_an_active_session_stops_its_ingestion);
async fn deleting_an_active_session_stops_its_ingestion() {
    let s = start().await;
    let (d, tok) = device(&s, "x").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    assert_eq!(
        s.post(&logs, &tok, json!([{"level": "info", "message": "a"}]))
            .await
            .status,
        202
    );
    assert_eq!(
        s.delete(&format!("{DEV}/sessions/{sid}"), s.key())
            .await
            .status,
        204
    );
    s.post(&logs, &tok, json!([{"level": "info", "message": "b"}]))
        .await
        .assert_error(404);
    // The device itself can be deleted; its other sessions keep its name.
    let sid2 = session(&s, d, &tok).await;
    assert_eq!(
        s.delete(&format!("{DEV}/devices/{d}"), s.key())
            .await
            .status,
        204
    );
    let r = s.get(&format!("{DEV}/sessions/{sid2}"), s.key()).await;
    assert_eq!(r.body["device_name"], "x");
}

every_log_store!(idle_sessions_passivate_and_come_back_on_append);
/// Idle session actors passivate: with no appends and no subscribers for
/// `[sessions] idle_seconds` they stop and release their buffers; the next append or
/// subscriber starts them again from storage, with nothing lost.
async fn idle_sessions_passivate_and_come_back_on_append() {
    let s = start_with(|c| c.sessions.idle_seconds = 3).await;
    let (d, tok) = device(&s, "r").await;
    let running = |s: &Srv| {
        let s = s.http.get(s.url("/metrics"));
        async move {
            let m = s.send().await.unwrap().text().await.unwrap();
            m.lines()
                .find_map(|l| l.strip_prefix("fleetops_session_actors_running "))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        }
    };
    // 10,000 open sessions, each with one line (so each started an actor), from 32 clients.
    let made = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (http, base, tok, made) = (s.http.clone(), s.base.clone(), tok.clone(), made.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..(10_000 / 32 + 1) {
                let r: Value = http
                    .post(format!("{base}{DEV}/sessions"))
                    .bearer_auth(&tok)
                    .json(&json!({"device_id": d}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let sid = r["id"].as_u64().unwrap();
                let r = http
                    .post(format!("{base}{DEV}/sessions/{sid}/logs"))
                    .bearer_auth(&tok)
                    .json(&json!([{"level": "info", "message": "first"}]))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                made.lock().unwrap().push(sid);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut ids = made.lock().unwrap().clone();
    ids.sort_unstable();
    assert!(ids.len() >= 10_000);
    assert!(running(&s).await >= 1);
    assert!(
        eventually(30, || async { running(&s).await == 0 }).await,
        "idle session actors stopped"
    );
    // Back on append, counts and replay rebuilt from storage.
    for sid in ids.iter().step_by(ids.len() / 20).take(20) {
        let r = s
            .post(
                &format!("{DEV}/sessions/{sid}/logs"),
                &tok,
                json!([{"level": "info", "message": "second"}]),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.body);
        let l = s.get(&format!("{DEV}/sessions/{sid}/logs"), s.key()).await;
        assert_eq!(l.body["total"], 2, "{}", l.body);
    }
    assert_eq!(running(&s).await, 20);
}
