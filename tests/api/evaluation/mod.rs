//! The rule evaluator and the notifier through the real server: every condition type fires
//! once and resolves, with short durations, notifications reach a real HTTP sink, failures
//! are retried with backoff (and `Retry-After`), and a restart neither loses nor repeats an
//! alert.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;
use crate::peers::{Recorded, Sink};
use crate::sessions::device;

mod conditions;
mod lifecycle;
mod notifications;

const INTEGRATIONS: &str = "/api/v1/organizations/default/projects/default/integrations";
const RULES: &str = "/api/v1/organizations/default/projects/default/alert-rules";
const ALERTS: &str = "/api/v1/organizations/default/projects/default/alerts";

pub(crate) fn fast(c: &mut fleetops::config::Config) {
    c.alerts.allow_private_targets = true;
    c.alerts.tick_ms = 50;
    c.alerts.retry_base_ms = 200;
    c.alerts.request_timeout_seconds = 2;
    c.devices.offline_after_seconds = 1;
}

pub(crate) async fn webhook(s: &Srv, sink: &Sink) -> u64 {
    let r = s
        .post(
            INTEGRATIONS,
            s.key(),
            json!({"type": "webhook", "name": "sink", "config": {"url": sink.url("/alerts"), "signing_secret": "s3cret"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

pub(crate) async fn rule(s: &Srv, integration: u64, condition: Value) -> u64 {
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "r", "condition": condition, "severity": "critical", "integration_ids": [integration]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

pub(crate) async fn heartbeat(s: &Srv, d: u64, tok: &str, metrics: Value) {
    let r = s
        .post(
            &format!("{DEV}/devices/{d}/heartbeat"),
            tok,
            json!({"metrics": metrics}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
}

/// A device and an activated package targeting it: (device id, package id).
async fn activated_package(s: &Srv) -> (u64, u64) {
    let nav = crate::configurations::capsule(s, "nav", "1.0.0").await;
    let (d, _) = device(s, "r1").await;
    let deps = crate::deployments::DEPS;
    let r = s
        .post(
            deps,
            s.key(),
            json!({"name": "n", "composition_tag": "t", "capsule_id": nav, "target_devices": [d]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{deps}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    (d, dep)
}

pub(crate) async fn alerts(s: &Srv, query: &str) -> Value {
    let r = s.get(&format!("{ALERTS}?{query}"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Waits until the alert list (with `query`) has `n` items.
pub(crate) async fn wait_alerts(s: &Srv, query: &str, n: usize) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        last = alerts(s, query).await;
        if last["items"].as_array().map_or(0, Vec::len) >= n {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} alerts ({query}) never came: {last}");
}

fn events(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .map(|r| r.header("x-fleetops-event").unwrap_or("").to_string())
        .collect()
}

/// The alert once its notifications are no longer pending.
async fn wait_notified(s: &Srv, id: u64) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        let r = s.get(&format!("{ALERTS}/{id}"), s.key()).await;
        last = r.body;
        if last["notifications"]
            .as_array()
            .is_some_and(|n| !n.is_empty() && n.iter().all(|x| x["pending"] == false))
        {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("alert {id} was never notified: {last}");
}
