//! Issue 5's figures: accepted webhook deliveries per second and the time to 202 at 64
//! concurrent senders (durable: claimed and stored, fsynced by group commit), next to the
//! bare-hyper baseline in the same run; how fast the worker drains what was accepted; and the
//! lag from a delivery's receipt to its test run existing, at a steady rate.
//!
//! Run: `cargo bench --bench webhooks` (needs `wrk`: `apt-get install wrk`).
//! Knobs: BENCH_SECS (default 10), BENCH_CONNECTIONS (default 64), BENCH_LAG_RATE (deliveries
//! per second in the lag phase, default 2000), BENCH_LAG_SECS (default 5), BENCH_PAYLOAD (a
//! file under tests/payloads, default pull_request.opened; the lag phase always sends pull
//! requests), BENCH_COMMIT_DELAY_US (`[storage] commit_delay_us`, default 0).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const SECRET: &str = "bench-webhook-secret";

fn sign(body: &[u8]) -> String {
    fleetops_testkit::sign(SECRET, body)
}

/// The delivery sent: `BENCH_PAYLOAD` (a file under tests/payloads, default
/// pull_request.opened, 23 KB as sent).
fn payload() -> serde_json::Value {
    named(&std::env::var("BENCH_PAYLOAD").unwrap_or_else(|_| "pull_request.opened".into()))
}

