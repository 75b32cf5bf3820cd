//! The crash harness: mixed load through the real binary (log batches, artifact uploads,
//! webhook deliveries, capsule upload + confirm with the validation owed, deployment creation,
//! activation and rollout results, devices whose heartbeat stops so an alert fires and its
//! notification is owed; log batches sealed into segments every 100 lines), `kill -9` at
//! random moments, a restart on the same data directory,
//! and then every acknowledged write (201/202, and the 200 of a transition) checked present
//! exactly once, every write in doubt (its answer never came) all there or absent, queued
//! deliveries and owed validations and notifications completed once.
//!
//! `CRASH_KILLS` (default 20) kills; `CRASH_SEED` replays a run; `CRASH_LOG_LINES` stores that
//! many log lines first, so the time to healthy after each kill is measured at that size
//! (docs/performance.md: 200 kills and 1,000,000 lines, `cargo test --release`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::capsules::{archive, sha};
use crate::common::{DEV, eventually};
use crate::peers::Sink;
use crate::webhooks::{SECRET, pr, sign};

mod mixed;
mod seals;

const CAPS: &str = "/api/v1/projects/default/default";
const BATCH: usize = 20;

/// What was asked for, and whether its answer came (acknowledged) or not (in doubt).
#[derive(Default)]
struct Ledger {
    /// Log batch marker → acknowledged.
    batches: BTreeMap<String, bool>,
    /// Delivery id → (pull request number, acknowledged).
    deliveries: BTreeMap<String, (u64, bool)>,
    /// Device name → (id, acknowledged heartbeat) once created (acknowledged).
    devices: BTreeMap<String, Option<(u64, bool)>>,
    /// Artifact path → acknowledged.
    artifacts: BTreeMap<String, bool>,
    /// Capsule id → confirm acknowledged.
    capsules: BTreeMap<u64, bool>,
    /// Deployment id → (activation acknowledged, rollout result acknowledged).
    deployments: BTreeMap<u64, (bool, bool)>,
}

impl Ledger {
    fn acknowledged(&self) -> usize {
        self.batches.values().filter(|a| **a).count()
            + self.deliveries.values().filter(|d| d.1).count()
            + self.devices.values().filter(|d| d.is_some()).count()
            + self.artifacts.values().filter(|a| **a).count()
            + self.capsules.values().filter(|a| **a).count()
            + self.deployments.len()
            + self.deployments.values().filter(|d| d.0).count()
            + self.deployments.values().filter(|d| d.1).count()
    }
}

