//! Phased, health-gated rollouts through the real server, followed by simulated robots (a
//! helper that polls the device update API with its ETag and reports like a robot): 50
//! robots through three phases; a phase over its failure rate pausing (and a member's
//! resume, pause and abort); a gate alert rule firing on a canary (a `metric_threshold`
//! through heartbeats) pausing, or rolling the started phases back to the previous package,
//! and the notice reaching the rule's integration; kill -9 mid-rollout and continuing.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::*;
use crate::deployments::{DEPS, device};
use crate::updates::UPDATE;

mod alert_gates;
mod kill9;
mod phases;
mod provenance;

/// A simulated robot: polls with its ETag; on a new package it reports downloading,
/// installing, rebooting, then succeeded (or failed when told to fail).
pub(crate) struct Robot {
    pub id: u64,
    pub token: String,
    pub fail: bool,
    pub etag: Option<String>,
    /// The package it runs (the last one it was told to run).
    pub running: Option<u64>,
    pub polls: u64,
    /// The status of its last poll.
    pub last_status: u16,
}

impl Robot {
    pub fn new(id: u64, token: String) -> Self {
        Self {
            id,
            token,
            fail: false,
            etag: None,
            running: None,
            polls: 0,
            last_status: 0,
        }
    }

    /// One poll, and the install when the answer is a package it does not run yet.
    pub async fn cycle(&mut self, c: &reqwest::Client, base: &str) -> Option<u64> {
        let mut rb = c.get(format!("{base}{UPDATE}")).bearer_auth(&self.token);
        if let Some(e) = &self.etag {
            rb = rb.header("If-None-Match", e);
        }
        let Ok(r) = rb.send().await else {
            return self.running;
        };
        self.polls += 1;
        self.last_status = r.status().as_u16();
        match r.status().as_u16() {
            200 => {
                self.etag = r
                    .headers()
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                let body: Value = r.json().await.unwrap();
                let dep = body["deployment_id"].as_u64().unwrap();
                if self.running != Some(dep) {
                    let last = if self.fail { "failed" } else { "succeeded" };
                    for st in ["downloading", "installing", "rebooting", last] {
                        let r = c
                            .post(format!("{base}{UPDATE}/{dep}/status"))
                            .bearer_auth(&self.token)
                            .json(&json!({"status": st}))
                            .send()
                            .await;
                        if let Ok(r) = r {
                            assert_eq!(r.status(), 202, "{st}");
                        }
                    }
                    self.running = Some(dep);
                }
            }
            304 => {}
            204 => self.etag = None,
            other => panic!("poll answered {other}"),
        }
        self.running
    }
}

pub(crate) async fn robots(s: &Srv, n: usize, labels: Value) -> Vec<Robot> {
    let mut out = Vec::new();
    for i in 0..n {
        let (id, tok) = device(s, &format!("robot-{i}"), labels.clone()).await;
        out.push(Robot::new(id, tok));
    }
    out
}

pub(crate) async fn cycle_all(s: &Srv, fleet: &mut [Robot]) {
    for r in fleet.iter_mut() {
        r.cycle(&s.http, &s.base).await;
    }
}

pub(crate) async fn rollout(s: &Srv, dep: u64) -> Value {
    let r = s.get(&format!("{DEPS}/{dep}/rollout"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

/// Cycles the fleet until the rollout's state is `state`.
pub(crate) async fn until_state(
    s: &Srv,
    fleet: &mut [Robot],
    dep: u64,
    state: &str,
    secs: u64,
) -> Value {
    let t = Instant::now();
    loop {
        cycle_all(s, fleet).await;
        let r = rollout(s, dep).await;
        if r["state"] == state {
            return r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "rollout never {state}: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn actions(r: &Value) -> Vec<String> {
    r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["action"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn phase_devices(r: &Value, phase: usize) -> Vec<u64> {
    r["phases"][phase]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect()
}

pub(crate) async fn create(s: &Srv, body: Value) -> u64 {
    let r = s.post(DEPS, s.key(), body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

/// A member's pause, resume or abort of the package's rollout.
pub(crate) async fn act(s: &Srv, dep: u64, action: &str) -> Resp {
    s.post(
        &format!("{DEPS}/{dep}/rollout/{action}"),
        s.key(),
        json!({}),
    )
    .await
}

pub(crate) async fn activate(s: &Srv, dep: u64) {
    let r = s
        .post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

pub(crate) fn quick(c: &mut fleetops::config::Config) {
    c.pipeline.rollout_tick_ms = 50;
}
