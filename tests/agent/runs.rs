//! Sessions around a run: the command's output as logs, its recordings as files, its exit
//! status as the session's end, and every line stored once across an outage of the server.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{Agent, DEV, Server};

/// The device's only session.
async fn only_session(server: &Server) -> Value {
    let list = server.get(&format!("{DEV}/sessions")).await;
    assert_eq!(list["total"], 1, "{list}");
    let id = list["items"][0]["id"].as_u64().unwrap();
    server.get(&format!("{DEV}/sessions/{id}")).await
}

#[tokio::test]
async fn a_wrapped_commands_output_becomes_the_sessions_logs_and_its_recordings_its_files() {
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let agent = Agent::new(&server, &token, "[logs]\nflush_ms = 200\n");
    let script = "echo 'INFO starting'; echo '[ERROR] motor stalled' >&2; echo plain; \
                  printf mcapdata > run.mcap; exit 3";
    let out = agent
        .command(&["run", "--tag", "nightly", "--", "sh", "-c", script])
        .output()
        .unwrap();
    // The command's status, and its output passed through.
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("INFO starting"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("motor stalled"));
    let s = only_session(&server).await;
    assert_eq!(s["status"], "failed", "{s}");
    assert_eq!(s["tags"], json!(["nightly"]));
    let logs = server
        .get(&format!("{DEV}/sessions/{}/logs", s["id"]))
        .await;
    let mut got: Vec<(String, String, String)> = logs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["message"].as_str().unwrap().to_string(),
                e["level"].as_str().unwrap().to_string(),
                e["module"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("INFO starting".into(), "INFO".into(), "sh".into()),
            ("[ERROR] motor stalled".into(), "ERROR".into(), "sh".into()),
            ("plain".into(), "INFO".into(), "sh".into()),
        ]
    );
    let files = server
        .get(&format!("{DEV}/sessions/{}/files", s["id"]))
        .await;
    assert_eq!(files["items"][0]["path"], "run.mcap", "{files}");
    assert_eq!(files["items"][0]["size_bytes"], 8);
    // What was kept on disk for shipping is gone once shipped.
    let spool = agent.state().join("spool");
    assert_eq!(std::fs::read_dir(spool).unwrap().count(), 0);
}

