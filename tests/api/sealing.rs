//! Sealing a session's log batches: small batches merged into chunks of `[logs] chunk_lines`,
//! at the session's end, past the size threshold and past the age threshold, with every
//! query, count and export answering exactly as before.

use serde_json::{Value, json};

use crate::common::*;
use crate::sessions::{device, session};

/// `n` batches of `per` lines over four modules and four levels, timestamps not in arrival
/// order, so that merging moves nothing a query orders by.
async fn send(s: &Srv, sid: u64, tok: &str, n: usize, per: usize) {
    let logs = format!("{DEV}/sessions/{sid}/logs");
    for b in 0..n {
        let batch: Vec<Value> = (0..per)
            .map(|i| {
                let k = b * per + i;
                let level = ["debug", "info", "warn", "error"][k % 4];
                let module = ["drive", "nav", "arm", "vision"][k % 3];
                let ms = (k * 7919) % 100_000;
                json!({"timestamp": format!("2026-05-01T10:{:02}:{:02}.{:03}Z", ms / 60_000, (ms / 1000) % 60, ms % 1000),
                       "level": level, "module": module,
                       "message": format!("step {k} {}", if k.is_multiple_of(97) { "rare-term" } else { "ok" }),
                       "metadata": {"k": k}})
            })
            .collect();
        let r = s.post(&logs, tok, Value::Array(batch)).await;
        assert_eq!(r.status, 202, "{}", r.body);
    }
}

/// The answers a user sees: pages of each kind of question, counts, and both exports.
async fn answers(s: &Srv, sid: u64) -> Vec<Value> {
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let mut out = Vec::new();
    for q in [
        "?limit=1000",
        "?limit=50&offset=120",
        "?search=rare-term&limit=1000",
        "?search=step 1&limit=30",
        "?level=error&limit=1000",
        "?module=arm&limit=25&offset=10",
        "?module=nav&level=warn&limit=1000",
        "?since=2026-05-01T10:00:30Z&until=2026-05-01T10:01:00Z&limit=1000",
    ] {
        let r = s.get(&format!("{logs}{q}"), s.key()).await;
        assert_eq!(r.status, 200, "{q}: {}", r.body);
        out.push(r.body);
    }
    for format in ["json", "csv"] {
        let r = s
            .http
            .get(s.url(&format!("{logs}/export?format={format}")))
            .bearer_auth(s.key())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        out.push(Value::String(r.text().await.unwrap()));
    }
    out
}

