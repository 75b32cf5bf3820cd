//! Sessions, log ingestion (JSON and NDJSON, atomic batches, limits), the log query with every
//! filter against a known data set, tags, completion, deletion and tenancy.

use serde_json::{Value, json};

use crate::common::*;

mod exports;
mod ingest;
mod query;
mod records;

pub async fn device(s: &Srv, name: &str) -> (u64, String) {
    let r = s
        .post(&format!("{DEV}/devices"), s.key(), json!({"name": name}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    )
}

pub async fn session(s: &Srv, device: u64, cred: &str) -> u64 {
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            cred,
            json!({"device_id": device}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

async fn ndjson(s: &Srv, sid: u64, cred: &str, body: String) -> Resp {
    s.raw(
        s.http
            .post(s.url(&format!("{DEV}/sessions/{sid}/logs")))
            .bearer_auth(cred)
            .header("content-type", "application/x-ndjson")
            .body(body),
    )
    .await
}

/// A known data set: timestamps out of arrival order, ties, several modules and levels.
pub async fn seeded(s: &Srv) -> u64 {
    let (d, tok) = device(s, "probe").await;
    let sid = session(s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let batch1 = json!([
        {"timestamp": "2026-03-01T10:00:05.000Z", "level": "warn", "module": "drive", "message": "Motor temperature high", "metadata": {"c": 81}},
        {"timestamp": "2026-03-01T10:00:01.000Z", "level": "info", "module": "nav", "message": "route planned"},
        {"timestamp": "2026-03-01T10:00:03.250Z", "level": "error", "module": "drive", "message": "MOTOR stall"},
    ]);
    let batch2 = json!([
        {"timestamp": "2026-03-01T10:00:03.250Z", "level": "debug", "module": "drive", "message": "motor current 3A"},
        {"timestamp": "2026-03-01T11:00:03+01:00", "level": "warn", "module": "nav", "message": "obstacle"},
        {"timestamp": "2026-03-01T10:00:09.999Z", "level": "INFO", "module": "", "message": "done"},
    ]);
    assert_eq!(s.post(&logs, &tok, batch1).await.status, 202);
    assert_eq!(s.post(&logs, &tok, batch2).await.status, 202);
    // On the sealing backends, what follows reads sealed chunks.
    s.sealed(sid).await;
    sid
}

fn messages(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect()
}
