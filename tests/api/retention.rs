//! Retention of ended sessions: `[logs] retention_days` and a project's own setting through
//! `/log-retention`; the housekeeper deletes ended sessions past it with their logs and files,
//! and never an active one.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;
use crate::sessions::{device, session};

const DAY: Duration = Duration::from_secs(86_400);

async fn ended(s: &Srv, tok: &str, d: u64, status: &str) -> u64 {
    let sid = session(s, d, tok).await;
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            tok,
            json!([{"level": "info", "message": "x"}]),
        )
        .await;
    assert_eq!(r.status, 202);
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/run.mcap")))
                .bearer_auth(tok)
                .body("recording"),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/complete"),
            tok,
            json!({"status": status}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    sid
}

async fn exists(s: &Srv, sid: u64) -> bool {
    s.get(&format!("{DEV}/sessions/{sid}"), s.key())
        .await
        .status
        == 200
}

each_backend!(a_projects_retention_is_read_and_set_by_its_admins);
async fn a_projects_retention_is_read_and_set_by_its_admins() {
    let s = start_with(|c| c.logs.retention_days = 30).await;
    let url = format!("{DEV}/log-retention");
    let r = s.get(&url, s.key()).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        json!({"retention_days": null, "default_retention_days": 30, "effective_retention_days": 30})
    );
    let member = s.member_key("member").await;
    s.patch(&url, &member, json!({"retention_days": 7}))
        .await
        .assert_error(403);
    let r = s.patch(&url, s.key(), json!({"retention_days": 7})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["effective_retention_days"], 7);
    assert_eq!(s.get(&url, &member).await.body["retention_days"], 7);
    let r = s.patch(&url, s.key(), json!({"retention_days": 0})).await;
    assert_eq!(r.body["effective_retention_days"], 0);
    for bad in [
        json!({"retention_days": 40_000}),
        json!({"retention_days": -1}),
        json!({"days": 3}),
    ] {
        s.patch(&url, s.key(), bad).await.assert_error(422);
    }
    let r = s
        .patch(&url, s.key(), json!({"retention_days": null}))
        .await;
    assert_eq!(r.body["retention_days"], Value::Null);
    assert_eq!(r.body["effective_retention_days"], 30);
}

each_backend!(ended_sessions_past_retention_are_deleted_with_their_logs_and_files);
async fn ended_sessions_past_retention_are_deleted_with_their_logs_and_files() {
    let s = start_with(|c| c.supervision.housekeeping_seconds = 1).await;
    let r = s
        .patch(
            &format!("{DEV}/log-retention"),
            s.key(),
            json!({"retention_days": 2}),
        )
        .await;
    assert_eq!(r.status, 200);
    let (d, tok) = device(&s, "r1").await;
    let done = ended(&s, &tok, d, "completed").await;
    let failed = ended(&s, &tok, d, "failed").await;
    let active = session(&s, d, &tok).await;
    let blobs = s._dir.path().join("data/blobs");
    assert_eq!(files(&blobs.join("artifacts")).len(), 2);
    // Completing sealed each ended session's logs into a segment of its own.
    assert!(eventually(5, || async { files(&blobs.join("logs")).len() == 2 }).await);
    let clock = s.rt().clock;
    // A day in: within retention, nothing goes.
    clock.advance(DAY);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(exists(&s, done).await && exists(&s, failed).await);
    // Three days in: both ended sessions go, with their logs; the active one stays.
    clock.advance(2 * DAY);
    assert!(
        eventually(10, || async {
            !exists(&s, done).await && !exists(&s, failed).await
        })
        .await
    );
    s.get(&format!("{DEV}/sessions/{done}/logs"), s.key())
        .await
        .assert_error(404);
    assert!(exists(&s, active).await);
    // The records go first; their segments follow (each on the to-delete list until gone).
    let logs_left = || {
        let keys = s.rt().store().key_snapshot().unwrap();
        keys.into_iter()
            .filter(|k| k.starts_with(b"logs:"))
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(5, || async {
            logs_left().is_empty() && files(&blobs).is_empty()
        })
        .await,
        "{:?} {:?}",
        logs_left(),
        files(&blobs)
    );
}

each_backend!(the_servers_default_applies_until_a_project_keeps_its_sessions_for_good);
async fn the_servers_default_applies_until_a_project_keeps_its_sessions_for_good() {
    let s = start_with(|c| {
        c.supervision.housekeeping_seconds = 1;
        c.logs.retention_days = 1;
    })
    .await;
    let r = s
        .post(
            "/api/v1/organizations/default/projects",
            s.key(),
            json!({"slug": "keep"}),
        )
        .await;
    assert_eq!(r.status, 201);
    let keep = "/api/v1/organizations/default/projects/keep";
    let r = s
        .patch(
            &format!("{keep}/log-retention"),
            s.key(),
            json!({"retention_days": 0}),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = s
        .post(&format!("{keep}/devices"), s.key(), json!({"name": "k"}))
        .await;
    let (kd, ktok) = (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    );
    let r = s
        .post(&format!("{keep}/sessions"), &ktok, json!({"device_id": kd}))
        .await;
    let kept = r.body["id"].as_u64().unwrap();
    let r = s
        .post(
            &format!("{keep}/sessions/{kept}/complete"),
            &ktok,
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(r.status, 200);
    let (d, tok) = device(&s, "r1").await;
    let gone = ended(&s, &tok, d, "completed").await;
    s.rt().clock.advance(2 * DAY);
    assert!(eventually(10, || async { !exists(&s, gone).await }).await);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let r = s.get(&format!("{keep}/sessions/{kept}"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
}
