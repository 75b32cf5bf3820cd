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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::capsules::{archive, sha};
use crate::cli::{client, field, serve};
use crate::common::{DEV, eventually, files};
use crate::peers::Sink;
use crate::webhooks::{SECRET, pr, sign};

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

each_backend!(kill_9_at_random_moments_loses_and_duplicates_nothing);
async fn kill_9_at_random_moments_loses_and_duplicates_nothing() {
    let kills = env_n("CRASH_KILLS", 20);
    let mut seed = env_n(
        "CRASH_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    ) | 1;
    println!("crash harness: CRASH_SEED={seed} CRASH_KILLS={kills}");
    let sink = Sink::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[devices]\noffline_after_seconds = 1\n\
         [pipeline]\nsync_validation_max_bytes = 64\n\
         [alerts]\nallow_private_targets = true\ntick_ms = 100\nretry_base_ms = 200\n\
         [logs]\nseal_lines = 100\nchunk_lines = 200\n\
         [tiers.enterprise]\nrequests_per_minute = 10000000\n",
    )
    .unwrap();
    let env = [("FLEETOPS_SCM_WEBHOOK_SECRET", SECRET)];
    let mut p = serve(dir.path(), &env);
    let c = client();
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let secret = field(&p.stdout, "project secret:").unwrap().to_string();
    let fx = Arc::new(fixture(&c, &p.base, &key, &secret, &sink).await);
    let seeded = env_n("CRASH_LOG_LINES", 0);
    if seeded > 0 {
        seed_lines(&c, &p.base, &fx, seeded).await;
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let numbers = Arc::new(AtomicU64::new(1));
    let mut recoveries = Vec::new();
    let mut replayed = 0u64;
    for cycle in 0..kills {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = workers(&c, &p.base, &fx, &ledger, cycle, &stop, &numbers);
        tokio::time::sleep(Duration::from_millis(50 + rng(&mut seed) % 600)).await;
        p.child.kill().unwrap();
        p.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            // A worker whose request the kill cut returns; one that saw a wrong answer
            // panics, and that fails the run.
            t.await.unwrap();
        }
        drop(p);
        let t = Instant::now();
        p = serve(dir.path(), &env);
        let healthy = eventually(30, || async {
            c.get(format!("{}/healthz", p.base))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
        assert!(healthy, "not healthy after kill {cycle}");
        recoveries.push(t.elapsed());
        // Deliveries answered 202 whose sled write the kill cut (the intake does not wait
        // for sled's flush), written again from the journal at this start.
        let text = c
            .get(format!("{}/metrics", p.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        replayed += text
            .lines()
            .find_map(|l| l.strip_prefix("fleetops_webhook_deliveries_recovered "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("fleetops_webhook_deliveries_recovered on /metrics");
    }

    // Every acknowledged write exactly once; every write in doubt whole or absent.
    let base = p.base.clone();
    let l = std::mem::take(&mut *ledger.lock().unwrap());
    let (mut lost, mut duplicated, mut half) = (0, 0, 0);
    // One export of the whole session, counted by batch marker.
    let exported: Vec<Value> = c
        .get(format!(
            "{base}{DEV}/sessions/{}/logs/export?format=json",
            fx.session
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let present_lines = exported.len();
    let mut by_marker: HashMap<&str, usize> = HashMap::new();
    for e in &exported {
        let m = e["message"].as_str().unwrap_or_default();
        let marker = m.split_once(' ').map_or(m, |(k, _)| k);
        *by_marker.entry(marker).or_default() += 1;
    }
    let mut whole = Vec::new();
    for (marker, acked) in &l.batches {
        let n = by_marker.remove(marker.as_str()).unwrap_or(0);
        match (n, acked) {
            (0, true) => lost += 1,
            (0, false) => {}
            (n, _) if n == BATCH => whole.push(marker.clone()),
            (n, _) if n > BATCH => duplicated += 1,
            _ => half += 1,
        }
    }
    assert!(
        by_marker.is_empty(),
        "lines of batches never asked for: {by_marker:?}"
    );
    let (_, v) = get(&c, format!("{base}{DEV}/sessions/{}", fx.session), &key).await;
    assert_eq!(
        v["metrics"]["log_count"].as_u64().unwrap() as usize,
        present_lines,
        "lines outside the batches asked for"
    );
    // The query's totals, from the chunk summaries, agree with the export's full read: a
    // summary is never without its chunk, nor a chunk without its summary, after any kill.
    for (q, want) in [("level=info", present_lines), ("level=error", 0)] {
        let (st, v) = get(
            &c,
            format!("{base}{DEV}/sessions/{}/logs?{q}&limit=1", fx.session),
            &key,
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["total"].as_u64().unwrap() as usize, want, "{q}");
    }
    // Text searches, which the chunks' text filters prune, find every stored batch by its
    // marker (upper-cased, as search ignores case) and nothing for one never sent.
    assert!(!whole.is_empty());
    let never = "#c999w0n0#".to_string();
    for (marker, want) in whole
        .iter()
        .step_by(whole.len() / 25 + 1)
        .map(|m| (m, BATCH))
        .chain([(&never, 0)])
    {
        let (st, v) = get(
            &c,
            format!(
                "{base}{DEV}/sessions/{}/logs?search={}&limit=1",
                fx.session,
                urlencode(&marker.to_uppercase())
            ),
            &key,
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["total"].as_u64().unwrap() as usize, want, "{marker}");
    }
    for (path, acked) in &l.artifacts {
        let r = c
            .get(format!("{base}{DEV}/sessions/{}/files/{path}", fx.session))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => {
                if r.bytes().await.unwrap() != artifact_bytes(path) {
                    half += 1;
                }
            }
            404 if !acked => {}
            404 => lost += 1,
            other => panic!("artifact {path}: {other}"),
        }
    }
    for (name, created) in &l.devices {
        let (_, v) = get(
            &c,
            format!("{base}{DEV}/devices?name={}&page_size=10", urlencode(name)),
            &key,
        )
        .await;
        let n = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["name"] == name.as_str())
            .count();
        match (n, created) {
            (0, Some(_)) => lost += 1,
            (0 | 1, _) => {}
            _ => duplicated += 1,
        }
    }
    for (id, acked) in &l.capsules {
        let status = capsule_status(&c, &base, &key, *id).await;
        if *acked && status.is_empty() {
            lost += 1;
        }
    }
    for (dep, (activated, reported)) in &l.deployments {
        let (st, v) = get(&c, format!("{base}{CAPS}/deployments/{dep}"), &key).await;
        if st != 200 {
            lost += 1;
            continue;
        }
        if *activated && v["deployment_status"] != "active" {
            lost += 1;
        }
        let succeeded = v["device_results"]["succeeded"].as_u64().unwrap_or(0);
        match (succeeded, reported) {
            (0, true) => lost += 1,
            (0 | 1, _) => {}
            _ => duplicated += 1,
        }
    }

    // Owed work completes once: every confirmed capsule validated, every accepted delivery
    // worked into exactly one test run, every fired alert notified under one delivery id.
    let owed: Vec<u64> = l.capsules.keys().copied().collect();
    assert!(
        eventually(60, || async {
            for id in &owed {
                if capsule_status(&c, &base, &key, *id).await == "pending" {
                    return false;
                }
            }
            true
        })
        .await,
        "an owed validation never finished"
    );
    for id in &owed {
        assert_eq!(capsule_status(&c, &base, &key, *id).await, "passed", "{id}");
    }
    let total = |q: String| {
        let (c, key) = (c.clone(), key.clone());
        async move { get(&c, q, &key).await.1["total"].as_u64().unwrap_or(0) }
    };
    assert!(
        eventually(60, || async {
            total(format!(
                "{base}/api/v1/scm/deliveries?outcome=queued&page_size=1"
            ))
            .await
                == 0
        })
        .await,
        "queued deliveries never worked"
    );
    let mut accepted = 0u64;
    for (id, (_, acked)) in &l.deliveries {
        let (st, v) = get(&c, format!("{base}/api/v1/scm/deliveries/{id}"), &key).await;
        match (st, acked) {
            (200, _) => {
                accepted += 1;
                assert_eq!(v["outcome"], "dispatched", "{v}");
            }
            (404, false) => {}
            (404, true) => lost += 1,
            other => panic!("delivery {id}: {other:?}"),
        }
    }
    let runs = total(format!("{base}{DEV}/test-runs?page_size=1")).await;
    if runs > accepted {
        duplicated += (runs - accepted) as usize;
    }
    if runs < accepted {
        lost += (accepted - runs) as usize;
    }
    let fired: Vec<u64> = l
        .devices
        .values()
        .filter_map(|d| d.filter(|d| d.1).map(|d| d.0))
        .collect();
    let all_alerts = || {
        let (c, key, base) = (c.clone(), key.clone(), base.clone());
        async move {
            let mut by_device: HashMap<u64, Vec<u64>> = HashMap::new();
            for page in 1.. {
                let (_, v) = get(
                    &c,
                    format!("{base}{DEV}/alerts?page={page}&page_size=500"),
                    &key,
                )
                .await;
                for a in v["items"].as_array().cloned().unwrap_or_default() {
                    if let (Some(d), Some(id)) = (a["device_id"].as_u64(), a["id"].as_u64()) {
                        by_device.entry(d).or_default().push(id);
                    }
                }
                if v["has_more"] != true {
                    break;
                }
            }
            by_device
        }
    };
    assert!(
        eventually(30, || async {
            let by_device = all_alerts().await;
            fired.iter().all(|d| by_device.contains_key(d))
        })
        .await,
        "a device went offline and no alert fired"
    );
    let mut alert_ids = BTreeSet::new();
    for alerts in all_alerts().await.values() {
        duplicated += alerts.len() - 1;
        alert_ids.extend(alerts.iter().copied());
    }
    let notified = |sink: &Sink| {
        let mut by_alert: HashMap<u64, BTreeSet<String>> = HashMap::new();
        for r in sink.requests.lock().unwrap().iter() {
            if r.header("x-fleetops-event") == Some("alert.firing") {
                let id = r.json()["alert"]["alert_id"].as_u64().unwrap();
                by_alert
                    .entry(id)
                    .or_default()
                    .insert(r.header("x-fleetops-delivery").unwrap().to_string());
            }
        }
        by_alert
    };
    assert!(
        eventually(60, || async {
            let by_alert = notified(&sink);
            alert_ids.iter().all(|a| by_alert.contains_key(a))
        })
        .await,
        "an owed notification never went out"
    );
    for ids in notified(&sink).values() {
        duplicated += ids.len() - 1;
    }
    recoveries.sort();
    println!(
        "crash harness: {kills} kills, {} acknowledged writes ({} log batches, {} deliveries, \
         {} devices, {} alerts, {} artifacts, {} capsules, {} deployments), {} in doubt, \
         lost {lost}, duplicated {duplicated}, half-visible {half}; \
         time to healthy p50 {:?}, p90 {:?}, p99 {:?}, max {:?} ({seeded} seeded log lines); \
         {replayed} deliveries written again from the intake's journal",
        l.acknowledged(),
        l.batches.values().filter(|a| **a).count(),
        l.deliveries.values().filter(|d| d.1).count(),
        l.devices.values().filter(|d| d.is_some()).count(),
        alert_ids.len(),
        l.artifacts.values().filter(|a| **a).count(),
        l.capsules.len(),
        l.deployments.len(),
        l.batches.values().filter(|a| !**a).count()
            + l.deliveries.values().filter(|d| !d.1).count()
            + l.devices.values().filter(|d| d.is_none()).count()
            + l.artifacts.values().filter(|a| !**a).count(),
        recoveries[recoveries.len() / 2],
        recoveries[recoveries.len() * 9 / 10],
        recoveries[recoveries.len() * 99 / 100],
        recoveries.last().unwrap(),
    );
    assert_eq!((lost, duplicated, half), (0, 0, 0));
    // The journal's replay ran: under a steady stream of deliveries, some kill lands
    // between a batch's 202 and sled's next flush (every 500 ms). On PostgreSQL a delivery
    // and its payload are committed before the 202, and there is no journal to replay.
    assert!(
        kills < 5 || replayed > 0 || crate::backend::on_postgres(),
        "no kill exercised the journal's replay"
    );
    drop(l);
    drop(p);
    let store = crate::common::open_store(dir.path());
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A data directory whose server seals every batch at once into segments of 20-line chunks,
/// with a housekeeping pass every second.
fn sealing_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[logs]\nseal_lines = 1\nchunk_lines = 20\n[supervision]\nhousekeeping_seconds = 1\n",
    )
    .unwrap();
    dir
}

/// Lines of each marker in the session's export (which reads every chunk, sealed or not).
async fn marker_counts(
    c: &reqwest::Client,
    base: &str,
    key: &str,
    sid: u64,
) -> BTreeMap<String, usize> {
    let r = c
        .get(format!(
            "{base}{DEV}/sessions/{sid}/logs/export?format=json"
        ))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let all: Value = r.json().await.unwrap();
    let mut out = BTreeMap::new();
    for e in all.as_array().unwrap() {
        let m = e["message"]
            .as_str()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        *out.entry(m).or_default() += 1;
    }
    out
}

/// Waits for the process to end by itself (a failpoint aborted it); false after 20 s.
fn ended(p: &mut crate::cli::Proc) -> bool {
    for _ in 0..400 {
        if p.child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

each_backend!(kill_9_at_each_seal_step_loses_and_duplicates_no_line);
/// `kill -9` (an abort at a failpoint) after a seal's segment is written and before its
/// transaction, and again right after the transaction: after a restart every acknowledged
/// batch is there exactly once, the one in doubt whole or absent, every chunk readable.
async fn kill_9_at_each_seal_step_loses_and_duplicates_no_line() {
    for point in ["seal:after-put", "seal:after-commit"] {
        let dir = sealing_dir();
        let mut p = crate::cli::serve(dir.path(), &[("FLEETOPS_FAILPOINT", point)]);
        let key = field(&p.stdout, "API key:").unwrap().to_string();
        let c = client();
        let base = p.base.clone();
        let (token, sid) = crate::cli::device_and_session(&c, &base, &key).await;
        let (mut acked, mut doubt) = (Vec::new(), None);
        for i in 0..500 {
            let marker = format!("m{i}");
            let batch: Vec<_> = (0..5)
                .map(|j| json!({"level": "info", "message": format!("{marker} {j}")}))
                .collect();
            match c
                .post(format!("{base}{DEV}/sessions/{sid}/logs"))
                .bearer_auth(&token)
                .json(&batch)
                .send()
                .await
            {
                Ok(r) if r.status() == 202 => acked.push(marker),
                _ => {
                    doubt = Some(marker);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(ended(&mut p), "{point}: the failpoint was never reached");
        drop(p);
        let p = crate::cli::serve(dir.path(), &[]);
        let base = p.base.clone();
        let check = |counts: BTreeMap<String, usize>| {
            for m in &acked {
                assert_eq!(counts.get(m), Some(&5), "{point}: {m}");
            }
            let extra: Vec<_> = counts
                .iter()
                .filter(|(m, n)| !acked.contains(m) && (Some(*m) != doubt.as_ref() || **n != 5))
                .collect();
            assert!(extra.is_empty(), "{point}: {extra:?}");
        };
        check(marker_counts(&c, &base, &key, sid).await);
        // Completing seals what was left; every line reads back from segments the same.
        let r = c
            .post(format!("{base}{DEV}/sessions/{sid}/complete"))
            .bearer_auth(&token)
            .json(&json!({"status": "completed"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
        check(marker_counts(&c, &base, &key, sid).await);
        assert!(!files(&dir.path().join("data/blobs/logs")).is_empty());
    }
}

each_backend!(kill_9_between_a_delete_and_its_segments_deletion_leaves_nothing);
/// `kill -9` between a session's delete and the deletion of its segments: the restart
/// answers 404 for it and the housekeeper deletes its segments from the to-delete list.
async fn kill_9_between_a_delete_and_its_segments_deletion_leaves_nothing() {
    let dir = sealing_dir();
    let mut p = crate::cli::serve(dir.path(), &[("FLEETOPS_FAILPOINT", "delete:after-commit")]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (token, sid) = crate::cli::device_and_session(&c, &base, &key).await;
    for i in 0..6 {
        let batch: Vec<_> = (0..10)
            .map(|j| json!({"level": "info", "message": format!("m{i} {j}")}))
            .collect();
        let r = c
            .post(format!("{base}{DEV}/sessions/{sid}/logs"))
            .bearer_auth(&token)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let segs = dir.path().join("data/blobs/logs");
    // Every batch sealed, and no seal under way: the abort below leaves no segment of a seal
    // in flight (that one would be an orphan, for the hourly sweep).
    let sealed = || async {
        let text = c
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines().any(|l| l == "fleetops_log_batches_sealed 6")
    };
    assert!(eventually(30, sealed).await);
    assert!(!files(&segs).is_empty());
    let _ = c
        .delete(format!("{base}{DEV}/sessions/{sid}"))
        .bearer_auth(&key)
        .send()
        .await;
    assert!(ended(&mut p), "the failpoint was never reached");
    drop(p);
    assert!(!files(&segs).is_empty(), "the segments outlived the kill");
    let p = crate::cli::serve(dir.path(), &[]);
    let r = c
        .get(format!("{}{DEV}/sessions/{sid}", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(
        eventually(30, || async { files(&segs).is_empty() }).await,
        "{:?}",
        files(&segs)
    );
}
