//! fleetops-agent's cost on a robot, against a release server on this machine (sled): the
//! agent's CPU and peak resident memory while it ships 1,000 and 10,000 lines a second from a
//! wrapped command; the lines a second one agent ships at most (a command printing as fast
//! as it can, timed to the session's completion); and the time from a package's activation
//! until every agent of a fleet has reported it succeeded. The bare-hyper baseline of the same
//! run is printed beside them, and the disk's fsync latency (every batch is synced to the
//! agent's spool and to the server's store).
//!
//! Run: `cargo bench --bench agent`. Knobs: BENCH_SECS (seconds at each rate, default 15),
//! BENCH_FLEET (agents in the fleet, default 100), BENCH_LINES (lines of the fastest run,
//! default 300000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

#[allow(dead_code)]
use fleetops_testkit::agent as harness;

use std::time::{Duration, Instant};

use harness::{Agent, DEV, Guard, Server};
use serde_json::json;
use support::*;

/// Peak resident memory (KiB) and CPU seconds of process `pid` so far.
fn usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some((hwm, ticks / 100.0))
}

/// Runs the agent around `cmd` until it exits: wall seconds, CPU seconds and peak RSS (KiB)
/// of the agent process (not of the command).
fn measured_run(agent: &Agent, cmd: &str) -> (f64, f64, u64) {
    let t = Instant::now();
    let mut child = agent
        .command(&["run", "--", "sh", "-c", cmd])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut last = (0, 0.0);
    loop {
        if let Some(u) = usage(pid) {
            last = u;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (t.elapsed().as_secs_f64(), last.1, last.0)
}

/// A command printing `rate` lines a second for `secs` seconds (python3, in steps of 10 ms).
fn paced(rate: u32, secs: u32) -> String {
    format!(
        "python3 -c 'import sys,time\nstep={}\nt=time.time()\nfor i in range({}):\n  sys.stdout.write(\"\".join(\"INFO reading %d of the lidar at 10 Hz, all nominal\\n\" % (i*step+j) for j in range(step)))\n  sys.stdout.flush()\n  t+=0.01\n  time.sleep(max(0,t-time.time()))'",
        (rate / 100).max(1),
        secs * 100
    )
}

fn main() {
    let secs = env_u32("BENCH_SECS", 15);
    let fleet_size = env_u32("BENCH_FLEET", 100);
    let lines = env_u32("BENCH_LINES", 300_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());
    let (addr, task) = rt.block_on(start_baseline());
    wrk(&format!("http://{addr}/"), &[], 64, 2, None);
    let base = wrk(&format!("http://{addr}/"), &[], 64, 10, None);
    task.abort();
    println!("bare hyper: {:.0} req/s", base.requests_per_sec);
    let server = Server::start();
    println!(
        "disk fsync: {:.2} ms",
        fsync_latency_ms(server.dir.path(), 200)
    );
    let token =
        rt.block_on(server.enrollment_token(json!({"name": "bench", "labels": {"fleet": "k"}})));
    let agent = Agent::new(&server, &token, "[logs]\nbatch_lines = 1000\n");
    assert!(agent.command(&["enroll"]).status().unwrap().success());

    for rate in [1_000u32, 10_000] {
        let (wall, cpu, rss) = measured_run(&agent, &paced(rate, secs));
        println!(
            "{rate} lines/s for {secs} s: agent CPU {:.1} % of a core, peak RSS {:.1} MiB (wall {wall:.1} s)",
            100.0 * cpu / wall,
            rss as f64 / 1024.0
        );
    }
    let (wall, cpu, rss) =
        measured_run(&agent, &format!("seq 1 {lines} | sed 's/^/INFO reading /'"));
    println!(
        "as fast as it can: {lines} lines shipped and the session completed in {wall:.2} s = {:.0} lines/s; agent CPU {cpu:.2} s, peak RSS {:.1} MiB",
        f64::from(lines) / wall,
        rss as f64 / 1024.0
    );

    // A fleet of agents polling every second; one package for all of them.
    let mut fleet = Vec::new();
    for _ in 0..fleet_size {
        let a = Agent::new(
            &server,
            &token,
            "[heartbeat]\ninterval_seconds = 30\n[update]\npoll_seconds = 1\ninstall_hook = \"true\"\n",
        );
        assert!(a.command(&["enroll"]).status().unwrap().success());
        let d = Guard(
            a.command(&["daemon"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        fleet.push((a, d));
    }
    let project = "/api/v1/projects/default/default";
    let secret = server.printed("project secret:");
    let cap = rt.block_on(async {
        let c = reqwest::Client::new();
        let b = tar_bytes(&vec![7u8; 1 << 20]);
        let r: serde_json::Value = c
            .post(format!("{}{project}/capsules/upload-url", server.base))
            .header("X-Project-Secret", &secret)
            .json(
                &json!({"name": "nav", "version": "1.0.0", "capsule_type": "SW",
                          "file_format": ".tar", "file_size_bytes": b.len()}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = r["capsule_id"].as_u64().unwrap();
        c.put(r["upload_url"].as_str().unwrap())
            .body(b.clone())
            .send()
            .await
            .unwrap();
        use sha2::Digest;
        let ok = c
            .post(format!("{}{project}/capsules/{id}/confirm", server.base))
            .header("X-Project-Secret", &secret)
            .json(&json!({"checksum_sha256": hex::encode(sha2::Sha256::digest(&b))}))
            .send()
            .await
            .unwrap();
        assert!(ok.status().is_success());
        id
    });
    let (s, d) = rt.block_on(server.call(
        reqwest::Method::POST,
        &format!("{project}/deployments"),
        Some(
            json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
                    "target_devices": [{"labels": {"fleet": "k"}}]}),
        ),
    ));
    assert_eq!(s, 201, "{d}");
    let dep = d["id"].as_u64().unwrap();
    let t = Instant::now();
    let (s, _) = rt.block_on(server.call(
        reqwest::Method::POST,
        &format!("{project}/deployments/{dep}/activate"),
        Some(json!({})),
    ));
    assert_eq!(s, 200);
    let ids: Vec<u64> = fleet
        .iter()
        .map(|(a, _)| a.identity()["device_id"].as_u64().unwrap())
        .collect();
    loop {
        let done = rt.block_on(async {
            let mut n = 0;
            for id in &ids {
                let h = server.get(&format!("{DEV}/devices/{id}/history")).await;
                let reports = h["items"][0]["reports"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if reports.iter().any(|r| r["state"] == "succeeded") {
                    n += 1;
                }
            }
            n
        });
        if done == ids.len() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "{done} of {} succeeded",
            ids.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    println!(
        "fleet of {fleet_size} agents polling every 1 s: activation to every one succeeded with a 1 MiB capsule in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

fn tar_bytes(payload: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(payload.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "app/main.bin", payload).unwrap();
    b.into_inner().unwrap()
}
