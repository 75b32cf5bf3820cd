//! Integrations and alert rules through the real server, with real peers on loopback: an
//! HTTP sink (chat, incident, webhook targets), aiosmtpd (e-mail) and the Standard Webhooks
//! reference library (signatures).

use serde_json::{Value, json};

use crate::common::*;

mod integrations;
mod rules;

const INTEGRATIONS: &str = "/api/v1/organizations/default/projects/default/integrations";
const RULES: &str = "/api/v1/organizations/default/projects/default/alert-rules";

/// A server whose integrations may target loopback (the peers live there).
async fn server() -> Srv {
    start_with(|c| {
        c.alerts.allow_private_targets = true;
        c.alerts.request_timeout_seconds = 1;
        c.alerts.connect_timeout_seconds = 1;
    })
    .await
}

async fn create(s: &Srv, body: Value) -> Value {
    let r = s.post(INTEGRATIONS, s.key(), body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body
}

async fn test_send(s: &Srv, id: &Value) -> Value {
    let r = s
        .post(&format!("{INTEGRATIONS}/{id}/test"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Every file of the data directory, concatenated (to look for secrets in the clear).
fn data_bytes(dir: &std::path::Path) -> Vec<u8> {
    files(dir)
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .flatten()
        .collect()
}
