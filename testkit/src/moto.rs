//! moto, the S3-compatible server the tests and benches store blobs in
//! (`moto[server]` of `tests/requirements.txt`): one shared by the whole test process, or one
//! owned by a test that stops it.

use std::process::{Command, Stdio};

use crate::process::{Guard, free_port, wait_for_port};
use crate::python::python;

/// A moto server owned by its holder: killed and reaped when dropped.
pub struct Moto {
    child: Guard,
    pub endpoint: String,
}

impl Moto {
    /// Starts one on a free port and waits until it listens.
    pub fn start() -> Moto {
        let port = free_port();
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python with moto[server] is needed (scripts/test installs it)");
        let m = Moto {
            child: Guard(child),
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        wait_for_port(port, "moto");
        m
    }

    /// Kills it now (a test of an outage of the object store).
    pub fn stop(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
    }
}

/// The endpoint of the moto server shared by this test process, started on first use. It
/// stops when the process does, however it ends: a shell beside it watches the process.
pub fn shared() -> &'static str {
    static ENDPOINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ENDPOINT.get_or_init(|| {
        let port = free_port();
        let me = std::process::id();
        let py = python();
        let mut watcher = Command::new("sh")
            .args([
                "-c",
                &format!(
                    "\"$0\" -m moto.server -H 127.0.0.1 -p {port} >/dev/null 2>&1 & m=$!; \
                     while kill -0 {me} 2>/dev/null; do sleep 1; done; kill $m"
                ),
            ])
            .arg(&py)
            .spawn()
            .expect("sh");
        // Reaped whenever it ends (with this process, at the latest).
        std::thread::spawn(move || watcher.wait());
        wait_for_port(port, "moto (scripts/test installs moto[server])");
        format!("http://127.0.0.1:{port}")
    })
}

/// `PUT /{bucket}` on the server at `endpoint`, over a plain socket (blocking: a test's
/// configuration is often built outside any runtime).
pub fn create_bucket(endpoint: &str, bucket: &str) {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "creating bucket {bucket}: {answer}"
    );
}
