//! The update loop: a package installed through the install hook with each stage reported
//! once, across a kill -9 mid-install too; a capsule that does not match its package
//! reported failed; a three-phase rollout followed by ten agents to its end; a download
//! resumed from its last byte. Rollbacks in `rollbacks`, retries and configurations in
//! `packages`.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest;

use crate::harness::{Agent, DEV, Server};

const PROJECT: &str = "/api/v1/projects/default/default";

fn tar_of(payload: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(payload.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "app/main.bin", payload).unwrap();
    b.into_inner().unwrap()
}

/// Publishes capsule `nav` `version` (upload-url, PUT, confirm): its id and bytes.
async fn publish(server: &Server, version: &str) -> (u64, Vec<u8>) {
    let c = reqwest::Client::new();
    let secret = server.printed("project secret:");
    let bytes = tar_of(format!("nav {version} {}", "x".repeat(20_000)).as_bytes());
    let r: Value = c
        .post(format!("{}{PROJECT}/capsules/upload-url", server.base))
        .header("X-Project-Secret", &secret)
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
    let id = r["capsule_id"].as_u64().unwrap_or_else(|| panic!("{r}"));
    let put = c
        .put(r["upload_url"].as_str().unwrap())
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let confirm = c
        .post(format!("{}{PROJECT}/capsules/{id}/confirm", server.base))
        .header("X-Project-Secret", &secret)
        .json(&json!({"checksum_sha256": hex::encode(sha2::Sha256::digest(&bytes))}))
        .send()
        .await
        .unwrap();
    assert_eq!(confirm.status(), 200);
    (id, bytes)
}

/// A package of capsule `cap` for the devices labelled `fleet: k`, activated.
async fn deploy(server: &Server, cap: u64, rollout: Option<Value>) -> u64 {
    let mut body = json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
                          "target_devices": [{"labels": {"fleet": "k"}}]});
    if let Some(r) = rollout {
        body["rollout"] = r;
    }
    let (s, d) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments"),
            Some(body),
        )
        .await;
    assert_eq!(s, 201, "{d}");
    let dep = d["id"].as_u64().unwrap();
    let (s, r) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments/{dep}/activate"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    dep
}

/// An enrolled agent of the fleet whose install hook is `hook`.
async fn fleet_agent(server: &Server, token: &str, hook: &str) -> Agent {
    let agent = Agent::new(
        server,
        token,
        &format!(
            "[heartbeat]\ninterval_seconds = 1\n[update]\npoll_seconds = 1\ninstall_hook = {}\n",
            toml_string(hook)
        ),
    );
    let out = agent.command(&["enroll"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    agent
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The states `device` reported for its newest package, oldest first.
async fn reports(server: &Server, device: u64) -> Vec<String> {
    let h = server.get(&format!("{DEV}/devices/{device}/history")).await;
    h["items"][0]["reports"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|x| x["state"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `device` reported one of `ends`: all it reported.
async fn until_reported(server: &Server, device: u64, ends: &[&str], secs: u64) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = reports(server, device).await;
        if r.iter().any(|s| ends.contains(&s.as_str())) {
            return r;
        }
        assert!(
            Instant::now() < until,
            "device {device} reported only {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_agent_installs_its_package_and_reports_each_stage_once() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(
        &server,
        &token,
        "cp \"$FLEETOPS_CAPSULE_PATH\" installed.bin && echo \"$FLEETOPS_CAPSULE_VERSION\" > version",
    )
    .await;
    let (cap, bytes) = publish(&server, "1.0.0").await;
    deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "succeeded"]);
    assert_eq!(
        std::fs::read(agent.dir.path().join("installed.bin")).unwrap(),
        bytes
    );
    assert_eq!(
        std::fs::read_to_string(agent.dir.path().join("version"))
            .unwrap()
            .trim(),
        "1.0.0"
    );
    // Finished: polls are 304s from now on, and nothing more is reported.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await, r);
}

#[tokio::test]
async fn an_agent_killed_mid_install_resumes_and_reports_each_stage_once() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(
        &server,
        &token,
        "echo run >> runs; sleep 3; cp \"$FLEETOPS_CAPSULE_PATH\" installed.bin",
    )
    .await;
    let (cap, bytes) = publish(&server, "1.0.0").await;
    deploy(&server, cap, None).await;
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let first = agent.spawn_group(&["daemon"]);
    let r = until_reported(&server, device, &["installing"], 30).await;
    assert_eq!(r, ["downloading", "installing"]);
    let runs = agent.dir.path().join("runs");
    let started = std::time::Instant::now();
    while !runs.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the hook never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // kill -9 of the agent and its hook, mid-install: nothing of the first run goes on.
    drop(first);
    assert!(!agent.dir.path().join("installed.bin").exists());
    let _second = agent.spawn(&["daemon"]);
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "succeeded"]);
    assert_eq!(
        std::fs::read(agent.dir.path().join("installed.bin")).unwrap(),
        bytes
    );
    // The second daemon ran the hook again, once.
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), "run\nrun\n");
}

