//! The two binaries' own command lines: their versions, and a log without colours when it
//! does not go to a terminal.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::harness::{AGENT, Guard, SERVER};

#[test]
fn both_binaries_say_their_version() {
    let want = env!("CARGO_PKG_VERSION");
    for (bin, name) in [(SERVER, "fleetops"), (AGENT, "fleetops-agent")] {
        let out = Command::new(bin).arg("--version").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name} {want}\n")
        );
    }
    // Also with a configuration named first, and not when it is the wrapped command's.
    let out = Command::new(AGENT)
        .args(["--config", "/nonexistent.toml", "--version"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("fleetops-agent {want}\n")
    );
    let out = Command::new(AGENT)
        .args([
            "--config",
            "/nonexistent.toml",
            "run",
            "--",
            "prog",
            "--version",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}

#[test]
fn the_servers_log_has_no_colours_when_it_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = dir.path().join("fleetops.toml");
    std::fs::write(
        &file,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\nlog = \"info\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let log = dir.path().join("stderr");
    let mut child = Command::new(SERVER)
        .arg("--config")
        .arg(&file)
        .arg("serve")
        .env_remove("FLEETOPS_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let _g = Guard(child);
    let up = BufReader::new(out)
        .lines()
        .take(50)
        .map_while(Result::ok)
        .any(|l| l.starts_with("fleetops: listening on "));
    assert!(up, "the server did not start");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.lines().count() > 0 || std::time::Instant::now() > until {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(text.contains("INFO"), "nothing logged: {text:?}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
}
