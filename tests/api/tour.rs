//! `docs/tour.md`, run: its `sh` blocks, in order, in one shell against a real server (the
//! blocks a reader only looks at are `console`), then its live-tail step through a WebSocket
//! client, so the tour cannot drift from what the server does.

use futures::StreamExt;

use crate::common::*;

/// The `sh` blocks of the tour, in order.
fn sh_blocks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut block: Option<String> = None;
    for line in md.lines() {
        match (&mut block, line.trim_end()) {
            (None, "```sh") => block = Some(String::new()),
            (Some(b), "```") => {
                out.push(std::mem::take(b));
                block = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    out
}

each_backend!(the_tour_runs_as_written);
async fn the_tour_runs_as_written() {
    let md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/tour.md")).unwrap();
    let blocks = sh_blocks(&md);
    assert!(
        blocks.len() >= 8,
        "the tour's steps were not found: {}",
        blocks.len()
    );
    let s = start().await;
    let work = tempfile::tempdir().unwrap();
    // One shell for the whole tour, as a reader's terminal; the last line hands the session
    // to the live-tail check below.
    let script = format!(
        "set -euo pipefail\n{}\necho \"TOUR_SESSION=$SID\"\n",
        blocks.join("\n")
    );
    let out = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(work.path())
        .env("FLEETOPS", &s.base)
        .env("KEY", s.key())
        .env("SECRET", &s.admin.project_secret)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the tour failed:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    // What the reader is told to expect.
    assert!(stdout.contains("\"online\""), "{stdout}");
    assert!(stdout.contains("left motor overheat"), "{stdout}");
    assert!(stdout.contains("\"passed\""), "{stdout}");
    assert!(stdout.contains("\"succeeded\": 1"), "{stdout}");
    assert!(stdout.contains("running hot"), "{stdout}");
    let sid: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TOUR_SESSION="))
        .and_then(|v| v.parse().ok())
        .unwrap();

    // The live tail the tour shows, through a WebSocket client: the replay of the two
    // warnings, then the end of the (completed) session.
    let url = format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs?token={}&replay=10&level=warn,error",
        s.base.replace("http://", "ws://"),
        s.key()
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut frames = Vec::new();
    while let Some(Ok(m)) = ws.next().await {
        if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
            frames.push(serde_json::from_str::<serde_json::Value>(&t).unwrap());
        }
    }
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["type"].as_str()).collect();
    assert_eq!(kinds, ["log", "log", "session_ended"], "{frames:?}");
    assert_eq!(frames[0]["level"], "WARN");
    assert_eq!(frames[1]["message"], "left motor overheat, slowing down");
}