#[tokio::test]
async fn a_capsule_that_does_not_match_its_package_is_reported_failed() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(&server, &token, "touch installed").await;
    let (cap, bytes) = publish(&server, "1.0.0").await;
    // The stored bytes change behind the service's back (a bad disk, a tampered store).
    let blob = find_file(&server.dir.path().join("data"), &bytes).expect("the capsule's blob");
    let mut bad = bytes.clone();
    bad[600] ^= 0xff;
    std::fs::write(&blob, &bad).unwrap();
    deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "failed"]);
    let h = server.get(&format!("{DEV}/devices/{device}/history")).await;
    let msg = h["items"][0]["reports"][1]["message"]
        .as_str()
        .unwrap_or("");
    assert!(msg.contains("does not match"), "{h}");
    assert!(!agent.dir.path().join("installed").exists());
}

/// The file under `dir` whose bytes are `bytes`.
fn find_file(dir: &std::path::Path, bytes: &[u8]) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, bytes) {
                return Some(f);
            }
        } else if std::fs::metadata(&p).is_ok_and(|m| m.len() == bytes.len() as u64)
            && std::fs::read(&p).is_ok_and(|b| b == bytes)
        {
            return Some(p);
        }
    }
    None
}

#[tokio::test]
async fn a_three_phase_rollout_is_followed_to_its_end_by_ten_agents() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let mut fleet = Vec::new();
    for _ in 0..10 {
        let a = fleet_agent(
            &server,
            &token,
            "cp \"$FLEETOPS_CAPSULE_PATH\" installed.bin",
        )
        .await;
        let d = a.spawn(&["daemon"]);
        fleet.push((a, d));
    }
    let (cap, _) = publish(&server, "2.0.0").await;
    let dep = deploy(
        &server,
        cap,
        Some(json!({"phases": [
            {"name": "canary", "devices": {"count": 2}, "min_wait_seconds": 1},
            {"name": "half", "devices": {"percent": 50}, "min_wait_seconds": 1},
            {"name": "rest", "devices": {"percent": 100}}
        ]})),
    )
    .await;
    let until = Instant::now() + Duration::from_secs(90);
    let r = loop {
        let r = server
            .get(&format!("{PROJECT}/deployments/{dep}/rollout"))
            .await;
        if r["state"] == "completed" {
            break r;
        }
        assert!(Instant::now() < until, "the rollout did not complete: {r}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let phases: Vec<&str> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["canary", "half", "rest", "rest"], "{r}");
    // Every robot ends on the package, each stage reported once.
    for (a, _) in &fleet {
        let device = a.identity()["device_id"].as_u64().unwrap();
        let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
        assert_eq!(r, ["downloading", "installing", "succeeded"]);
    }
}

#[tokio::test]
async fn an_interrupted_download_is_resumed_from_its_last_byte() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(
        &server,
        &token,
        "cp \"$FLEETOPS_CAPSULE_PATH\" installed.bin && cp \"$FLEETOPS_CONFIG_PATH\" config.json",
    )
    .await;
    let (cap, bytes) = publish(&server, "1.0.0").await;
    let dep = deploy(&server, cap, None).await;
    // As a power cut leaves it: half the capsule downloaded, the report of it made.
    let updates = agent.state().join("updates");
    std::fs::create_dir_all(&updates).unwrap();
    let half = bytes.len() / 2;
    std::fs::write(updates.join(format!("{dep}.part")), &bytes[..half]).unwrap();
    std::fs::write(
        agent.state().join("update.json"),
        serde_json::to_vec(&json!({"deployment_id": dep, "etag": null,
            "stage": "downloading", "reported": ["downloading"]}))
        .unwrap(),
    )
    .unwrap();
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    // `downloading` was reported before the cut, and is not again.
    assert_eq!(r, ["installing", "succeeded"]);
    // The rest was asked for from the last byte: the capsule was served in part (206).
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("fleetops_http_requests_total{")
                && l.contains("status=\"206\"")
                && !l.ends_with(" 0")),
        "no 206 was served: {metrics}"
    );
    assert_eq!(
        std::fs::read(agent.dir.path().join("installed.bin")).unwrap(),
        bytes
    );
    // The package has no configuration: its effective one is empty.
    let config: Value =
        serde_json::from_slice(&std::fs::read(agent.dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config, json!({}));
}

mod packages;
mod rollbacks;
