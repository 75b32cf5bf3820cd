//! Sealed log segments in the bucket: they go with their session, and a query the bucket cannot
//! answer is 503.

use std::time::Duration;

use super::*;
use crate::sessions::{device, session};

each_backend!(sealed_logs_live_in_the_bucket_and_go_with_their_session);
/// Sealed log segments go to the bucket, answer as the batches did, and leave nothing behind
/// when their session is deleted; a segment no record points at is swept once an hour old.
async fn sealed_logs_live_in_the_bucket_and_go_with_their_session() {
    let m = moto().await;
    let s = s3_server_with(&m, "logs", |c| c.logs.chunk_lines = 100).await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    for b in 0..12 {
        let batch: Vec<serde_json::Value> = (0..10)
            .map(|i| {
                let level = ["info", "error"][i % 2];
                serde_json::json!({"level": level, "message": format!("line {b}-{i}")})
            })
            .collect();
        let r = s.post(&logs, &tok, serde_json::Value::Array(batch)).await;
        assert_eq!(r.status, 202);
    }
    let before = s.get(&format!("{logs}?limit=1000"), s.key()).await.body;
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/complete"),
            &tok,
            serde_json::json!({"status": "completed"}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(10, || async {
            s.metric("fleetops_log_segments_written").await == 1.0
        })
        .await
    );
    let pid = s.project_id("default");
    let prefix = format!("logs/{pid}/{sid}/");
    let segs: Vec<String> = keys(&m, "logs")
        .await
        .into_iter()
        .filter(|k| k.starts_with(&prefix))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    // The same bucket after the restart: the cache starts empty.
    let endpoint = m.endpoint.clone();
    let s = s
        .restart_with(move |cfg| {
            cfg.storage.backend = "s3".into();
            cfg.storage.bucket = "logs".into();
            cfg.storage.endpoint = endpoint;
            cfg.storage.access_key_id = "testing".into();
            cfg.storage.secret_access_key = "testing".into();
            cfg.storage.allow_http = true;
            cfg.logs.chunk_lines = 100;
        })
        .await;
    assert_eq!(
        s.get(&format!("{logs}?limit=1000"), s.key()).await.body,
        before
    );
    assert_eq!(s.metric("fleetops_log_chunk_fetches").await, 2.0);

    // Orphans no location points at, both just written to the bucket: one named by a node
    // whose clock is two hours behind, one by a node on time. Their age is the bucket's.
    let now = fleetops_actors::clock::now_ms();
    let old = format!("{prefix}{:020}-{:020}-{}.seg", 900, 901, now - 7_200_000);
    let young = format!("{prefix}{:020}-{:020}-{}.seg", 902, 903, now);
    for k in [&old, &young] {
        let r = reqwest::Client::new()
            .put(format!("{}/logs/{k}", m.endpoint))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(s.rt().collect_orphans_now().await.unwrap(), 0);
    let left = keys(&m, "logs").await;
    assert!(left.contains(&old) && left.contains(&young), "{left:?}");
    // An hour later by the bucket's clock both are past their grace; the segment a location
    // points at stays.
    let later = std::time::Duration::from_secs(3601);
    assert_eq!(s.rt().collect_orphans_later(later).await.unwrap(), 2);
    let left = keys(&m, "logs").await;
    assert!(
        !left.contains(&old) && !left.contains(&young) && left.contains(&segs[0]),
        "{left:?}"
    );

    // A backup holds the chunk locations, and says the segments stay in the bucket.
    let to = s._dir.path().join("backup");
    let r = s
        .post(
            "/api/v1/admin/backup",
            s.key(),
            serde_json::json!({"to": to}),
        )
        .await;
    if crate::backend::on_postgres() {
        // The records are the database's to back up.
        let detail = r.assert_error(409);
        assert!(detail.contains("PostgreSQL"), "{detail}");
    } else {
        assert_eq!(r.status, 201, "{}", r.body);
        let missing = r.body["not_included"][0].as_str().unwrap();
        assert!(missing.contains("sealed log segments"), "{missing}");
    }

    let r = s.delete(&format!("{DEV}/sessions/{sid}"), s.key()).await;
    assert_eq!(r.status, 204);
    let left: Vec<String> = keys(&m, "logs")
        .await
        .into_iter()
        .filter(|k| k.starts_with(&prefix) && *k != young)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(s.rt().store().doomed_segments(10).unwrap().is_empty());
}

each_backend!(a_log_query_the_bucket_cannot_answer_is_503);
/// A bucket that stops answering makes a cold log query 503 with `Retry-After` (the store
/// may come back), within seconds, not a 500 and not a request held for minutes.
async fn a_log_query_the_bucket_cannot_answer_is_503() {
    let mut m = moto().await;
    let s = s3_server_with(&m, "down", |c| c.logs.chunk_lines = 100).await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let batch: Vec<serde_json::Value> = (0..50)
        .map(|i| serde_json::json!({"level": "info", "message": format!("line {i}")}))
        .collect();
    assert_eq!(
        s.post(&logs, &tok, serde_json::Value::Array(batch))
            .await
            .status,
        202
    );
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/complete"),
            &tok,
            serde_json::json!({"status": "completed"}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(10, || async {
            s.metric("fleetops_log_segments_written").await == 1.0
        })
        .await
    );
    // Restarted on the same bucket (a cold cache), then the bucket goes away.
    let endpoint = m.endpoint.clone();
    let s = s
        .restart_with(move |cfg| {
            cfg.storage.backend = "s3".into();
            cfg.storage.bucket = "down".into();
            cfg.storage.endpoint = endpoint;
            cfg.storage.access_key_id = "testing".into();
            cfg.storage.secret_access_key = "testing".into();
            cfg.storage.allow_http = true;
        })
        .await;
    m.stop();
    let asked = std::time::Instant::now();
    let r = s.get(&format!("{logs}?limit=1000"), s.key()).await;
    r.assert_error(503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        asked.elapsed() < Duration::from_secs(25),
        "{:?}",
        asked.elapsed()
    );
}
