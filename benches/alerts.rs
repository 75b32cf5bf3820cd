//! Issue 7's figures for alerting: 10,000 devices heartbeating every 10 s in one project with
//! 100 rules (25 of each condition type); the CPU the rules add (the same heartbeat load with
//! and without them, as a share of one core), the delay from a condition's due moment to its
//! notification reaching a sink on loopback (p50/p99), and the durable log ingest rate with
//! and without 25 log_pattern rules (the issue-2 figure, as a ratio).
//!
//! Run: `cargo bench --bench alerts` (needs `wrk`: `apt-get install wrk`).
//! Knobs: BENCH_DEVICES (10,000), BENCH_SECS (20 per phase), BENCH_STOP (200 devices made to
//! go offline and 200 made hot).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

const DEV: &str = "/api/v1/organizations/default/projects/default";

/// (arrival, device id, event) of every notification the sink got.
type Arrivals = Arc<Mutex<Vec<(Instant, u64, String)>>>;

/// A minimal HTTP/1.1 sink: answers 200 and records when each alert arrived.
async fn sink() -> (String, Arrivals) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let got: Arrivals = Arc::default();
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let g = g.clone();
            tokio::spawn(async move {
                let (rd, mut wr) = c.into_split();
                let mut rd = BufReader::new(rd);
                loop {
                    let mut line = String::new();
                    if rd.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut len = 0;
                    loop {
                        let mut h = String::new();
                        rd.read_line(&mut h).await.unwrap_or(0);
                        let h = h.trim_end().to_ascii_lowercase();
                        if h.is_empty() {
                            break;
                        }
                        if let Some(v) = h.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; len];
                    if rd.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let now = Instant::now();
                    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                        let d = v["alert"]["device_id"].as_u64().unwrap_or(0);
                        let e = v["event"].as_str().unwrap_or("").to_string();
                        g.lock().unwrap().push((now, d, e));
                    }
                    if wr
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, got)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Per device: the last acknowledged heartbeat and the first acknowledged hot one.
type Seen = HashMap<u64, (Option<Instant>, Option<Instant>)>;

/// What the heartbeat load does to each device now.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Normal,
    Hot,
    Silent,
}

