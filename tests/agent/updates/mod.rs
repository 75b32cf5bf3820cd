//! The update loop: a package installed through the install hook with each stage reported
//! once, across a kill -9 mid-install too; a capsule that does not match its package
//! reported failed; and a three-phase rollout followed by ten agents to its end.

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

#[tokio::test]
async fn a_failed_install_runs_the_rollback_hook_and_reports_the_hooks_words() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = Agent::new(
        &server,
        &token,
        "[heartbeat]\ninterval_seconds = 1\n[update]\npoll_seconds = 1\n\
         install_hook = \"echo 'disk full on /opt'; exit 3\"\n\
         rollback_hook = \"touch rolled-back\"\n",
    );
    assert!(agent.command(&["enroll"]).status().unwrap().success());
    let (cap, _) = publish(&server, "1.0.0").await;
    deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["rolled_back", "rollback_failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "failed", "rolled_back"]);
    let h = server.get(&format!("{DEV}/devices/{device}/history")).await;
    let msg = h["items"][0]["reports"][2]["message"]
        .as_str()
        .unwrap_or("");
    assert!(
        msg.contains("status 3") && msg.contains("disk full on /opt"),
        "{h}"
    );
    assert!(agent.dir.path().join("rolled-back").exists());
}

/// An agent of the fleet, enrolled, whose install hook fails and whose rollback hook is
/// `rollback`.
async fn failing_agent(server: &Server, rollback: &str) -> (Agent, u64) {
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = Agent::new(
        server,
        &token,
        &format!(
            "[heartbeat]\ninterval_seconds = 1\n[update]\npoll_seconds = 1\n\
             install_hook = \"echo 'disk full on /opt'; exit 3\"\nrollback_hook = {}\n",
            toml_string(rollback)
        ),
    );
    assert!(agent.command(&["enroll"]).status().unwrap().success());
    let device = agent.identity()["device_id"].as_u64().unwrap();
    (agent, device)
}

#[tokio::test]
async fn a_failing_rollback_hook_is_reported_rollback_failed_with_the_end_of_its_output() {
    let server = Server::start();
    let (agent, device) = failing_agent(
        &server,
        "seq 1 3000; echo 'no previous version kept' >&2; exit 4",
    )
    .await;
    let (cap, _) = publish(&server, "1.0.0").await;
    deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let r = until_reported(&server, device, &["rolled_back", "rollback_failed"], 30).await;
    assert_eq!(
        r,
        ["downloading", "installing", "failed", "rollback_failed"]
    );
    let h = server.get(&format!("{DEV}/devices/{device}/history")).await;
    let rs = &h["items"][0]["reports"];
    assert!(
        rs[2]["message"]
            .as_str()
            .unwrap_or("")
            .contains("disk full on /opt"),
        "{h}"
    );
    let msg = rs[3]["message"].as_str().unwrap_or("");
    assert!(
        msg.ends_with("no previous version kept") && msg.contains("3000"),
        "{h}"
    );
    assert!(msg.chars().count() <= 2000, "{} chars", msg.chars().count());
    // Nothing more is reported once both were.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await.len(), 4);
}