#[tokio::test]
async fn a_command_that_exits_zero_completes_its_session() {
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let agent = Agent::new(&server, &token, "");
    let out = agent.command(&["run", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(only_session(&server).await["status"], "completed");
}

#[tokio::test]
async fn lines_logged_while_the_server_is_down_for_30_seconds_are_stored_exactly_once() {
    let mut server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let agent = Agent::new(
        &server,
        &token,
        "[logs]\nflush_ms = 100\nbatch_lines = 50\n",
    );
    // Enrolled first; the run then needs no server to start.
    assert!(agent.command(&["enroll"]).status().unwrap().success());
    let script = "i=1; while [ $i -le 800 ]; do echo \"line $i\"; i=$((i+1)); sleep 0.05; done";
    let mut run = agent.spawn(&["run", "--", "sh", "-c", script]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.stop();
    tokio::time::sleep(Duration::from_secs(30)).await;
    server.restart();
    let until = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = run.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < until,
            "the agent did not finish"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status.success(), "{status}");
    let s = only_session(&server).await;
    assert_eq!(s["status"], "completed", "{s}");
    let logs = server
        .get(&format!("{DEV}/sessions/{}/logs?limit=10000", s["id"]))
        .await;
    assert_eq!(logs["total"], 800, "{}", logs["total"]);
    let got: Vec<&str> = logs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (1..=800).map(|i| format!("line {i}")).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn the_daemon_ships_the_lines_appended_to_a_followed_file_across_its_rotation() {
    use std::io::Write;
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let logs = tempfile::tempdir().unwrap();
    let path = logs.path().join("nav.log");
    // What the file held before the agent first saw it is not shipped (as tail -F).
    std::fs::write(&path, "before the agent\n").unwrap();
    let agent = Agent::new(
        &server,
        &token,
        &format!(
            "[heartbeat]\ninterval_seconds = 1\n[logs]\nflush_ms = 200\nfiles = [\"{}/*.log\"]\n",
            logs.path().display()
        ),
    );
    let _daemon = agent.spawn(&["daemon"]);
    // It has seen the file once it keeps its offset (its end: what it held is not shipped).
    let offsets = agent.state().join("follow.json");
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&offsets).is_ok_and(|t| t.contains("nav.log")) {
        assert!(
            std::time::Instant::now() < until,
            "the daemon never followed the file"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let append = |p: &std::path::Path, lines: &[&str]| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p)
            .unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
    };
    append(&path, &["a1", "WARN a2"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Rotated: a last line, moved away, a new file in its place.
    append(&path, &["a3"]);
    std::fs::rename(&path, logs.path().join("nav.log.1")).unwrap();
    append(&path, &["b1", "b2"]);
    let want = ["a1", "WARN a2", "a3", "b1", "b2"];
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let got = loop {
        let list = server.get(&format!("{DEV}/sessions")).await;
        let got: Vec<String> = match list["items"][0]["id"].as_u64() {
            Some(id) => server.get(&format!("{DEV}/sessions/{id}/logs")).await["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["message"].as_str().unwrap().to_string())
                .collect(),
            None => Vec::new(),
        };
        if got.len() >= want.len() || std::time::Instant::now() > until {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(got, want);
    let s = only_session(&server).await;
    assert_eq!(s["tags"], json!(["agent"]));
    assert_eq!(s["status"], "active");
}

#[tokio::test]
async fn a_killed_runs_spooled_lines_reach_its_session_with_the_next_run() {
    let mut server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let agent = Agent::new(&server, &token, "[logs]\nflush_ms = 100\n");
    let script = "sleep 2; i=1; while [ $i -le 20 ]; do echo \"x$i\"; i=$((i+1)); done; sleep 60";
    let run = agent.spawn(&["run", "--", "sh", "-c", script]);
    // Its session exists; then the service goes away while the command prints.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while server.get(&format!("{DEV}/sessions")).await["total"] != 1 {
        assert!(std::time::Instant::now() < until, "no session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop();
    // Its 20 lines reach the spool on disk (they cannot be shipped); then kill -9.
    let spool = agent.state().join("spool");
    // A run's spool is a directory of batch files under `spool/`.
    let spooled = || {
        let runs = std::fs::read_dir(&spool).into_iter().flatten().flatten();
        runs.flat_map(|r| std::fs::read_dir(r.path()).into_iter().flatten().flatten())
            .any(|e| std::fs::read(e.path()).is_ok_and(|b| b.windows(3).any(|w| w == b"x20")))
    };
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !spooled() {
        assert!(
            std::time::Instant::now() < until,
            "the lines never reached the spool"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(run); // kill -9, its lines in the spool
    server.restart();
    let out = agent.command(&["run", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let list = server.get(&format!("{DEV}/sessions")).await;
    assert_eq!(list["total"], 2, "{list}");
    let killed = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .min_by_key(|s| s["id"].as_u64())
        .unwrap()["id"]
        .as_u64()
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let s = server.get(&format!("{DEV}/sessions/{killed}")).await;
        if s["status"] == "failed" {
            break;
        }
        assert!(std::time::Instant::now() < until, "{s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = server.messages(killed).await;
    let want: Vec<String> = (1..=20).map(|i| format!("x{i}")).collect();
    assert_eq!(got, want);
    assert_eq!(
        std::fs::read_dir(agent.state().join("spool"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test]
async fn sigterm_to_the_agent_reaches_the_command_and_the_run_still_ends_its_session() {
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let agent = Agent::new(&server, &token, "[logs]\nflush_ms = 100\n");
    let script = "trap 'echo stopping; exit 7' TERM; echo ready; sleep 30 & wait";
    let mut run = agent.spawn(&["run", "--", "sh", "-c", script]);
    // The command set its trap before it said `ready`: SIGTERM once that line is stored.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list = server.get(&format!("{DEV}/sessions")).await;
        if let Some(id) = list["items"][0]["id"].as_u64()
            && server.messages(id).await == ["ready"]
        {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the command never said ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = run.0.id().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = run.0.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < until, "the agent did not end");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(7));
    let s = only_session(&server).await;
    assert_eq!(s["status"], "failed", "{s}");
    let logs = server
        .get(&format!("{DEV}/sessions/{}/logs", s["id"]))
        .await;
    let got: Vec<&str> = logs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(got, ["ready", "stopping"]);
}

#[tokio::test]
async fn rate_limited_by_the_service_the_agent_waits_and_stores_every_line_once() {
    // 30 requests a minute for the device's token: a burst of 30, then one every 2 s.
    let server = Server::start_with_rpm(30);
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let agent = Agent::new(&server, &token, "[logs]\nflush_ms = 10\n");
    // A batch a line: 36 batches, past the burst.
    let script = "i=1; while [ $i -le 36 ]; do echo \"r$i\"; i=$((i+1)); sleep 0.05; done";
    let out = agent
        .command(&["run", "--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = only_session(&server).await;
    assert_eq!(s["status"], "completed", "{s}");
    let logs = server
        .get(&format!("{DEV}/sessions/{}/logs?limit=100", s["id"]))
        .await;
    let got: Vec<&str> = logs["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (1..=36).map(|i| format!("r{i}")).collect();
    assert_eq!(got, want);
    // The service did refuse some (429 with Retry-After), and the agent came back for them.
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("fleetops_http_requests_total{")
                && l.contains("/logs\"")
                && l.contains("status=\"429\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(refused >= 1.0, "no 429 on the logs route:\n{metrics}");
}