/// Completes the session (which seals what it has left).
async fn complete(s: &Srv, sid: u64, tok: &str) {
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/complete"),
            tok,
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

async fn sealed(s: &Srv, batches: f64, chunks: f64) -> bool {
    eventually(10, || async {
        s.metric("fleetops_log_batches_sealed").await == batches
            && s.metric("fleetops_log_chunks_sealed").await == chunks
    })
    .await
}

each_backend!(completing_a_session_merges_its_small_batches_and_answers_as_before);
async fn completing_a_session_merges_its_small_batches_and_answers_as_before() {
    let s = start_with(|c| {
        c.logs.seal_lines = 1_000_000;
        c.logs.chunk_lines = 100;
    })
    .await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    send(&s, sid, &tok, 43, 10).await;
    let before = answers(&s, sid).await;
    assert_eq!(before[0]["total"], 430);
    assert_eq!(s.metric("fleetops_log_batches_sealed").await, 0.0);
    complete(&s, sid, &tok).await;
    // 43 batches of 10 lines became four chunks of 100 and one of 30.
    assert!(sealed(&s, 43.0, 5.0).await);
    assert_eq!(answers(&s, sid).await, before);
    let r = s.get(&format!("{DEV}/sessions/{sid}"), s.key()).await;
    assert_eq!(r.body["metrics"]["log_count"], 430);
}

each_backend!(an_active_session_is_sealed_as_its_unsealed_lines_reach_the_threshold);
async fn an_active_session_is_sealed_as_its_unsealed_lines_reach_the_threshold() {
    let s = start_with(|c| {
        c.logs.seal_lines = 50;
        c.logs.chunk_lines = 1_000;
    })
    .await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    send(&s, sid, &tok, 4, 10).await;
    assert_eq!(s.metric("fleetops_log_batches_sealed").await, 0.0);
    send(&s, sid, &tok, 1, 10).await;
    assert!(sealed(&s, 5.0, 1.0).await);
    // Later batches stay apart from the sealed chunk, and are sealed on their own.
    send(&s, sid, &tok, 5, 10).await;
    assert!(sealed(&s, 10.0, 2.0).await);
    let r = s
        .get(&format!("{DEV}/sessions/{sid}/logs?limit=1000"), s.key())
        .await;
    assert_eq!(r.body["total"], 100);
}

each_backend!(batches_left_unsealed_are_sealed_once_the_oldest_is_past_the_age_threshold);
async fn batches_left_unsealed_are_sealed_once_the_oldest_is_past_the_age_threshold() {
    let s = start_with(|c| {
        c.logs.seal_lines = 1_000_000;
        c.logs.seal_age_seconds = 1;
        c.supervision.housekeeping_seconds = 1;
    })
    .await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    send(&s, sid, &tok, 7, 3).await;
    let before = answers(&s, sid).await;
    assert!(sealed(&s, 7.0, 1.0).await);
    assert_eq!(answers(&s, sid).await, before);
}

each_backend!(deleting_a_sealed_session_removes_its_logs);
async fn deleting_a_sealed_session_removes_its_logs() {
    let s = start_with(|c| c.logs.seal_lines = 20).await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    send(&s, sid, &tok, 6, 10).await;
    assert!(
        eventually(10, || async {
            s.metric("fleetops_log_batches_sealed").await >= 2.0
        })
        .await
    );
    let r = s.delete(&format!("{DEV}/sessions/{sid}"), s.key()).await;
    assert_eq!(r.status, 204);
    let r = s.get(&format!("{DEV}/sessions/{sid}/logs"), s.key()).await;
    r.assert_error(404);
    // Nothing of it is left in the logs tree: chunks, indexes, seal cursor and marker.
    let keys = s
        .running
        .as_ref()
        .unwrap()
        .runtime
        .store()
        .key_snapshot()
        .unwrap();
    let left: Vec<_> = keys.iter().filter(|k| k.starts_with(b"logs:")).collect();
    assert!(left.is_empty(), "{left:?}");
}

each_backend!(a_cold_selective_query_fetches_only_its_candidate_chunk);
async fn a_cold_selective_query_fetches_only_its_candidate_chunk() {
    let s = start_with(|c| {
        c.logs.seal_lines = 1_000_000;
        c.logs.chunk_lines = 100;
    })
    .await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    send(&s, sid, &tok, 43, 10).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let q = format!("{logs}?search=step%20150%20&limit=10");
    let open = s.get(&q, s.key()).await.body;
    assert_eq!(open["total"], 1);
    complete(&s, sid, &tok).await;
    assert!(sealed(&s, 43.0, 5.0).await);
    assert_eq!(s.metric("fleetops_log_segments_written").await, 1.0);
    // A restart starts with an empty cache: the five chunks are in the segment only.
    let s = s.restart().await;
    assert_eq!(s.metric("fleetops_log_chunk_fetches").await, 0.0);
    assert_eq!(s.get(&q, s.key()).await.body, open);
    // The summaries and text filters ruled four chunks out: one ranged GET.
    assert_eq!(s.metric("fleetops_log_chunk_fetches").await, 1.0);
    // The same question again is served from the cache.
    assert_eq!(s.get(&q, s.key()).await.body, open);
    assert_eq!(s.metric("fleetops_log_chunk_fetches").await, 1.0);
    assert!(s.metric("fleetops_log_chunk_cache_hits").await >= 1.0);
}

each_backend!(a_damaged_chunk_is_named_not_read);
/// A sealed chunk whose bytes changed in the blob store (a bit flipped on disk) is not read as
/// if it were whole: the query answers 500 naming the damaged chunk and its segment, and the
/// lines of the session still unsealed (none here) or of other sessions answer as before.
async fn a_damaged_chunk_is_named_not_read() {
    let s = start_with(|c| {
        c.logs.seal_lines = 1_000_000;
        c.logs.chunk_lines = 100;
    })
    .await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let other = session(&s, d, &tok).await;
    send(&s, sid, &tok, 10, 10).await;
    send(&s, other, &tok, 1, 10).await;
    complete(&s, sid, &tok).await;
    assert!(sealed(&s, 10.0, 1.0).await);
    let seg = files(&s._dir.path().join("data/blobs/logs"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    // A restart: nothing of the segment is cached.
    let s = s.restart().await;
    let r = s
        .get(&format!("{DEV}/sessions/{sid}/logs?limit=1000"), s.key())
        .await;
    let detail = r.assert_error(500).to_string();
    let name = seg.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        detail.starts_with("Stored data is damaged: the log chunk at bytes 0..")
            && detail.contains("fails its checksum")
            && detail.contains(&name),
        "{detail}"
    );
    let r = s
        .get(&format!("{DEV}/sessions/{other}/logs?limit=1000"), s.key())
        .await;
    assert_eq!(r.body["total"], 10, "{}", r.body);
}
