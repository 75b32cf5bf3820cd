//! Child processes a test starts and must not leave behind, and the ports they listen on.

use std::process::Child;
use std::time::{Duration, Instant};

/// A child process killed and reaped when dropped, whatever the test did.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port free on loopback now (the OS's pick; another process may take it before use).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (blocking, up to 20 s) until something accepts connections on `port`; panics
/// naming `what` otherwise.
pub fn wait_for_port(port: u16, what: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on port {port}");
}

/// What a `fleetops serve` printed before it listened, read with a deadline.
pub struct Started {
    /// Its lines before `fleetops: listening on …` (the first credentials, on a first start).
    pub printed: Vec<String>,
    /// The address it listens on; `None` when it exited, or said nothing of it in time.
    pub listening_on: Option<String>,
}

/// Reads `stdout` of a starting server until it says where it listens, it closes, or
/// `within` passes. What it prints afterwards is read and dropped, so it never blocks on a
/// full pipe.
pub fn until_listening(stdout: std::process::ChildStdout, within: Duration) -> Started {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut sending = true;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sending && tx.send(line).is_err() {
                sending = false;
            }
        }
    });
    let deadline = Instant::now() + within;
    let mut printed = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let line = line.trim_end().to_string();
                if let Some(addr) = line.strip_prefix("fleetops: listening on ") {
                    return Started {
                        printed,
                        listening_on: Some(addr.to_string()),
                    };
                }
                printed.push(line);
            }
            Err(_) => {
                return Started {
                    printed,
                    listening_on: None,
                };
            }
        }
    }
}

/// The value after `label` on the first of `lines` that starts with it (`API key:`).
pub fn printed_value(lines: &[String], label: &str) -> Option<String> {
    lines.iter().find_map(|l| {
        l.trim_start()
            .strip_prefix(label)
            .map(|v| v.trim().to_string())
    })
}

/// A child leading a process group of its own, the whole group killed (SIGKILL) and the
/// child reaped when dropped: what a power cut, or systemd stopping a unit's cgroup, does to
/// the child and everything it started.
pub struct GroupGuard(pub Child);

impl GroupGuard {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut std::process::Command) -> GroupGuard {
        use std::os::unix::process::CommandExt;
        GroupGuard(cmd.process_group(0).spawn().unwrap())
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
