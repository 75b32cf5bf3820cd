//! A panic inside an actor is contained: the actor restarts from storage, requests queued
//! behind the panic are answered by its replacement, and the server keeps answering.

use serde_json::json;

use crate::common::*;

mod budgets;
mod mailboxes;
mod restarts;

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
