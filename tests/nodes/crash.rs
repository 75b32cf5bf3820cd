//! kill -9 of either node at random moments under mixed load (log batches to one session,
//! device creations, webhook deliveries, each sent to either node): no acknowledged write is
//! lost or stored twice, and a write cut by a kill is whole or absent.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Engines, Node, WEBHOOK_SECRET, call, client};

const DEV: &str = "/api/v1/organizations/default/projects/default";
const BATCH: usize = 5;

/// What was asked, and whether it was acknowledged.
#[derive(Default)]
struct Ledger {
    batches: HashMap<String, bool>,
    devices: HashMap<String, bool>,
    deliveries: HashMap<String, (u64, bool)>,
}

fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn pr(number: u64) -> Vec<u8> {
    let path = format!(
        "{}/tests/payloads/pull_request.opened.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut p: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    p["number"] = json!(number);
    p["pull_request"]["number"] = json!(number);
    p["pull_request"]["head"]["sha"] = json!(format!("{number:040}"));
    p["pull_request"]["draft"] = json!(false);
    p["installation"]["id"] = json!(957387);
    serde_json::to_vec(&p).unwrap()
}

fn sign(body: &[u8]) -> String {
    fleetops_testkit::sign(WEBHOOK_SECRET, body)
}

struct Load {
    c: reqwest::Client,
    bases: [String; 2],
    key: String,
    token: String,
    session: u64,
    ledger: Mutex<Ledger>,
    numbers: AtomicU64,
}

/// Three writers, each request to a node picked in turn; a request a kill cut is left in
/// doubt and the writer goes on.
fn workers(
    load: &Arc<Load>,
    cycle: u64,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for w in 0..3u64 {
        let (load, stop) = (load.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let base = &load.bases[((n + w) % 2) as usize];
                let mark = if w == 2 {
                    uuid::Uuid::new_v4().to_string()
                } else {
                    format!("#c{cycle}w{w}n{n}#")
                };
                let sent = match w {
                    0 => {
                        let batch: Vec<Value> = (0..BATCH)
                            .map(|i| json!({"level": "info", "message": format!("{mark} {i}")}))
                            .collect();
                        load.ledger
                            .lock()
                            .unwrap()
                            .batches
                            .insert(mark.clone(), false);
                        load.c
                            .post(format!("{base}{DEV}/sessions/{}/logs", load.session))
                            .bearer_auth(&load.token)
                            .json(&batch)
                            .send()
                            .await
                            .map(|r| (r.status().as_u16(), 202))
                    }
                    1 => {
                        load.ledger
                            .lock()
                            .unwrap()
                            .devices
                            .insert(mark.clone(), false);
                        load.c
                            .post(format!("{base}{DEV}/devices"))
                            .bearer_auth(&load.key)
                            .json(&json!({"name": mark}))
                            .send()
                            .await
                            .map(|r| (r.status().as_u16(), 201))
                    }
                    _ => {
                        let number = load.numbers.fetch_add(1, Ordering::Relaxed);
                        let body = pr(number);
                        load.ledger
                            .lock()
                            .unwrap()
                            .deliveries
                            .insert(mark.clone(), (number, false));
                        load.c
                            .post(format!("{base}/api/v1/scm/webhooks"))
                            .header("content-type", "application/json")
                            .header("X-Host-Event", "pull_request")
                            .header("X-Host-Delivery", &mark)
                            .header("X-Hub-Signature-256", sign(&body))
                            .body(body)
                            .send()
                            .await
                            .map(|r| (r.status().as_u16(), 202))
                    }
                };
                match sent {
                    Ok((got, want)) => {
                        assert_eq!(got, want, "{mark}");
                        let mut l = load.ledger.lock().unwrap();
                        match w {
                            0 => l.batches.insert(mark, true),
                            1 => l.devices.insert(mark, true),
                            _ => {
                                let number = l.deliveries[&mark].0;
                                l.deliveries.insert(mark, (number, true));
                                None
                            }
                        };
                    }
                    // Cut by the kill: in doubt.
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_either_node_at_random_moments_loses_and_duplicates_no_acknowledged_write() {
    let kills: u64 = std::env::var("NODES_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let mut seed = std::env::var("NODES_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    println!("nodes crash harness: NODES_CRASH_SEED={seed} NODES_CRASH_KILLS={kills}");
    let engines = Engines::start().await;
    let mut nodes: Vec<Node> = vec![engines.node("a"), engines.node("b")];
    let c = client();
    let key = nodes[0].printed("API key:");
    let (s, r) = call(
        &c,
        Method::POST,
        nodes[0].url(&format!("{DEV}/repositories")),
        &key,
        Some(json!({"full_name": "Codertocat/Hello-World"})),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let (s, d) = call(
        &c,
        Method::POST,
        nodes[0].url(&format!("{DEV}/devices")),
        &key,
        Some(json!({"name": "logger"})),
    )
    .await;
    assert_eq!(s, 201, "{d}");
    let token = d["device_token"].as_str().unwrap().to_string();
    let (s, r) = call(
        &c,
        Method::POST,
        nodes[1].url(&format!("{DEV}/sessions")),
        &token,
        Some(json!({"device_id": d["id"]})),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let load = Arc::new(Load {
        c: c.clone(),
        bases: [nodes[0].base.clone(), nodes[1].base.clone()],
        key: key.clone(),
        token,
        session: r["id"].as_u64().unwrap(),
        ledger: Mutex::default(),
        numbers: AtomicU64::new(1),
    });
    let mut load = load;
    for cycle in 0..kills {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = workers(&load, cycle, &stop);
        tokio::time::sleep(Duration::from_millis(200 + rng(&mut seed) % 800)).await;
        let victim = (rng(&mut seed) % 2) as usize;
        let name = nodes[victim].name.clone();
        let dead = nodes.remove(victim);
        dead.kill();
        // The survivor alone for a moment, then the victim again.
        tokio::time::sleep(Duration::from_millis(100 + rng(&mut seed) % 400)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
        let again = engines.node(&name);
        nodes.insert(victim, again);
        let l = Arc::get_mut(&mut load).expect("no worker left");
        l.bases = [nodes[0].base.clone(), nodes[1].base.clone()];
    }

    let ledger = std::mem::take(&mut *load.ledger.lock().unwrap());
    let base = nodes[0].base.clone();
    // Log batches: every acknowledged one once, every one in doubt whole or absent.
    let (s, v) = call(
        &c,
        Method::GET,
        format!("{base}{DEV}/sessions/{}/logs?limit=10000", load.session),
        &key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let mut by_mark: HashMap<String, usize> = HashMap::new();
    for e in v["items"].as_array().unwrap() {
        let m = e["message"].as_str().unwrap();
        *by_mark
            .entry(m.split_once(' ').unwrap().0.to_string())
            .or_default() += 1;
    }
    let mut acked_batches = 0;
    for (mark, acked) in &ledger.batches {
        let n = by_mark.remove(mark).unwrap_or(0);
        assert!(
            n == 0 || n == BATCH,
            "batch {mark}: {n} of {BATCH} lines stored"
        );
        assert!(!acked || n == BATCH, "acknowledged batch {mark} lost");
        acked_batches += usize::from(*acked);
    }
    assert!(by_mark.is_empty(), "lines never sent: {by_mark:?}");
    assert!(acked_batches > 0);
    // Devices: every acknowledged one once.
    let mut names: HashMap<String, usize> = HashMap::new();
    for page in 1.. {
        let (s, v) = call(
            &c,
            Method::GET,
            format!("{base}{DEV}/devices?page={page}&page_size=500"),
            &key,
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let items = v["items"].as_array().unwrap();
        for d in items {
            *names
                .entry(d["name"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        if items.len() < 500 {
            break;
        }
    }
    for (mark, acked) in &ledger.devices {
        let n = names.get(mark).copied().unwrap_or(0);
        assert!(n <= 1, "device {mark} stored {n} times");
        assert!(!acked || n == 1, "acknowledged device {mark} lost");
    }
    // Deliveries: every acknowledged one stored and worked, each pull request's run made once.
    for (mark, (number, acked)) in &ledger.deliveries {
        let mut outcome = Value::Null;
        for _ in 0..300 {
            let (s, d) = call(
                &c,
                Method::GET,
                format!("{base}/api/v1/scm/deliveries/{mark}"),
                &key,
                None,
            )
            .await;
            if s == 404 && !acked {
                break;
            }
            assert_eq!(s, 200, "acknowledged delivery {mark}: {d}");
            if d["outcome"] != "queued" {
                outcome = d["outcome"].clone();
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if *acked {
            assert_eq!(outcome, "dispatched", "delivery {mark}");
        }
        if outcome == "dispatched" {
            let (s, runs) = call(
                &c,
                Method::GET,
                format!("{base}{DEV}/test-runs?commit_sha={number:040}"),
                &key,
                None,
            )
            .await;
            assert_eq!(s, 200, "{runs}");
            assert_eq!(
                runs["items"].as_array().unwrap().len(),
                1,
                "pull request {number}: {runs}"
            );
        }
    }
    println!(
        "nodes crash harness: {kills} kills, {} batches, {} devices, {} deliveries acknowledged",
        acked_batches,
        ledger.devices.values().filter(|a| **a).count(),
        ledger.deliveries.values().filter(|(_, a)| *a).count(),
    );
}
