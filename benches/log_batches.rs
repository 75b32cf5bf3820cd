//! Small log batches: what sealing changes. The same lines sent as 10-line batches (a robot
//! flushing every second) and as 1,000-line batches; the four log questions on each, with the
//! 10-line session open (every batch its own chunk) and then sealed (merged into chunks of
//! `[logs] chunk_lines`); durable ingest with sealing on and off, in 1,000-line and 10-line
//! batches; beside the disk's fsync latency and the bare-hyper baseline of the same run.
//!
//! Then the four questions on `BENCH_BIG_LINES` lines (1,000-line batches) sealed into segments
//! on an S3-compatible server on loopback (moto), warm (from the read cache) and cold (the
//! cache emptied before each ask), with the local bytes and the object bytes per line.
//!
//! Run: `cargo bench --bench log_batches` (needs `wrk`: `apt-get install wrk`; moto for the
//! S3 phase: `pip install 'moto[server]'`).
//! Knobs: BENCH_SECS (default 10, each ingest phase), BENCH_LINES (default 1,000,000),
//! BENCH_BIG_LINES (default 10,000,000; 0 skips the S3 phase), BENCH_ONLY_S3=1 (only that
//! phase).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

const DEV: &str = "/api/v1/organizations/default/projects/default";

fn p50(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Sends `lines` lines to `sid` in batches of `per`, from 8 clients; batches a second.
async fn load(
    c: &reqwest::Client,
    url: &str,
    key: &str,
    sid: u64,
    lines: usize,
    per: usize,
) -> f64 {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (c, url, key) = (c.clone(), url.to_string(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let mut b = w;
            while b * per < lines {
                let body = serde_json::to_vec(&batch(per, b * per)).unwrap();
                let r = c
                    .post(format!("{url}{DEV}/sessions/{sid}/logs"))
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
    (lines / per) as f64 / started.elapsed().as_secs_f64()
}

/// The four questions' query strings.
fn questions(lines: usize) -> Vec<String> {
    let rare = format!("step {} ", lines / 2 + 7 - (lines / 2 + 7) % 10 + 7).replace(' ', "%20");
    vec![
        format!("search={rare}"),
        "level=error".into(),
        "search=motor".into(),
        "module=arm".into(),
    ]
}

const NAMES: [&str; 4] = [
    "rare term (one line)",
    "level=error (10 %)",
    "search=motor (20 %)",
    "module=arm (25 %)",
];

/// The four questions on `sid`: p50 of 20 (after one not counted) each, with the totals.
async fn ask(c: &reqwest::Client, url: &str, key: &str, sid: u64, lines: usize) -> Vec<(f64, u64)> {
    let rare = format!("step {} ", lines / 2 + 7 - (lines / 2 + 7) % 10 + 7).replace(' ', "%20");
    let mut out = Vec::new();
    for q in [
        format!("search={rare}"),
        "level=error".into(),
        "search=motor".into(),
        "module=arm".into(),
    ] {
        let url = format!("{url}{DEV}/sessions/{sid}/logs?{q}&limit=100");
        let mut times = Vec::new();
        let mut total = 0;
        for i in 0..21 {
            let t = Instant::now();
            let v: Value = c
                .get(&url)
                .bearer_auth(key)
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
        out.push((p50(&mut times), total));
    }
    out
}

async fn metric(c: &reqwest::Client, url: &str, name: &str) -> f64 {
    let text = c
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn ingest_script(dir: &std::path::Path, per: usize) -> String {
    let body = serde_json::to_string(&batch(per, 0)).unwrap();
    let script = dir.join(format!("ingest{per}.lua"));
    std::fs::write(
        &script,
        format!("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = {}\n", lua_string(&body)),
    )
    .unwrap();
    script.to_str().unwrap().to_string()
}

fn main() {
    let secs = env_u32("BENCH_SECS", 10);
    let lines = env_u32("BENCH_LINES", 1_000_000) as usize;
    let big_lines = env_u32("BENCH_BIG_LINES", 10_000_000) as usize;
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

    let c = reqwest::Client::new();
    if std::env::var("BENCH_ONLY_S3").as_deref() == Ok("1") {
        s3_phase(&rt, &c, big_lines);
        return;
    }
    // 1. Durable ingest, sealing off and on (the default thresholds), alternately.
    for per in [1000usize, 10] {
        let script = ingest_script(dir.path(), per);
        let mut figures = Vec::new();
        for sealing in [false, true, false, true] {
            let (running, key, url, _data) = rt.block_on(start_fleetops_with(|cfg| {
                if !sealing {
                    cfg.logs.seal_lines = usize::MAX;
                    cfg.logs.seal_bytes = usize::MAX;
                    cfg.logs.seal_age_seconds = u64::MAX / 4000;
                }
            }));
            let sid = rt.block_on(sessions(&c, &url, &key, 1))[0];
            let r = wrk(
                &format!("{url}{DEV}/sessions/{sid}/logs"),
                &[format!("Authorization: Bearer {key}")],
                8,
                secs,
                Some(&script),
            );
            let sealed = rt.block_on(metric(&c, &url, "fleetops_log_batches_sealed"));
            println!(
                "ingest, {per}-line batches, sealing {}: {:.0} lines/s ({:.0} batches/s, p50 {:.2} ms, p99 {:.2} ms, non-2xx {}, batches sealed {sealed})",
                if sealing { "on" } else { "off" },
                r.requests_per_sec * per as f64,
                r.requests_per_sec,
                r.p50_ms,
                r.p99_ms,
                r.non_2xx
            );
            figures.push(r.requests_per_sec);
            rt.block_on(running.stop());
        }
        println!(
            "ingest, {per}-line batches: sealing on / off = {:.3} (best of two each)",
            figures[1].max(figures[3]) / figures[0].max(figures[2])
        );
    }

    // 2. The same lines as 1,000-line and as 10-line batches, the latter open and sealed.
    let (running, key, url, _data) = rt.block_on(start_fleetops_with(|cfg| {
        cfg.logs.seal_lines = usize::MAX;
        cfg.logs.seal_bytes = usize::MAX;
        cfg.logs.seal_age_seconds = u64::MAX / 4000;
    }));
    let ids = rt.block_on(sessions(&c, &url, &key, 2));
    let (big, small) = (ids[0], ids[1]);
    let rate = rt.block_on(load(&c, &url, &key, big, lines, 1000));
    println!("loaded {lines} lines as 1,000-line batches: {rate:.0} batches/s (8 clients)");
    let rate = rt.block_on(load(&c, &url, &key, small, lines, 10));
    println!("loaded {lines} lines as 10-line batches: {rate:.0} batches/s (8 clients)");
    let on_disk = running.runtime.store().size_on_disk().unwrap();
    let thousand = rt.block_on(ask(&c, &url, &key, big, lines));
    let open = rt.block_on(ask(&c, &url, &key, small, lines));
    let t = Instant::now();
    let r = rt
        .block_on(
            c.post(format!("{url}{DEV}/sessions/{small}/complete"))
                .bearer_auth(&key)
                .json(&json!({"status": "completed"}))
                .send(),
        )
        .unwrap();
    assert_eq!(r.status(), 200);
    let want = (lines / 10) as f64;
    let deadline = Instant::now() + Duration::from_secs(900);
    while rt.block_on(metric(&c, &url, "fleetops_log_batches_sealed")) < want {
        assert!(
            Instant::now() < deadline,
            "the seal did not finish in 15 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t.elapsed().as_secs_f64();
    let chunks = rt.block_on(metric(&c, &url, "fleetops_log_chunks_sealed"));
    println!(
        "sealed {} 10-line batches into {chunks} chunks in {took:.2} s ({:.0} lines/s)",
        want,
        lines as f64 / took
    );
    let sealed = rt.block_on(ask(&c, &url, &key, small, lines));
    let foot = running.runtime.store().log_footprint(small).unwrap();
    let stats = running.runtime.store().segment_stats();
    println!(
        "10-line session sealed, local bytes per line: {:.2} (summaries {:.2}, text filters {:.2}, locations {:.2}, open chunks {:.2}); object bytes per line {:.1} in {} segments",
        (foot.summaries + foot.filters + foot.locations + foot.open_chunks) as f64 / lines as f64,
        foot.summaries as f64 / lines as f64,
        foot.filters as f64 / lines as f64,
        foot.locations as f64 / lines as f64,
        foot.open_chunks as f64 / lines as f64,
        stats.segment_bytes_written as f64 / lines as f64,
        stats.segments_written
    );
    let open_foot = running.runtime.store().log_footprint(big).unwrap();
    println!(
        "1,000-line session unsealed, local bytes per line: {:.1}",
        (open_foot.summaries + open_foot.filters + open_foot.open_chunks) as f64 / lines as f64
    );
    println!(
        "sled size: {:.1} MB before the seal, {:.1} MB after (both sessions, {} lines)",
        on_disk as f64 / 1e6,
        running.runtime.store().size_on_disk().unwrap() as f64 / 1e6,
        2 * lines
    );
    println!(
        "| question | 1,000-line batches | 10-line, open | 10-line, sealed | sealed / 1,000-line |"
    );
    for (i, name) in [
        "rare term (one line)",
        "level=error (10 %)",
        "search=motor (20 %)",
        "module=arm (25 %)",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(thousand[i].1, open[i].1);
        assert_eq!(open[i].1, sealed[i].1);
        println!(
            "| {name}, total {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} |",
            thousand[i].1,
            thousand[i].0,
            open[i].0,
            sealed[i].0,
            sealed[i].0 / thousand[i].0
        );
    }
    rt.block_on(running.stop());
    if big_lines > 0 {
        s3_phase(&rt, &c, big_lines);
    }
}

/// The four questions on `lines` lines sealed into segments on moto, warm and cold.
fn s3_phase(rt: &tokio::runtime::Runtime, c: &reqwest::Client, lines: usize) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut moto = match std::process::Command::new(fleetops_testkit::python::python())
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(m) => m,
        Err(e) => {
            println!("S3 phase: not measured (python3: {e})");
            return;
        }
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let up = rt.block_on(async {
        for _ in 0..200 {
            if let Ok(r) = c.put(format!("{endpoint}/bench")).send().await {
                return r.status().is_success();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    });
    if !up {
        println!("S3 phase: not measured (moto did not start: pip install 'moto[server]')");
        let _ = moto.kill();
        return;
    }
    let ep = endpoint.clone();
    let (running, key, url, _data) = rt.block_on(start_fleetops_with(move |cfg| {
        cfg.storage.backend = "s3".into();
        cfg.storage.bucket = "bench".into();
        cfg.storage.endpoint = ep;
        cfg.storage.access_key_id = "testing".into();
        cfg.storage.secret_access_key = "testing".into();
        cfg.storage.allow_http = true;
        // Warm means every chunk a question reads is cached.
        cfg.logs.cache_bytes = 2 << 30;
    }));
    let sid = rt.block_on(sessions(c, &url, &key, 1))[0];
    let t = Instant::now();
    let rate = rt.block_on(load(c, &url, &key, sid, lines, 1000));
    let loaded = t.elapsed().as_secs_f64();
    let r = rt
        .block_on(
            c.post(format!("{url}{DEV}/sessions/{sid}/complete"))
                .bearer_auth(&key)
                .json(&json!({"status": "completed"}))
                .send(),
        )
        .unwrap();
    assert_eq!(r.status(), 200);
    let want = (lines / 1000) as f64;
    let deadline = Instant::now() + Duration::from_secs(900);
    while rt.block_on(metric(c, &url, "fleetops_log_batches_sealed")) < want {
        assert!(
            Instant::now() < deadline,
            "the seal did not finish in 15 minutes"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let sealed_in = t.elapsed().as_secs_f64();
    let stats = running.runtime.store().segment_stats();
    let foot = running.runtime.store().log_footprint(sid).unwrap();
    println!(
        "S3 (moto on loopback): loaded {lines} lines as 1,000-line batches at {rate:.0} batches/s ({:.0} lines/s) in {loaded:.1} s, all sealed after {sealed_in:.1} s: {} segments ({:.1} PUTs/s while loading), {:.1} object bytes per line, {:.2} local bytes per line (summaries {:.2}, text filters {:.2}, locations {:.2}, open {:.2})",
        lines as f64 / loaded,
        stats.segments_written,
        stats.segments_written as f64 / sealed_in,
        stats.segment_bytes_written as f64 / lines as f64,
        (foot.summaries + foot.filters + foot.locations + foot.open_chunks) as f64 / lines as f64,
        foot.summaries as f64 / lines as f64,
        foot.filters as f64 / lines as f64,
        foot.locations as f64 / lines as f64,
        foot.open_chunks as f64 / lines as f64,
    );
    let store = running.runtime.store().clone();
    println!(
        "| question on {lines} lines in segments | warm p50 | cold p50 | cold / warm | chunks fetched cold |"
    );
    for (name, q) in NAMES.iter().zip(questions(lines)) {
        let q = format!("{url}{DEV}/sessions/{sid}/logs?{q}&limit=100");
        let ask_once = || {
            let t = Instant::now();
            let v: Value = rt
                .block_on(async {
                    c.get(&q)
                        .bearer_auth(&key)
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                })
                .unwrap();
            assert!(v["total"].as_u64().is_some(), "{v}");
            t.elapsed().as_secs_f64() * 1000.0
        };
        let mut cold = Vec::new();
        let before = store.segment_stats().fetches;
        for _ in 0..3 {
            store.clear_segment_cache();
            cold.push(ask_once());
        }
        let fetched = (store.segment_stats().fetches - before) / 3;
        ask_once();
        let mut warm: Vec<f64> = (0..20).map(|_| ask_once()).collect();
        let (w, k) = (p50(&mut warm), p50(&mut cold));
        println!(
            "| {name} | {w:.1} ms | {k:.1} ms | {:.1} | {fetched} |",
            k / w
        );
    }
    rt.block_on(running.stop());
    let _ = moto.kill();
    let _ = moto.wait();
}
