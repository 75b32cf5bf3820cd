//! Issue 2's figures for sessions and logs: durable ingest rate, the query on a
//! 1,000,000-line session, the CSV export rate with its memory growth, and bytes on disk per
//! stored line, beside the disk's fsync latency and the bare-hyper baseline of the same run.
//!
//! Run: `cargo bench --bench logs` (needs `wrk`: `apt-get install wrk`).
//! Knobs: BENCH_SECS (default 10), BENCH_LINES (default 1,000,000), BENCH_CHDB=0 to skip
//! the ClickHouse comparison (`benches/support/chdb_logs.py`, run when `chdb` is installed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const DEV: &str = "/api/v1/organizations/default/projects/default";

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let secs = env_u32("BENCH_SECS", 10);
    let lines = env_u32("BENCH_LINES", 1_000_000) as usize;
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

    let (addr, task) = rt.block_on(start_baseline());
    let base = wrk(&format!("http://{addr}/"), &[], 8, secs.min(5), None);
    task.abort();
    println!(
        "bare hyper hello-world, 8 connections: {:.0} req/s",
        base.requests_per_sec
    );

    let (running, key, url, _data) = rt.block_on(start_fleetops());
    let c = reqwest::Client::new();
    let ids = rt.block_on(sessions(&c, &url, &key, 3));
    let (ingest_sid, query_sid, busy_sid) = (ids[0], ids[1], ids[2]);

    // 1. Ingest: 1,000-line JSON batches from 8 connections, every 202 durable.
    let body = serde_json::to_string(&batch(1000, 0)).unwrap();
    let script = dir.path().join("ingest.lua");
    std::fs::write(&script, format!("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = {}\n", lua_string(&body))).unwrap();
    let auth = vec![format!("Authorization: Bearer {key}")];
    let ingest = wrk(
        &format!("{url}{DEV}/sessions/{ingest_sid}/logs"),
        &auth,
        8,
        secs,
        script.to_str(),
    );
    println!(
        "ingest: {:.0} lines/s ({:.0} batches/s of 1,000 lines, 8 connections, p50 {:.2} ms, p99 {:.2} ms, non-2xx {}) (goal >= 400,000)",
        ingest.requests_per_sec * 1000.0,
        ingest.requests_per_sec,
        ingest.p50_ms,
        ingest.p99_ms,
        ingest.non_2xx
    );

    // 2. A session of `lines` lines, sent in 1,000-line batches by 8 concurrent clients.
    let started = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..8 {
            let (c, url, key) = (c.clone(), url.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let mut b = w;
                while b * 1000 < lines {
                    let body = serde_json::to_vec(&batch(1000, b * 1000)).unwrap();
                    let r = c
                        .post(format!("{url}{DEV}/sessions/{query_sid}/logs"))
                        .bearer_auth(&key)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 202);
                    b += 8;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    println!(
        "loaded {lines} lines in {:.1} s (client formatting included)",
        started.elapsed().as_secs_f64()
    );
    let on_disk = running.runtime.store().size_on_disk().unwrap();
    let total_lines = lines as f64 + ingest.requests_per_sec * 1000.0 * secs as f64;
    println!(
        "disk: {:.0} bytes per stored line ({:.1} MB sled size for about {:.0} lines)",
        on_disk as f64 / total_lines,
        on_disk as f64 / 1e6,
        total_lines
    );

    // 3. Queries: the first page (100) and `total`, 30 times each (the first not counted).
    let rare = format!("step {} ", lines / 2 + 7 - (lines / 2 + 7) % 10 + 7);
    let questions: Vec<(&str, String)> = vec![
        ("level=warn&search=motor", "level=warn&search=motor".into()),
        ("level=error (10 %)", "level=error".into()),
        ("module=arm (25 %)", "module=arm".into()),
        ("search=stalled (10 %)", "search=stalled".into()),
        (
            "search, one line",
            format!("search={}", rare.replace(' ', "%20")),
        ),
    ];
    for (name, query) in questions {
        let q = format!("{url}{DEV}/sessions/{query_sid}/logs?{query}&limit=100");
        let mut times = Vec::new();
        let mut total = 0;
        rt.block_on(async {
            for i in 0..30 {
                let t = Instant::now();
                let v: Value = c
                    .get(&q)
                    .bearer_auth(&key)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if i > 0 {
                    times.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                total = v["total"].as_u64().unwrap();
            }
        });
        println!(
            "query {name}, limit=100, on {lines} lines (total {total}): p50 {:.1} ms, p99 {:.1} ms",
            percentile(&mut times.clone(), 0.5),
            percentile(&mut times, 0.99)
        );
    }

    // 3b. The same lines and questions in ClickHouse in-process (chdb), when installed.
    if std::env::var("BENCH_CHDB").as_deref() != Ok("0") {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/support/chdb_logs.py");
        match std::process::Command::new(fleetops_testkit::python::python())
            .args([script, &lines.to_string()])
            .output()
        {
            Ok(out) if out.status.success() => {
                print!("{}", String::from_utf8_lossy(&out.stdout));
            }
            Ok(out) => println!(
                "chdb: not measured ({}; `pip install chdb` to compare)",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("failed")
            ),
            Err(e) => println!("chdb: not measured (python3: {e})"),
        }
    }

    // 4. Export as CSV, with the server's resident memory sampled throughout.
    let pid = std::process::id();
    let before = rss_mb(pid);
    let peak = std::sync::Arc::new(std::sync::Mutex::new(before));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = rss_mb(pid);
                let mut p = peak.lock().unwrap();
                if r > *p {
                    *p = r;
                }
                drop(p);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let t = Instant::now();
    let (bytes, rows) = rt.block_on(async {
        let mut resp = c
            .get(format!(
                "{url}{DEV}/sessions/{query_sid}/logs/export?format=csv"
            ))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        let (mut bytes, mut rows) = (0usize, 0usize);
        while let Some(chunk) = resp.chunk().await.unwrap() {
            bytes += chunk.len();
            rows += chunk.iter().filter(|b| **b == b'\n').count();
        }
        (bytes, rows)
    });
    let el = t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let growth = *peak.lock().unwrap() - before;
    println!(
        "export csv: {} rows ({:.1} MB) in {:.2} s = {:.0} lines/s, resident memory growth {:.1} MB (goals >= 1,000,000 lines/s, <= 64 MB)",
        rows.saturating_sub(1),
        bytes as f64 / 1e6,
        el,
        (rows.saturating_sub(1)) as f64 / el,
        growth
    );
    // 5. Many clients at once: the filtered query on a 200,000-line session and the session's
    //    detail, 32 connections each, beside bare hyper at 32 connections in the same run.
    rt.block_on(async {
        for b in 0..200 {
            let r = c
                .post(format!("{url}{DEV}/sessions/{busy_sid}/logs"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&batch(1000, b * 1000)).unwrap())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
        }
    });
    let busy = secs.min(10);
    let (addr, task) = rt.block_on(start_baseline());
    let base32 = wrk(&format!("http://{addr}/healthz"), &[], 32, busy, None);
    task.abort();
    let q = wrk(
        &format!("{url}{DEV}/sessions/{busy_sid}/logs?level=warn&search=motor&limit=100"),
        &auth,
        32,
        busy,
        None,
    );
    let detail = wrk(
        &format!("{url}{DEV}/sessions/{busy_sid}"),
        &auth,
        32,
        busy,
        None,
    );
    println!(
        "bare hyper /healthz, 32 connections: {:.0} req/s, p50 {:.2} ms",
        base32.requests_per_sec, base32.p50_ms
    );
    println!(
        "query level=warn&search=motor, limit=100, on 200000 lines, 32 connections: {:.0} queries/s, p50 {:.1} ms, p99 {:.1} ms, non-2xx {} (goal >= 600/s, p50 <= 50 ms)",
        q.requests_per_sec, q.p50_ms, q.p99_ms, q.non_2xx
    );
    println!(
        "GET session detail, 32 connections: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, non-2xx {}; ratio to bare hyper {:.2} (goal >= 0.5)",
        detail.requests_per_sec,
        detail.p50_ms,
        detail.p99_ms,
        detail.non_2xx,
        detail.requests_per_sec / base32.requests_per_sec
    );

    println!("{}", rt.block_on(poll_summary(&url)));
    rt.block_on(running.stop());
}
