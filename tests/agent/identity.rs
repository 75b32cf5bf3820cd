//! Enrollment and heartbeats.

use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use crate::harness::{Agent, DEV, Guard, Server};

#[tokio::test]
async fn an_agent_enrolls_with_a_token_and_keeps_its_device_token_readable_only_by_its_user() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "amr"}}))
        .await;
    let agent = Agent::new(&server, &token, "[labels]\nsite = \"lyon\"\n");
    let out = agent.command(&["enroll"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = agent.state().join("device.json");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(agent.state())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let id = agent.identity();
    assert!(id["device_token"].as_str().unwrap().starts_with("fopsd_"));
    let d = server
        .get(&format!("{DEV}/devices/{}", id["device_id"]))
        .await;
    assert_eq!(d["name"], "amr-1");
    assert_eq!(d["labels"], json!({"fleet": "amr", "site": "lyon"}));
    // Enrolled once: a second `enroll` keeps the identity it has.
    assert!(agent.command(&["enroll"]).status().unwrap().success());
    assert_eq!(agent.identity(), id);
    assert_eq!(server.get(&format!("{DEV}/devices")).await["total"], 1);
}

#[tokio::test]
async fn a_refused_enrollment_token_stops_the_agent_with_a_clear_error() {
    let server = Server::start();
    let agent = Agent::new(&server, "fopse_not-a-token", "");
    let out = agent.command(&["enroll"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("enrollment token was refused"), "{err}");
    assert!(!agent.state().join("device.json").exists());
}

#[tokio::test]
async fn the_daemon_sends_heartbeats_with_built_in_and_configured_metrics() {
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let dir = tempfile::tempdir().unwrap();
    let battery = dir.path().join("battery");
    std::fs::write(&battery, "87\n").unwrap();
    let agent = Agent::new(
        &server,
        &token,
        &format!(
            "[heartbeat]\ninterval_seconds = 1\n[heartbeat.files]\nbattery = \"{}\"\n[heartbeat.commands]\nanswer = \"echo 42\"\n",
            battery.display()
        ),
    );
    let _daemon = Guard(
        agent
            .command(&["daemon"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen;
    let online = loop {
        let list = server.get(&format!("{DEV}/devices")).await;
        seen = list["items"][0].clone();
        let ok = seen["status"] == "online"
            && seen["metrics"]["battery"] == 87.0
            && seen["metrics"]["answer"] == 42.0
            && ["load", "memory", "disk", "uptime"]
                .iter()
                .all(|m| seen["metrics"][m].is_number());
        if ok || std::time::Instant::now() > until {
            break ok;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(online, "{seen}");
}
