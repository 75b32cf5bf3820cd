//! A rollout's controller under a lease: kill -9 of the node holding it mid-rollout, and the
//! other node continues within the lease's time, deciding no phase twice.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use sha2::Digest;

use crate::harness::{Engines, LEASE_TTL_MS, Node, call, client};

const DEV: &str = "/api/v1/organizations/default/projects/default";
const PROJECT: &str = "/api/v1/projects/default/default";
const UPDATE: &str = "/api/v1/device/deployment";

fn tar_of(payload: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(payload.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "app/main.bin", payload).unwrap();
    b.into_inner().unwrap()
}

/// upload-url, PUT, confirm on `n`: the capsule's id.
async fn publish(c: &reqwest::Client, n: &Node, secret: &str) -> u64 {
    let bytes = tar_of(b"nav 1.0.0");
    let r: Value = c
        .post(n.url(&format!("{PROJECT}/capsules/upload-url")))
        .header("X-Project-Secret", secret)
        .json(
            &json!({"name": "nav", "version": "1.0.0", "capsule_type": "SW",
            "file_format": ".tar", "file_size_bytes": bytes.len()}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["capsule_id"].as_u64().unwrap_or_else(|| panic!("{r}"));
    let put = c
        .put(r["upload_url"].as_str().unwrap())
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let confirm = c
        .post(n.url(&format!("{PROJECT}/capsules/{id}/confirm")))
        .header("X-Project-Secret", secret)
        .json(&json!({"checksum_sha256": hex::encode(sha2::Sha256::digest(&bytes))}))
        .send()
        .await
        .unwrap();
    assert!(
        confirm.status() == 200 || confirm.status() == 202,
        "{}",
        confirm.status()
    );
    id
}

/// A robot: polls for its package and reports it installed.
struct Robot {
    token: String,
    running: Option<u64>,
}

impl Robot {
    async fn cycle(&mut self, c: &reqwest::Client, base: &str) {
        let Ok(r) = c
            .get(format!("{base}{UPDATE}"))
            .bearer_auth(&self.token)
            .send()
            .await
        else {
            return;
        };
        if r.status() != 200 {
            return;
        }
        let body: Value = r.json().await.unwrap();
        let dep = body["deployment_id"].as_u64().unwrap();
        if self.running == Some(dep) {
            return;
        }
        for st in ["downloading", "installing", "rebooting", "succeeded"] {
            let r = c
                .post(format!("{base}{UPDATE}/{dep}/status"))
                .bearer_auth(&self.token)
                .json(&json!({"status": st}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202, "{st}");
        }
        self.running = Some(dep);
    }
}

async fn view(c: &reqwest::Client, n: &Node, key: &str, dep: u64) -> Value {
    let (s, r) = call(
        c,
        Method::GET,
        n.url(&format!("{PROJECT}/deployments/{dep}/rollout")),
        key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{r}");
    r
}

/// What becomes of the node holding the rollout's lease mid-rollout.
enum Holder {
    /// kill -9.
    Killed,
    /// SIGSTOP past its lease, then SIGCONT once the other node decided the next phase.
    Paused,
}

/// A three-phase rollout started on A with B standing by; at its second phase A is killed
/// or paused. B must decide the third phase within the lease's time, and the rollout ends
/// with every phase decided once (`rest` twice: started, then completed).
async fn holder_lost_mid_rollout(holder: Holder) {
    let engines = Engines::start().await;
    // A alone first: its controller takes the rollout's lease.
    let a = engines.node("a");
    let c = client();
    let key = a.printed("API key:");
    let secret = a.printed("project secret:");
    let cap = publish(&c, &a, &secret).await;
    let mut fleet = Vec::new();
    for i in 0..12 {
        let (s, d) = call(
            &c,
            Method::POST,
            a.url(&format!("{DEV}/devices")),
            &key,
            Some(json!({"name": format!("k{i}"), "labels": {"fleet": "k"}})),
        )
        .await;
        assert_eq!(s, 201, "{d}");
        fleet.push(Robot {
            token: d["device_token"].as_str().unwrap().to_string(),
            running: None,
        });
    }
    let (s, d) = call(
        &c,
        Method::POST,
        a.url(&format!("{PROJECT}/deployments")),
        &key,
        Some(
            json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "k"}}],
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 3}, "min_wait_seconds": 1},
                {"name": "mid", "devices": {"count": 4}, "min_wait_seconds": 1},
                {"name": "rest", "devices": {"percent": 100}}
            ]}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{d}");
    let dep = d["id"].as_u64().unwrap();
    let (s, r) = call(
        &c,
        Method::POST,
        a.url(&format!("{PROJECT}/deployments/{dep}/activate")),
        &key,
        Some(json!({})),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    // B joins, its controller standing by; the robots poll both nodes.
    let b = engines.node("b");
    let t = Instant::now();
    loop {
        for (i, r) in fleet.iter_mut().enumerate() {
            r.cycle(&c, if i % 2 == 0 { &a.base } else { &b.base })
                .await;
        }
        if view(&c, &b, &key, dep).await["current_phase"] == "mid" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "mid never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paused = match holder {
        Holder::Killed => {
            a.kill();
            None
        }
        Holder::Paused => {
            a.signal("STOP");
            Some(a)
        }
    };
    let lost = Instant::now();
    let r = loop {
        for r in fleet.iter_mut() {
            r.cycle(&c, &b.base).await;
        }
        let r = view(&c, &b, &key, dep).await;
        if r["current_phase"] == "rest" {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "rest never started: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // B decided once A's lease lapsed: within its time, plus the phase's own wait and a tick.
    let took = lost.elapsed();
    assert!(
        took < Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(3),
        "B took {took:?} to start the next phase: {r}"
    );
    // A paused wakes up believing it still judges the rollout; the robots poll it too.
    if let Some(a) = &paused {
        a.signal("CONT");
    }
    loop {
        for (i, r) in fleet.iter_mut().enumerate() {
            let base = match &paused {
                Some(a) if i % 2 == 0 => &a.base,
                _ => &b.base,
            };
            r.cycle(&c, base).await;
        }
        let r = view(&c, &b, &key, dep).await;
        if r["state"] == "completed" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "never completed: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Give a resumed A its ticks: nothing more may be decided.
    if paused.is_some() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let r = view(&c, &b, &key, dep).await;
    let phases: Vec<&str> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["canary", "mid", "rest", "rest"], "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_node_holding_a_rollouts_lease_hands_it_to_the_other_without_a_phase_decided_twice()
 {
    holder_lost_mid_rollout(Holder::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_holder_paused_past_its_lease_and_resumed_decides_no_phase_twice() {
    holder_lost_mid_rollout(Holder::Paused).await;
}