/// Fixed for the whole run: the credentials and the records every worker writes under.
struct Fixture {
    key: String,
    secret: String,
    session: u64,
    device: u64,
    token: String,
    capsule: u64,
}

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn env_n(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn artifact_bytes(path: &str) -> Vec<u8> {
    let mut x = path.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    (0..20_000).map(|_| rng(&mut x) as u8).collect()
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// Sets up the records the workers write under (on the first start).
async fn fixture(c: &reqwest::Client, base: &str, key: &str, secret: &str, sink: &Sink) -> Fixture {
    let post = |path: String, cred: String, body: Value| {
        let c = c.clone();
        let url = format!("{base}{path}");
        async move {
            json_of(
                c.post(url)
                    .bearer_auth(cred)
                    .json(&body)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    let (st, v) = post(
        format!("{DEV}/repositories"),
        key.into(),
        json!({"full_name": "Codertocat/Hello-World"}),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let (st, hook) = post(
        format!("{DEV}/integrations"),
        key.into(),
        json!({"type": "webhook", "name": "w", "config": {"url": sink.url("/a"), "signing_secret": "s"}}),
    )
    .await;
    assert_eq!(st, 201, "{hook}");
    let (st, v) = post(
        format!("{DEV}/alert-rules"),
        key.into(),
        json!({"name": "down", "severity": "critical", "integration_ids": [hook["id"]],
               "condition": {"type": "device_status", "status": "offline", "duration_seconds": 0}}),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let (st, d) = post(
        format!("{DEV}/devices"),
        key.into(),
        json!({"name": "fixture"}),
    )
    .await;
    assert_eq!(st, 201, "{d}");
    let (device, token) = (
        d["id"].as_u64().unwrap(),
        d["device_token"].as_str().unwrap().to_string(),
    );
    let (st, v) = post(
        format!("{DEV}/sessions"),
        token.clone(),
        json!({"device_id": device}),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let session = v["id"].as_u64().unwrap();
    let capsule = publish(c, base, secret, "fixture", "1.0.0").await.unwrap();
    assert!(
        eventually(30, || async {
            capsule_status(c, base, key, capsule).await == "passed"
        })
        .await
    );
    Fixture {
        key: key.into(),
        secret: secret.into(),
        session,
        device,
        token,
        capsule,
    }
}

/// upload-url, PUT, confirm: the capsule id, and whether the confirm was acknowledged (None
/// when not even the upload URL was).
pub(crate) async fn publish(
    c: &reqwest::Client,
    base: &str,
    secret: &str,
    name: &str,
    version: &str,
) -> Option<u64> {
    let bytes = archive(".tar", format!("{name} {version}").as_bytes());
    let r = c
        .post(format!("{base}{CAPS}/capsules/upload-url"))
        .header("X-Project-Secret", secret)
        .json(
            &json!({"name": name, "version": version, "capsule_type": "SW",
            "file_format": ".tar", "file_size_bytes": bytes.len()}),
        )
        .send()
        .await
        .ok()?;
    let (st, v) = json_of(r).await;
    assert!(st == 201, "{st} {v}");
    let id = v["capsule_id"].as_u64()?;
    let put = c
        .put(v["upload_url"].as_str()?)
        .body(bytes.clone())
        .send()
        .await
        .ok()?;
    assert_eq!(put.status(), 200);
    let r = c
        .post(format!("{base}{CAPS}/capsules/{id}/confirm"))
        .header("X-Project-Secret", secret)
        .json(&json!({"checksum_sha256": sha(&bytes)}))
        .send()
        .await
        .ok()?;
    assert!(r.status() == 202 || r.status() == 200, "{}", r.status());
    Some(id)
}

async fn capsule_status(c: &reqwest::Client, base: &str, key: &str, id: u64) -> String {
    let Ok(r) = c
        .get(format!("{base}{CAPS}/capsules/{id}"))
        .bearer_auth(key)
        .send()
        .await
    else {
        return String::new();
    };
    let (_, v) = json_of(r).await;
    v["validation_status"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Runs the workers until `stop`; each records what it asks before asking it.
fn workers(
    c: &reqwest::Client,
    base: &str,
    fx: &Arc<Fixture>,
    ledger: &Arc<Mutex<Ledger>>,
    cycle: u64,
    stop: &Arc<AtomicBool>,
    numbers: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let ctx = || {
        (
            c.clone(),
            base.to_string(),
            fx.clone(),
            ledger.clone(),
            stop.clone(),
            numbers.clone(),
        )
    };
    for w in 0..2 {
        let (c, base, fx, ledger, stop, _) = ctx();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let marker = format!("#c{cycle}w{w}n{n}#");
                let batch: Vec<_> = (0..BATCH)
                    .map(|i| json!({"level": "info", "message": format!("{marker} {i}")}))
                    .collect();
                ledger.lock().unwrap().batches.insert(marker.clone(), false);
                let Ok(r) = c
                    .post(format!("{base}{DEV}/sessions/{}/logs", fx.session))
                    .bearer_auth(&fx.token)
                    .json(&batch)
                    .send()
                    .await
                else {
                    return;
                };
                assert_eq!(r.status(), 202);
                ledger.lock().unwrap().batches.insert(marker, true);
            }
        }));
    }
    let (c, base, _, ledger, stop, numbers) = ctx();
    tasks.push(tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let number = numbers.fetch_add(1, Ordering::Relaxed);
            let id = uuid::Uuid::new_v4().to_string();
            let body =
                serde_json::to_vec(&pr("opened", number, &format!("{number:040}"), false)).unwrap();
            ledger
                .lock()
                .unwrap()
                .deliveries
                .insert(id.clone(), (number, false));
            let Ok(r) = c
                .post(format!("{base}/api/v1/scm/webhooks"))
                .header("X-Host-Event", "pull_request")
                .header("X-Host-Delivery", &id)
                .header("X-Hub-Signature-256", sign(SECRET, &body))
                .body(body)
                .send()
                .await
            else {
                return;
            };
            assert_eq!(r.status(), 202);
            ledger.lock().unwrap().deliveries.insert(id, (number, true));
        }
    }));
    let (c, base, fx, ledger, stop, _) = ctx();
    tasks.push(tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let name = format!("d-c{cycle}n{n}-");
            ledger.lock().unwrap().devices.insert(name.clone(), None);
            let Ok(r) = c
                .post(format!("{base}{DEV}/devices"))
                .bearer_auth(&fx.key)
                .json(&json!({"name": name}))
                .send()
                .await
            else {
                return;
            };
            let (st, d) = json_of(r).await;
            assert_eq!(st, 201, "{d}");
            // A body the kill cut short: the device stays in doubt.
            let (Some(id), Some(token)) = (d["id"].as_u64(), d["device_token"].as_str()) else {
                return;
            };
            ledger
                .lock()
                .unwrap()
                .devices
                .insert(name.clone(), Some((id, false)));
            let Ok(r) = c
                .post(format!("{base}{DEV}/devices/{id}/heartbeat"))
                .bearer_auth(token)
                .json(&json!({}))
                .send()
                .await
            else {
                return;
            };
            assert_eq!(r.status(), 202);
            ledger
                .lock()
                .unwrap()
                .devices
                .insert(name, Some((id, true)));
        }
    }));
    let (c, base, fx, ledger, stop, _) = ctx();
    tasks.push(tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let path = format!("c{cycle}/n{n}.bin");
            ledger.lock().unwrap().artifacts.insert(path.clone(), false);
            let Ok(r) = c
                .put(format!("{base}{DEV}/sessions/{}/files/{path}", fx.session))
                .bearer_auth(&fx.token)
                .body(artifact_bytes(&path))
                .send()
                .await
            else {
                return;
            };
            assert_eq!(r.status(), 201);
            ledger.lock().unwrap().artifacts.insert(path, true);
        }
    }));
    let (c, base, fx, ledger, stop, _) = ctx();
    tasks.push(tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let Some(id) = publish(&c, &base, &fx.secret, "load", &format!("{cycle}.{n}.0")).await
            else {
                return;
            };
            ledger.lock().unwrap().capsules.insert(id, true);
        }
    }));
    let (c, base, fx, ledger, stop, _) = ctx();
    tasks.push(tokio::spawn(async move {
        let mut n = 0;
        let deps = format!("{base}{CAPS}/deployments");
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let Ok(r) = c
                .post(&deps)
                .bearer_auth(&fx.key)
                .json(&json!({"name": format!("c{cycle}n{n}"), "composition_tag": "registry.example/nav:1.0.0",
                    "capsule_id": fx.capsule, "target_devices": [fx.device]}))
                .send()
                .await
            else {
                return;
            };
            let (st, v) = json_of(r).await;
            assert_eq!(st, 201, "{v}");
            let Some(dep) = v["id"].as_u64() else {
                return; // the body the kill cut short
            };
            ledger
                .lock()
                .unwrap()
                .deployments
                .insert(dep, (false, false));
            let Ok(r) = c
                .post(format!("{deps}/{dep}/activate"))
                .bearer_auth(&fx.key)
                .send()
                .await
            else {
                return;
            };
            assert_eq!(r.status(), 200);
            ledger
                .lock()
                .unwrap()
                .deployments
                .insert(dep, (true, false));
            let Ok(r) = c
                .post(format!("{deps}/{dep}/device-status"))
                .bearer_auth(&fx.token)
                .json(&json!({"device_id": fx.device, "status": "succeeded"}))
                .send()
                .await
            else {
                return;
            };
            assert_eq!(r.status(), 202);
            ledger
                .lock()
                .unwrap()
                .deployments
                .insert(dep, (true, true));
        }
    }));
    tasks
}

async fn get(c: &reqwest::Client, url: String, key: &str) -> (u16, Value) {
    json_of(c.get(url).bearer_auth(key).send().await.unwrap()).await
}

/// Seeds `lines` log lines into a session of their own, 10,000 a batch.
async fn seed_lines(c: &reqwest::Client, base: &str, fx: &Fixture, lines: u64) {
    let r = c
        .post(format!("{base}{DEV}/sessions"))
        .bearer_auth(&fx.token)
        .json(&json!({"device_id": fx.device}))
        .send()
        .await
        .unwrap();
    let (_, v) = json_of(r).await;
    let sid = v["id"].as_u64().unwrap();
    let batch: Vec<_> = (0..10_000)
        .map(|i| json!({"level": "info", "module": "seed", "message": format!("seed line {i} of a stored session")}))
        .collect();
    for _ in 0..lines.div_ceil(10_000) {
        let r = c
            .post(format!("{base}{DEV}/sessions/{sid}/logs"))
            .bearer_auth(&fx.token)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