#[tokio::test]
async fn an_agent_killed_mid_rollback_rolls_back_again_and_reports_each_stage_once() {
    let server = Server::start();
    let (agent, device) = failing_agent(&server, "echo x >> rollbacks; sleep 3").await;
    let (cap, _) = publish(&server, "1.0.0").await;
    deploy(&server, cap, None).await;
    let first = agent.spawn(&["daemon"]);
    let marks = agent.dir.path().join("rollbacks");
    let until = Instant::now() + Duration::from_secs(30);
    while !marks.exists() {
        assert!(Instant::now() < until, "the rollback hook never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first); // kill -9, mid-rollback
    assert_eq!(
        reports(&server, device).await,
        ["downloading", "installing"]
    );
    let _second = agent.spawn(&["daemon"]);
    let r = until_reported(&server, device, &["rolled_back", "rollback_failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "failed", "rolled_back"]);
    assert_eq!(std::fs::read_to_string(&marks).unwrap(), "x\nx\n");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await.len(), 4);
}

#[tokio::test]
async fn the_hooks_output_and_each_stage_go_to_the_daemons_session_as_the_agents_lines() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(
        &server,
        &token,
        "echo \"unpacking $FLEETOPS_CAPSULE_VERSION\"; echo 'restarting nav' >&2",
    )
    .await;
    let (cap, _) = publish(&server, "1.0.0").await;
    let dep = deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    until_reported(&server, device, &["succeeded", "failed"], 30).await;
    let done = format!("update {dep} (nav 1.0.0): succeeded");
    let until = Instant::now() + Duration::from_secs(20);
    let (session, entries) = loop {
        let list = server.get(&format!("{DEV}/sessions")).await;
        if let Some(id) = list["items"][0]["id"].as_u64() {
            let logs = server
                .get(&format!("{DEV}/sessions/{id}/logs?limit=10000"))
                .await;
            let entries: Vec<(String, String, String)> = logs["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    let f = |k: &str| e[k].as_str().unwrap_or("").to_string();
                    (f("module"), f("level"), f("message"))
                })
                .collect();
            if entries.iter().any(|e| e.2 == done) {
                break (id, entries);
            }
        }
        assert!(Instant::now() < until, "no line saying {done:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let s = server.get(&format!("{DEV}/sessions/{session}")).await;
    assert_eq!(s["tags"], json!(["agent"]));
    assert!(
        entries.iter().all(|e| e.0 == "fleetops-agent"),
        "{entries:?}"
    );
    let said: Vec<&str> = entries.iter().map(|e| e.2.as_str()).collect();
    assert_eq!(
        said,
        [
            &format!("update {dep} (nav 1.0.0): downloading"),
            &format!("update {dep} (nav 1.0.0): installing"),
            "unpacking 1.0.0",
            "restarting nav",
            &format!("update {dep} (nav 1.0.0): the install hook ended with status 0"),
            &done,
        ]
    );
    assert!(entries.iter().all(|e| e.1 == "INFO"), "{entries:?}");
    // The capsule is removed once its hook has run.
    let left: Vec<_> = std::fs::read_dir(agent.state().join("updates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn a_failed_package_a_member_retries_is_installed_again() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(
        &server,
        &token,
        "test -e fixed || { echo 'no room on /opt'; exit 3; }; cp \"$FLEETOPS_CAPSULE_PATH\" installed.bin",
    )
    .await;
    let (cap, bytes) = publish(&server, "1.0.0").await;
    let dep = deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "failed"]);
    // Failed, and not installed again by itself.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await, r);
    // The robot's problem is fixed, and a member retries the package.
    std::fs::write(agent.dir.path().join("fixed"), "").unwrap();
    let (s, b) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments/{dep}/rollout/devices/{device}/retry"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let r = until_reported(&server, device, &["succeeded"], 30).await;
    assert_eq!(
        r,
        [
            "downloading",
            "installing",
            "failed",
            "retrying",
            "downloading",
            "installing",
            "succeeded"
        ]
    );
    assert_eq!(
        std::fs::read(agent.dir.path().join("installed.bin")).unwrap(),
        bytes
    );
    // Succeeded: not installed again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await.len(), 7);
}

/// A configuration too large to come inline is downloaded from its link, checked against the
/// size and SHA-256 its package names, and written for the hook: the effective data, whole.
#[tokio::test]
async fn a_configuration_too_large_to_inline_is_downloaded_checked_and_written() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(&server, &token, "cp \"$FLEETOPS_CONFIG_PATH\" config.json").await;
    let (cap, _) = publish(&server, "1.0.0").await;
    // 100 KiB of settings: over the 64 KiB sent inline.
    let settings: serde_json::Map<String, Value> = (0..2000)
        .map(|i| (format!("key{i:04}"), json!("v".repeat(40))))
        .collect();
    let want = Value::Object(settings);
    let file = serde_json::to_vec(&want).unwrap();
    assert!(file.len() > 64 * 1024);
    let c = reqwest::Client::new();
    let secret = server.printed("project secret:");
    let r: Value = c
        .post(format!(
            "{}{PROJECT}/configurations/upload-url",
            server.base
        ))
        .header("X-Project-Secret", &secret)
        .json(
            &json!({"name": "nav-config", "capsule_id": cap, "version": "1.0.0",
            "environment": "prod", "compatible_capsule_versions": "^1.0.0",
            "file_format": ".json", "file_size_bytes": file.len()}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let conf = r["config_id"].as_u64().unwrap_or_else(|| panic!("{r}"));
    let put = c
        .put(r["upload_url"].as_str().unwrap())
        .body(file.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let confirm = c
        .post(format!(
            "{}{PROJECT}/configurations/{conf}/confirm",
            server.base
        ))
        .header("X-Project-Secret", &secret)
        .json(&json!({"checksum_sha256": hex::encode(sha2::Sha256::digest(&file))}))
        .send()
        .await
        .unwrap();
    assert_eq!(confirm.status(), 200);
    let (s, d) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments"),
            Some(
                json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
                "configuration_id": conf, "target_devices": [{"labels": {"fleet": "k"}}]}),
            ),
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
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "succeeded"]);
    let written: Value =
        serde_json::from_slice(&std::fs::read(agent.dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(written, want);
}
