//! Issue 13's figures: device update polls per second with 10,000 devices (each request with
//! another device's token, as a fleet polls), with and without `If-None-Match`, next to the
//! bare-hyper baseline in the same run; and the time from a gate rule's firing heartbeat to
//! the rollout being paused.
//!
//! Run: `cargo bench --bench updates` (needs `wrk`: `apt-get install wrk`).
//! Knobs: BENCH_SECS (default 10), BENCH_CONNECTIONS (default 64), BENCH_DEVICES (default
//! 10000), BENCH_GATE_SAMPLES (default 10).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest;
use support::*;

const DEV: &str = "/api/v1/organizations/default/projects/default";
const PIPE: &str = "/api/v1/projects/default/default";

fn tar(content: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(content.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "app.bin", content).unwrap();
    b.into_inner().unwrap()
}

async fn capsule(c: &reqwest::Client, url: &str, secret: &str, version: &str) -> u64 {
    let bytes = tar(version.as_bytes());
    let r: Value = c
        .post(format!("{url}{PIPE}/capsules/upload-url"))
        .header("X-Project-Secret", secret)
        .json(
            &json!({"name": "nav", "version": version, "capsule_type": "SW",
            "file_format": ".tar", "file_size_bytes": bytes.len()}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = r["capsule_id"].as_u64().unwrap();
    c.put(r["upload_url"].as_str().unwrap())
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    let r = c
        .post(format!("{url}{PIPE}/capsules/{id}/confirm"))
        .header("X-Project-Secret", secret)
        .json(&json!({"checksum_sha256": hex::encode(sha2::Sha256::digest(&bytes))}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    id
}

async fn post(c: &reqwest::Client, url: String, key: &str, body: Value) -> Value {
    let r = c
        .post(url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

fn main() {
    let secs = env_u32("BENCH_SECS", 10);
    let conns = env_u32("BENCH_CONNECTIONS", 64);
    let n = env_u32("BENCH_DEVICES", 10_000) as usize;
    let samples = env_u32("BENCH_GATE_SAMPLES", 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());

    let (addr, task) = rt.block_on(start_baseline());
    wrk(&format!("http://{addr}/"), &[], conns, 2, None);
    let base = wrk(&format!("http://{addr}/"), &[], conns, secs, None);
    task.abort();

    // The default ticks (rollout 500 ms, alerts 250 ms): the gate figure is what operators get.
    let (running, key, url, _dir) = rt.block_on(start_fleetops_with(|c| {
        c.devices.offline_after_seconds = 3600;
    }));
    let secret = running.initial.clone().unwrap().project_secret;
    let c = reqwest::Client::new();
    let t = Instant::now();
    let tokens: Vec<(u64, String)> = rt.block_on(async {
        let mut out = Vec::with_capacity(n);
        let mut left = (0..n).collect::<Vec<_>>();
        while !left.is_empty() {
            let chunk: Vec<usize> = left.drain(..left.len().min(32)).collect();
            let made = futures::future::join_all(chunk.iter().map(|i| {
                post(
                    &c,
                    format!("{url}{DEV}/devices"),
                    &key,
                    json!({"name": format!("robot-{i}"), "labels": {"fleet": "bench"}}),
                )
            }))
            .await;
            for r in made {
                out.push((
                    r["id"].as_u64().unwrap(),
                    r["device_token"].as_str().unwrap().to_string(),
                ));
            }
        }
        out
    });
    println!("{n} devices created in {:.1} s", t.elapsed().as_secs_f64());
    let (dep, cap2) = rt.block_on(async {
        let cap = capsule(&c, &url, &secret, "1.0.0").await;
        let cap2 = capsule(&c, &url, &secret, "2.0.0").await;
        let d = post(
            &c,
            format!("{url}{PIPE}/deployments"),
            &key,
            json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap,
                "target_devices": [{"labels": {"fleet": "bench"}}]}),
        )
        .await;
        let dep = d["id"].as_u64().unwrap();
        post(
            &c,
            format!("{url}{PIPE}/deployments/{dep}/activate"),
            &key,
            json!({}),
        )
        .await;
        (dep, cap2)
    });

    // Every device's token, in a file the wrk script reads; each request uses the next one.
    let dir = tempfile::tempdir().unwrap();
    let tok_path = dir.path().join("tokens.txt");
    std::fs::write(
        &tok_path,
        tokens
            .iter()
            .map(|t| t.1.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let etag = rt.block_on(async {
        let r = c
            .get(format!("{url}/api/v1/device/deployment"))
            .bearer_auth(&tokens[0].1)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.headers()["etag"].to_str().unwrap().to_string()
    });
    let script = |conditional: bool| {
        let path = dir.path().join(format!("poll-{conditional}.lua"));
        let inm = if conditional {
            format!(", [\"If-None-Match\"] = {}", lua_string(&etag))
        } else {
            String::new()
        };
        std::fs::write(
            &path,
            format!(
                r#"
local tokens = {{}}
for line in io.lines({path}) do tokens[#tokens + 1] = line end
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local i = 0
function init(args)
  i = (tid or 0) * 7919
end
function request()
  i = i + 1
  local t = tokens[(i % #tokens) + 1]
  return wrk.format("GET", "/api/v1/device/deployment", {{["Authorization"] = "Bearer " .. t{inm}}}, nil)
end
"#,
                path = lua_string(tok_path.to_str().unwrap()),
            ),
        )
        .unwrap();
        path
    };
    let poll_url = format!("{url}/api/v1/device/deployment");
    let full = script(false);
    let cond = script(true);
    wrk(&poll_url, &[], conns, 3, full.to_str()); // warm-up: every device's answer cached
    let plain = wrk(&poll_url, &[], conns, secs, full.to_str());
    let not_modified = wrk(&poll_url, &[], conns, secs, cond.to_str());

    // Gate: a rule firing on a canary pauses the rollout; heartbeat -> paused, resumed between.
    let gate_ms: Vec<f64> = rt.block_on(async {
        let rule = post(
            &c,
            format!("{url}{DEV}/alert-rules"),
            &key,
            json!({"name": "hot", "severity": "critical", "integration_ids": [],
                "condition": {"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 90, "duration_seconds": 0}}),
        )
        .await["id"]
            .as_u64()
            .unwrap();
        let d = post(
            &c,
            format!("{url}{PIPE}/deployments"),
            &key,
            json!({"name": "nav 2", "composition_tag": "nav-2", "capsule_id": cap2,
                "target_devices": [{"labels": {"fleet": "bench"}}],
                "rollout": {"phases": [
                    {"name": "canary", "devices": {"count": 10}, "min_wait_seconds": 3600},
                    {"name": "rest", "devices": {"percent": 100}}],
                  "gate_alert_rule_ids": [rule], "on_failure": "pause"}}),
        )
        .await;
        let b = d["id"].as_u64().unwrap();
        post(&c, format!("{url}{PIPE}/deployments/{b}/activate"), &key, json!({})).await;
        let view = || async {
            c.get(format!("{url}{PIPE}/deployments/{b}/rollout"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        };
        let canary = view().await["phases"][0]["devices"][0]["id"].as_u64().unwrap();
        let tok = tokens.iter().find(|t| t.0 == canary).unwrap().1.clone();
        let beat = |cpu: f64| {
            let (c, url, tok) = (c.clone(), url.clone(), tok.clone());
            async move {
                let r = c
                    .post(format!("{url}{DEV}/devices/{canary}/heartbeat"))
                    .bearer_auth(&tok)
                    .json(&json!({"metrics": {"cpu": cpu}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
            }
        };
        let mut out = Vec::new();
        for _ in 0..samples {
            beat(10.0).await;
            tokio::time::sleep(Duration::from_millis(400)).await;
            if view().await["state"] == "paused" {
                post(&c, format!("{url}{PIPE}/deployments/{b}/rollout/resume"), &key, json!({})).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = Instant::now();
            beat(99.0).await;
            while view().await["state"] != "paused" {
                assert!(t.elapsed() < Duration::from_secs(30), "never paused");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            out.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        out
    });
    let _ = dep;
    rt.block_on(running.stop());

    println!();
    println!("| server | requests/s | p50 ms | p99 ms | non-2xx/3xx |");
    println!("|---|---|---|---|---|");
    for (name, r) in [
        ("bare hyper hello-world", &base),
        (
            "device poll, 200 with the package (links, provenance)",
            &plain,
        ),
        ("device poll, If-None-Match: 304", &not_modified),
    ] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} |",
            r.requests_per_sec, r.p50_ms, r.p99_ms, r.non_2xx
        );
    }
    println!(
        "ratio to bare hyper: 200 {:.1}%, 304 {:.1}% ({n} devices, {conns} connections, {secs} s each)",
        100.0 * plain.requests_per_sec / base.requests_per_sec,
        100.0 * not_modified.requests_per_sec / base.requests_per_sec
    );
    let mut g = gate_ms.clone();
    g.sort_by(f64::total_cmp);
    println!(
        "gate rule firing (heartbeat sent) -> rollout paused, {} samples: min {:.0} ms, median {:.0} ms, max {:.0} ms (default ticks: rollout 500 ms, alerts 250 ms)",
        g.len(),
        g.first().copied().unwrap_or(f64::NAN),
        g.get(g.len() / 2).copied().unwrap_or(f64::NAN),
        g.last().copied().unwrap_or(f64::NAN)
    );
}
