//! kill -9 at random moments under mixed load, a restart, and every acknowledged write checked
//! present once.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;
use crate::cli::{client, field, serve};
use crate::common::{DEV, eventually};
use crate::peers::Sink;
use crate::webhooks::SECRET;

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