fn named(name: &str) -> serde_json::Value {
    let p = format!("{}/tests/payloads/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// The event of `BENCH_PAYLOAD` (its file name up to the first dot).
fn event() -> String {
    let name = std::env::var("BENCH_PAYLOAD").unwrap_or_else(|_| "pull_request.opened".into());
    name.split('.').next().unwrap_or_default().to_string()
}

/// A wrk script posting `body` with a unique delivery id per request.
fn script(dir: &std::path::Path, body: &[u8]) -> String {
    let body_path = dir.join("body.json");
    std::fs::write(&body_path, body).unwrap();
    let lua = format!(
        r#"
local f = io.open("{body}", "rb")
local body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Host-Event"] = "{event}"
wrk.headers["X-Hub-Signature-256"] = "{sig}"
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local counter = 0
local prefix = 0
function init(args)
  math.randomseed(os.time() + (tid or 0) * 7919)
  prefix = math.random(0, 2147483647)
end
function request()
  counter = counter + 1
  local id = string.format("%08x-%04x-4%03x-a%03x-%012x", prefix, tid or 0,
    math.random(0, 4095), math.random(0, 4095), counter)
  wrk.headers["X-Host-Delivery"] = id
  return wrk.format(nil, nil, nil, nil)
end
"#,
        body = body_path.display(),
        sig = sign(body),
        event = event(),
    );
    let path = dir.join("deliver.lua");
    std::fs::write(&path, lua).unwrap();
    path.display().to_string()
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The store alone: claims (id + delivery with its list entries in sled, payload in the payload log
/// with its fdatasync) per second with payloads of `size` bytes, one writer, in batches of
/// 32 as the intake makes them under load, then one flush.
fn store_only(size: usize, n: u64) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let store = fleetops_storage::Store::open(dir.path()).unwrap();
    let payload = bytes::Bytes::from(vec![b'x'; size]);
    let t = Instant::now();
    let mut batch = Vec::new();
    for seq in 1..=n {
        let d = fleetops_storage::Delivery::received(
            seq,
            uuid::Uuid::new_v4().to_string(),
            "pull_request".into(),
            0,
            true,
            size as u64,
        );
        batch.push((d, Some(payload.clone())));
        if batch.len() == 32 || seq == n {
            store.claim_deliveries(&mut batch, i64::MAX).unwrap();
            batch.clear();
        }
    }
    let writes = t.elapsed();
    let t = Instant::now();
    store.flush_blocking().unwrap();
    (
        n as f64 / writes.as_secs_f64(),
        t.elapsed().as_secs_f64() * 1000.0,
    )
}

fn main() {
    for size in [2_000, 23_000] {
        let (rate, flush_ms) = store_only(size, 5_000);
        println!(
            "store only: {rate:.0} claims/s with {size}-byte payloads (one writer, batches of 32), final flush {flush_ms:.0} ms"
        );
    }
    let secs = env_u32("BENCH_SECS", 10);
    let conns = env_u32("BENCH_CONNECTIONS", 64);
    let lag_rate = env_u32("BENCH_LAG_RATE", 2000);
    let lag_secs = env_u32("BENCH_LAG_SECS", 5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());
    let tmp = tempfile::tempdir().unwrap();
    let body = serde_json::to_vec(&payload()).unwrap();
    let lua = script(tmp.path(), &body);

    let (addr, task) = rt.block_on(start_baseline());
    wrk(&format!("http://{addr}/"), &[], conns, 2, Some(&lua));
    let base = wrk(&format!("http://{addr}/"), &[], conns, secs, Some(&lua));
    task.abort();

    let (running, key, url, data) = rt.block_on(start_fleetops_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.storage.commit_delay_us = env_u32("BENCH_COMMIT_DELAY_US", 0).into();
    }));
    let fsync = fsync_latency_ms(data.path(), 200);
    let c = reqwest::Client::new();
    rt.block_on(async {
        let r = c
            .post(format!(
                "{url}/api/v1/organizations/default/projects/default/repositories"
            ))
            .bearer_auth(&key)
            .json(&json!({"full_name": "Codertocat/Hello-World"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    });
    let hook = format!("{url}/api/v1/scm/webhooks");
    wrk(&hook, &[], conns, 2, Some(&lua)); // warm-up
    let store = running.runtime.store().clone();
    let queued_before = store.deliveries_queued().unwrap();
    let cpu0 = cpu_seconds();
    let fleet = wrk(&hook, &[], conns, secs, Some(&lua));
    let server_cpu = cpu_seconds() - cpu0;
    // How long the worker takes to drain what the run accepted.
    let drain_start = Instant::now();
    let backlog = store.deliveries_queued().unwrap();
    while store.deliveries_queued().unwrap() > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let drained = drain_start.elapsed();
    let accepted = (fleet.requests_per_sec * f64::from(secs)) as usize;

    // Lag: distinct pull requests at a steady rate; receipt -> test run created.
    let n = (lag_rate * lag_secs) as usize;
    let bodies: Vec<(Vec<u8>, String)> = (0..n)
        .map(|i| {
            let mut p = named("pull_request.opened");
            p["number"] = json!(100_000 + i);
            p["pull_request"]["head"]["sha"] = json!(format!("{i:040x}"));
            let b = serde_json::to_vec(&p).unwrap();
            let s = sign(&b);
            (b, s)
        })
        .collect();
    let refused = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        u16,
        usize,
    >::new()));
    println!("lag phase: {n} distinct pull requests at {lag_rate}/s");
    rt.block_on(async {
        let gap = Duration::from_secs_f64(1.0 / f64::from(lag_rate.max(1)));
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::with_capacity(n);
        for (i, (b, s)) in bodies.into_iter().enumerate() {
            tokio::time::sleep_until(start + gap * i as u32).await;
            let (c, hook, refused) = (c.clone(), hook.clone(), refused.clone());
            tasks.push(tokio::spawn(async move {
                let r = c
                    .post(hook)
                    .header("X-Host-Event", "pull_request")
                    .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                    .header("X-Hub-Signature-256", s)
                    .body(b)
                    .send()
                    .await
                    .unwrap();
                if r.status() != 202 {
                    *refused
                        .lock()
                        .unwrap()
                        .entry(r.status().as_u16())
                        .or_default() += 1;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    while store.deliveries_queued().unwrap() > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut lags = Vec::new();
    for d in store.deliveries().unwrap().iter().take(n) {
        if let (Some(p), Some(r)) = (d.project_id, d.test_run_id)
            && let Some(run) = store.run(p, r).unwrap()
            && run.delivery_id.as_deref() == Some(d.delivery_id.as_str())
        {
            lags.push((run.created_at - d.received_at) as f64);
        }
    }
    rt.block_on(running.stop());

    println!();
    println!("| server | deliveries/s | p50 ms | p99 ms | non-2xx |");
    println!("|---|---|---|---|---|");
    for (name, r) in [
        ("bare hyper hello-world (same requests)", &base),
        ("fleetops POST /scm/webhooks (durable 202)", &fleet),
    ] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} |",
            r.requests_per_sec, r.p50_ms, r.p99_ms, r.non_2xx
        );
    }
    println!(
        "ratio fleetops / bare hyper: {:.1}%; {conns} connections, {secs} s, {} KB bodies; fsync of the data dir {fsync:.2} ms (median)",
        100.0 * fleet.requests_per_sec / base.requests_per_sec,
        body.len() / 1024
    );
    println!(
        "server CPU during the load: {:.2} of {} core-seconds, {:.0} µs per accepted delivery",
        server_cpu,
        2 * secs,
        server_cpu * 1e6 / (fleet.requests_per_sec * f64::from(secs))
    );
    println!(
        "worker: {backlog} of ~{accepted} accepted deliveries still queued when the load stopped (warm-up left {queued_before}); drained in {:.2} s",
        drained.as_secs_f64()
    );
    let count = lags.len();
    println!(
        "lag receipt -> test run at {lag_rate}/s for {lag_secs} s ({count} runs): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; not accepted (status: count) {:?}",
        pct(&mut lags, 0.5),
        pct(&mut lags, 0.99),
        pct(&mut lags, 1.0),
        refused.lock().unwrap()
    );
}