/// Heartbeats every device every 10 s for `secs` from 64 tasks, in the modes `modes` says
/// (switched by `switch` at `switch_at`); returns, per device, the last acknowledged heartbeat
/// and the first acknowledged hot one.
#[allow(clippy::too_many_arguments)]
async fn heartbeats(
    c: &reqwest::Client,
    url: &str,
    devices: &[(u64, String)],
    secs: u64,
    switch: &HashMap<u64, Mode>,
    switch_at: Duration,
) -> Seen {
    let start = Instant::now();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let tasks = 64usize;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let mine: Vec<(u64, String)> = devices.iter().skip(t).step_by(tasks).cloned().collect();
        if mine.is_empty() {
            continue;
        }
        let (c, url, seen) = (c.clone(), url.to_string(), seen.clone());
        let switch = switch.clone();
        let gap = Duration::from_secs_f64(10.0 / mine.len() as f64);
        handles.push(tokio::spawn(async move {
            let mut next = start + gap.mul_f64(t as f64 / tasks as f64);
            let mut i = 0usize;
            while start.elapsed() < Duration::from_secs(secs) {
                tokio::time::sleep_until(next.into()).await;
                next += gap;
                let (id, tok) = &mine[i % mine.len()];
                i += 1;
                let mode = if start.elapsed() >= switch_at {
                    switch.get(id).copied().unwrap_or(Mode::Normal)
                } else {
                    Mode::Normal
                };
                if mode == Mode::Silent {
                    continue;
                }
                let cpu = if mode == Mode::Hot { 0.999 } else { 0.2 };
                let r = c
                    .post(format!("{url}{DEV}/devices/{id}/heartbeat"))
                    .bearer_auth(tok)
                    .json(&json!({"metrics": {"cpu": cpu, "temp": 40.0}}))
                    .send()
                    .await;
                if r.is_ok_and(|r| r.status() == 202) {
                    let now = Instant::now();
                    let mut s = seen.lock().unwrap();
                    let e = s.entry(*id).or_default();
                    e.0 = Some(now);
                    if mode == Mode::Hot && e.1.is_none() {
                        e.1 = Some(now);
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    Arc::try_unwrap(seen).unwrap().into_inner().unwrap()
}

fn main() {
    let n = env_u32("BENCH_DEVICES", 10_000) as usize;
    let secs = env_u32("BENCH_SECS", 20) as u64;
    let stop = env_u32("BENCH_STOP", 200) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    println!("machine: {}", machine());
    println!(
        "fsync latency (4 KiB write + fdatasync, median of 200) in the data dir: {:.2} ms",
        fsync_latency_ms(dir.path(), 200)
    );
    let (running, key, url, _data) = rt.block_on(start_fleetops_with(|c| {
        c.alerts.allow_private_targets = true;
        c.devices.offline_after_seconds = 15;
    }));
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(128)
        .build()
        .unwrap();
    let (hook_url, arrivals) = rt.block_on(sink());

    // The fleet.
    let t = Instant::now();
    let devices: Vec<(u64, String)> = rt.block_on(async {
        let mut out = Vec::with_capacity(n);
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let reqs = chunk.iter().map(|i| {
                let (c, url, key) = (c.clone(), url.clone(), key.clone());
                async move {
                    let v: Value = c
                        .post(format!("{url}{DEV}/devices"))
                        .bearer_auth(&key)
                        .json(&json!({"name": format!("robot-{i}")}))
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    (
                        v["id"].as_u64().unwrap(),
                        v["device_token"].as_str().unwrap().to_string(),
                    )
                }
            });
            out.extend(futures::future::join_all(reqs).await);
        }
        out
    });
    println!("{n} devices created in {:.1} s", t.elapsed().as_secs_f64());

    // Log ingest without rules (issue 2's measure: 1,000-line batches, 8 connections).
    let sid = rt.block_on(async {
        let (id, tok) = &devices[0];
        let v: Value = c
            .post(format!("{url}{DEV}/sessions"))
            .bearer_auth(tok)
            .json(&json!({"device_id": id}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["id"].as_u64().unwrap()
    });
    let batch: Vec<Value> = (0..1000)
        .map(|k| {
            let (level, msg) = match k % 10 {
                0 => ("warn", format!("motor {k} temperature high")),
                1 => ("warn", format!("battery {k} low")),
                2 => ("error", format!("motor {k} stalled")),
                3 | 4 => ("debug", format!("tick {k}")),
                _ => ("info", format!("step {k} completed in 12 ms")),
            };
            let module = ["drive", "nav", "arm", "vision"][k % 4];
            json!({"level": level, "module": module, "message": msg})
        })
        .collect();
    let script = dir.path().join("ingest.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = {}\n",
            lua_string(&serde_json::to_string(&batch).unwrap())
        ),
    )
    .unwrap();
    let auth = vec![format!("Authorization: Bearer {key}")];
    let logs_url = format!("{url}{DEV}/sessions/{sid}/logs");
    let ingest_a = wrk(&logs_url, &auth, 8, secs.min(10) as u32, script.to_str());

    // One continuous heartbeat load: `secs` without rules (A), the 100 rules created, 10 s
    // to settle, then `phase_b` with them (B); 5 s into B, `stop` devices go silent and `stop`
    // others report a hot cpu.
    let settle = 10;
    let phase_b = secs.max(30);
    let total = secs + settle + phase_b;
    let switch_at = Duration::from_secs(secs + settle + 5);
    let mut switch = HashMap::new();
    for (id, _) in devices.iter().take(stop) {
        switch.insert(*id, Mode::Silent);
    }
    for (id, _) in devices.iter().skip(stop).take(stop) {
        switch.insert(*id, Mode::Hot);
    }
    let start = Instant::now();
    let cpu_at = Arc::new(Mutex::new(Vec::new()));
    {
        let cpu_at = cpu_at.clone();
        let alerts = running.runtime.alerts.clone();
        let marks = [2, secs, secs + settle, total];
        std::thread::spawn(move || {
            for m in marks {
                let at = start + Duration::from_secs(m);
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                cpu_at
                    .lock()
                    .unwrap()
                    .push((cpu_seconds(), alerts.evaluator_busy_seconds()));
            }
        });
    }
    let rules = {
        let (c, url, key, hook_url) = (c.clone(), url.clone(), key.clone(), hook_url.clone());
        rt.spawn(async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            let v: Value = c
                .post(format!("{url}{DEV}/integrations"))
                .bearer_auth(&key)
                .json(&json!({"type": "webhook", "name": "sink", "config": {"url": hook_url, "signing_secret": "bench"}}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let hook = v["id"].as_u64().unwrap();
            let (mut offline_rules, mut log_rules) = (Vec::new(), Vec::new());
            for i in 0..25 {
                let conditions = [
                    json!({"type": "device_status", "status": "offline", "duration_seconds": 2}),
                    json!({"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 0.9 + i as f64 * 0.001, "duration_seconds": 5}),
                    json!({"type": "log_pattern", "pattern": format!("(temperature high|stalled) code{i}$"), "level": "error", "count": 5, "window_seconds": 60}),
                    json!({"type": "deployment_status", "status": "failed"}),
                ];
                for cond in conditions {
                    let r = c
                        .post(format!("{url}{DEV}/alert-rules"))
                        .bearer_auth(&key)
                        .json(&json!({"name": format!("r{i}"), "severity": "warning", "integration_ids": [hook], "condition": cond}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 201);
                    let v: Value = r.json().await.unwrap();
                    if cond["type"] == "device_status" {
                        offline_rules.push(v["id"].as_u64().unwrap());
                    }
                    if cond["type"] == "log_pattern" {
                        log_rules.push(v["id"].as_u64().unwrap());
                    }
                }
            }
            (offline_rules, log_rules)
        })
    };
    let seen = rt.block_on(heartbeats(&c, &url, &devices, total, &switch, switch_at));
    let (offline_rules, log_rules) = rt.block_on(rules).unwrap();
    // The load has stopped: the whole fleet would go offline 15 s from now, an alert storm
    // of 250,000 alerts that is not what the ingest figure below is about. Those rules are
    // disabled first.
    rt.block_on(async {
        for id in offline_rules {
            let r = c
                .patch(format!("{url}{DEV}/alert-rules/{id}"))
                .bearer_auth(&key)
                .json(&json!({"enabled": false}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    });
    // Let the last due moments pass.
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_at.lock().unwrap().clone();
    let cpu_a = (cpu[1].0 - cpu[0].0) / (secs - 2) as f64;
    let cpu_b = (cpu[3].0 - cpu[2].0) / phase_b as f64;
    let evaluating = (cpu[3].1 - cpu[2].1) / phase_b as f64;
    let got = arrivals.lock().unwrap().clone();
    let switched = start + switch_at;
    let mut first: HashMap<u64, Instant> = HashMap::new();
    let mut fired = 0;
    for (at, d, e) in &got {
        if e == "alert.firing" {
            fired += 1;
            if *at >= switched {
                first
                    .entry(*d)
                    .and_modify(|f| *f = (*f).min(*at))
                    .or_insert(*at);
            }
        }
    }
    let mut delays = Vec::new();
    for (id, mode) in &switch {
        let Some((last, hot)) = seen.get(id) else {
            continue;
        };
        let due = match mode {
            // Offline 15 s after the last heartbeat, for 2 s.
            Mode::Silent => last.map(|l| l + Duration::from_secs(17)),
            // Held above the threshold for 5 s from the first hot heartbeat.
            Mode::Hot => hot.map(|h| h + Duration::from_secs(5)),
            Mode::Normal => None,
        };
        if let (Some(due), Some(arrived)) = (due, first.get(id)) {
            // Signed: a notification before its due moment would show as negative.
            delays.push(
                (arrived.duration_since(start).as_secs_f64()
                    - due.duration_since(start).as_secs_f64())
                    * 1000.0,
            );
        }
    }
    println!(
        "heartbeats: {:.0}/s; the evaluator busy {:.2} % of one core (goal <= 10 %); process CPU without rules {:.1} % of one core, with 100 rules {:.1} % (+{:.1} %, notifier, sink and the 10,000 notifications included)",
        n as f64 / 10.0,
        evaluating * 100.0,
        cpu_a * 100.0,
        cpu_b * 100.0,
        (cpu_b - cpu_a) * 100.0
    );
    println!(
        "due moment -> notification at the sink: {} of {} conditions notified, {} firing notifications in all, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (goal p99 <= 2,000 ms)",
        delays.len(),
        switch.len(),
        fired,
        percentile(&mut delays.clone(), 0.5),
        percentile(&mut delays.clone(), 0.99),
        percentile(&mut delays, 1.0)
    );

    // Log ingest with 25 log_pattern rules on the session's device, once the notifications
    // of phase B are all out (the sink quiet for 2 s).
    let mut last = usize::MAX;
    while arrivals.lock().unwrap().len() != last {
        last = arrivals.lock().unwrap().len();
        std::thread::sleep(Duration::from_secs(2));
    }
    let ingest_b = wrk(&logs_url, &auth, 8, secs.min(10) as u32, script.to_str());
    // The same store, the log rules disabled: what the rules themselves cost.
    rt.block_on(async {
        for id in log_rules {
            let r = c
                .patch(format!("{url}{DEV}/alert-rules/{id}"))
                .bearer_auth(&key)
                .json(&json!({"enabled": false}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    let ingest_c = wrk(&logs_url, &auth, 8, secs.min(10) as u32, script.to_str());
    println!(
        "log ingest: fresh store, no rules {:.0} lines/s; after the phases above, with 25 log_pattern rules {:.0} lines/s, the same store with them disabled {:.0} lines/s: with / without = {:.1} % (goal >= 90 %)",
        ingest_a.requests_per_sec * 1000.0,
        ingest_b.requests_per_sec * 1000.0,
        ingest_c.requests_per_sec * 1000.0,
        ingest_b.requests_per_sec / ingest_c.requests_per_sec * 100.0
    );
}
