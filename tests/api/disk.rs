//! A data directory below `[storage] min_free_bytes` (set above the free space, so no disk is
//! filled): writes are 507 with the contract's envelope and write nothing; reads, exports,
//! deletes and signing in go on; the free space is on `/metrics`.

use serde_json::json;

use crate::common::*;
use crate::sessions::{device, session};

const FLOOR: u64 = u64::MAX / 2;

#[tokio::test]
async fn below_the_disk_floor_writes_are_507_and_reads_exports_and_deletes_go_on() {
    let s = start().await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let r = s
        .post(&logs, &tok, json!([{"level": "info", "message": "before"}]))
        .await;
    assert_eq!(r.status, 202);
    let s = s.restart_with(|c| c.storage.min_free_bytes = FLOOR).await;
    let key = s.key().to_string();

    // Writes through every kind of credential: refused, nothing written.
    let r = s
        .post(&logs, &tok, json!([{"level": "info", "message": "after"}]))
        .await;
    let detail = r.assert_error(507);
    assert!(detail.contains("min_free_bytes"), "{detail}");
    let r = s
        .post(&format!("{DEV}/devices"), &key, json!({"name": "r2"}))
        .await;
    r.assert_error(507);
    let r = s
        .post(
            &format!("{DEV}/devices/{d}/heartbeat"),
            &tok,
            json!({"metrics": {"cpu": 1.0}}),
        )
        .await;
    r.assert_error(507);
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/a.txt")))
                .bearer_auth(&key)
                .body("x"),
        )
        .await;
    r.assert_error(507);
    let r = s
        .raw(
            s.http
                .post(s.url("/api/v1/scm/webhooks"))
                .header("x-github-event", "ping")
                .header("x-github-delivery", "d-1")
                .body("{}"),
        )
        .await;
    r.assert_error(507);
    // The caller is checked first: a bad credential is still 401.
    let r = s.post(&logs, "fops_not-a-key", json!([])).await;
    r.assert_error(401);

    // Reads, exports, sign-in and deletes go on.
    let r = s.get(&format!("{logs}?limit=10"), &key).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 1);
    assert_eq!(r.body["items"][0]["message"], "before");
    let r = s
        .http
        .get(s.url(&format!("{logs}/export?format=csv")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("before"));
    let r = s
        .http
        .post(s.url("/api/v1/auth/login"))
        .json(&json!({"email": "admin@localhost", "password": ADMIN_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        s.metric("fleetops_data_dir_min_free_bytes").await,
        FLOOR as f64
    );
    assert!(s.metric("fleetops_data_dir_free_bytes").await > 0.0);
    let r = s.delete(&format!("{DEV}/sessions/{sid}"), &key).await;
    assert_eq!(r.status, 204);

    // With the floor lowered, the refused writes go through as if never tried.
    let s = s.restart_with(|c| c.storage.min_free_bytes = 0).await;
    let r = s
        .post(&format!("{DEV}/devices"), s.key(), json!({"name": "r2"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s.get(&format!("{DEV}/devices/{d}"), s.key()).await;
    assert_eq!(r.body["metrics"], json!({}), "{}", r.body);
}
