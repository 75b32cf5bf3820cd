//! Issue 3's figures: upload + confirm throughput of a 100 MB capsule (SHA-256 streamed,
//! resident memory sampled), and `GET /capsules` latency with 10,000 capsule versions in a
//! project.
//!
//! Run: `cargo bench --bench capsules`. Knobs: BENCH_CAPSULE_MB (100), BENCH_VERSIONS (10000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Instant;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::*;

const CAPS: &str = "/api/v1/projects/default/default/capsules";

fn main() {
    let mb = env_u32("BENCH_CAPSULE_MB", 100) as usize;
    let versions = env_u32("BENCH_VERSIONS", 10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());
    let (running, key, url, data) = rt.block_on(start_fleetops());
    println!(
        "fsync latency (4 KiB write + fdatasync, median of 200) in the data dir: {:.2} ms",
        fsync_latency_ms(data.path(), 200)
    );
    let secret = running.initial.clone().unwrap().project_secret;
    let c = reqwest::Client::new();

    // A tar of one file of `mb` MB.
    let payload: Vec<u8> = (0..mb * 1024 * 1024)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(payload.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "firmware.bin", &payload[..]).unwrap();
    let archive = b.into_inner().unwrap();
    drop(payload);
    let sha = hex::encode(Sha256::digest(&archive));
    let size = archive.len();

    let before = rss_mb(std::process::id());
    let (put_s, confirm_s, status) = rt.block_on(async {
        let r: Value = c.post(format!("{url}{CAPS}/upload-url")).header("X-Project-Secret", &secret)
            .json(&json!({"name": "fw", "version": "1.0.0", "capsule_type": "FW", "file_format": ".tar", "file_size_bytes": size}))
            .send().await.unwrap().json().await.unwrap();
        let id = r["capsule_id"].as_u64().unwrap();
        let t = Instant::now();
        let put = c.put(r["upload_url"].as_str().unwrap()).body(archive).send().await.unwrap();
        assert_eq!(put.status(), 200);
        let put_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let conf: Value = c.post(format!("{url}{CAPS}/{id}/confirm")).header("X-Project-Secret", &secret)
            .json(&json!({"checksum_sha256": sha})).send().await.unwrap().json().await.unwrap();
        (put_s, t.elapsed().as_secs_f64(), conf["validation_status"].as_str().unwrap_or("?").to_string())
    });
    let after = rss_mb(std::process::id());
    let mbytes = size as f64 / 1e6;
    println!(
        "{mbytes:.0} MB capsule: upload {:.0} MB/s ({put_s:.2} s), confirm (SHA-256 + archive check) {:.0} MB/s ({confirm_s:.2} s), together {:.0} MB/s; status {status}; process RSS {before:.0} -> {after:.0} MB (the bench itself holds the archive while sending)",
        mbytes / put_s,
        mbytes / confirm_s,
        mbytes / (put_s + confirm_s)
    );

    // 10,000 versions of one name (upload-url records; 8 concurrent clients).
    let t = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..8u32 {
            let (c, url, secret) = (c.clone(), url.clone(), secret.clone());
            tasks.push(tokio::spawn(async move {
                let mut i = w;
                while i < versions {
                    let r = c.post(format!("{url}{CAPS}/upload-url")).header("X-Project-Secret", &secret)
                        .json(&json!({"name": "app", "version": format!("{}.{}.{}", i / 10_000, (i / 100) % 100, i % 100), "capsule_type": "SW", "file_format": ".tar", "file_size_bytes": 1}))
                        .send().await.unwrap();
                    assert_eq!(r.status(), 201);
                    i += 8;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    println!(
        "created {versions} capsule versions in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut times = Vec::new();
    rt.block_on(async {
        for i in 0..30 {
            let t = Instant::now();
            let r = c
                .get(format!("{url}{CAPS}"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            let body = r.bytes().await.unwrap();
            if i > 0 {
                times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            assert!(body.len() > 100);
        }
    });
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "GET /capsules with {} versions: p50 {:.1} ms, p99 {:.1} ms (goal p50 <= 5 ms)",
        versions + 1,
        times[times.len() / 2],
        times[times.len() - 1]
    );
    rt.block_on(running.stop());
}
