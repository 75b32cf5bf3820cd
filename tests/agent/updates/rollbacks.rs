//! A failed install: the rollback hook run and its words reported, a failing rollback
//! reported `rollback_failed`, a kill mid-rollback rolled back again, and the hooks' output
//! in the daemon's session.

use super::*;

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
