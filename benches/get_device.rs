//! Issue 1's figures: authenticated `GET .../devices/{id}` requests per second at 64
//! connections next to a bare hyper hello-world in the same run, and the idle resident memory
//! of `fleetops serve`.
//!
//! Run: `cargo bench --bench get_device` (needs `wrk`: `apt-get install wrk`).
//! Knobs: BENCH_SECS (default 10), BENCH_CONNECTIONS (default 64).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

fn main() {
    // `cargo bench` passes --bench; nothing else to parse.
    let secs = env_u32("BENCH_SECS", 10);
    let conns = env_u32("BENCH_CONNECTIONS", 64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());

    // Baseline.
    let (addr, task) = rt.block_on(start_baseline());
    wrk(&format!("http://{addr}/"), &[], conns, 2, None); // warm-up
    let base = wrk(&format!("http://{addr}/"), &[], conns, secs, None);
    task.abort();

    let (running, key, base_url, _data) = rt.block_on(start_fleetops());
    let dev = "/api/v1/organizations/default/projects/default/devices";
    let (id, token) = rt.block_on(async {
        let c = reqwest::Client::new();
        let (mut id, mut token) = (0, String::new());
        for i in 0..100 {
            let r: serde_json::Value = c
                .post(format!("{base_url}{dev}"))
                .bearer_auth(&key)
                .json(&json!({"name": format!("robot-{i}"), "labels": {"site": "bench"}}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            id = r["id"].as_u64().unwrap();
            token = r["device_token"].as_str().unwrap().to_string();
        }
        (id, token)
    });
    let url = format!("{base_url}{dev}/{id}");
    let auth = vec![format!("Authorization: Bearer {key}")];
    wrk(&url, &auth, conns, 2, None); // warm-up
    let fleet = wrk(&url, &auth, conns, secs, None);
    // Durable heartbeats of one device (each moves it in the device lists: last-seen entries
    // and per-second counters, in the same batch as the record).
    let script = std::env::temp_dir().join("fleetops-heartbeat.lua");
    std::fs::write(
        &script,
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = '{\"metrics\": {\"cpu\": 0.5}}'\n",
    )
    .unwrap();
    let beat_auth = vec![format!("Authorization: Bearer {token}")];
    let beat = wrk(
        &format!("{url}/heartbeat"),
        &beat_auth,
        conns,
        secs,
        script.to_str(),
    );
    // Durable device creations, each with a name of its own (a unique name per project).
    let create_script = std::env::temp_dir().join("fleetops-create-device.lua");
    std::fs::write(
        &create_script,
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nlocal n = 0\nlocal id = tostring(math.random(1, 1e9))\nrequest = function()\n  n = n + 1\n  return wrk.format(nil, nil, nil, '{\"name\": \"bench-' .. id .. '-' .. n .. '\"}')\nend\n",
    )
    .unwrap();
    let create = wrk(
        &format!("{base_url}{dev}"),
        &auth,
        conns,
        secs,
        create_script.to_str(),
    );
    let commit = commit_ms(running.runtime.store());
    rt.block_on(running.stop());

    println!();
    println!(
        "backend: {} (mean durable commit in this run {commit:.2} ms; the disk's fsync {:.2} ms)",
        backend(),
        fsync_latency_ms(&std::env::temp_dir(), 50)
    );
    println!("| server | requests/s | p50 ms | p99 ms | non-2xx |");
    println!("|---|---|---|---|---|");
    for (name, r) in [
        ("bare hyper hello-world", &base),
        ("fleetops GET device (API key)", &fleet),
        ("fleetops POST heartbeat (device token, durable)", &beat),
        ("fleetops POST device (API key, durable)", &create),
    ] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} |",
            r.requests_per_sec, r.p50_ms, r.p99_ms, r.non_2xx
        );
    }
    println!(
        "ratio fleetops / bare hyper: GET device {:.1}% (goal >= 50%), POST device {:.2}%, {conns} connections, {secs} s each",
        100.0 * fleet.requests_per_sec / base.requests_per_sec,
        100.0 * create.requests_per_sec / base.requests_per_sec
    );

    // Idle resident memory of the real binary.
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fleetops"))
        .arg("serve")
        .current_dir(dir.path())
        .env("FLEETOPS_LISTEN", "127.0.0.1:0")
        .env("FLEETOPS_DATA_DIR", dir.path().join("data"))
        .env("FLEETOPS_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let rss = rss_mb(child.id());
    let _ = child.kill();
    let _ = child.wait();
    println!("idle RSS of `fleetops serve` after start-up: {rss:.1} MB (goal < 50 MB)");
}
