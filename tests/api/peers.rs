//! Real peers on loopback for the alerting tests: an HTTP sink that records every request and
//! answers from a script (a status with headers, or a hang), and an SMTP server (aiosmtpd,
//! installed by `.ci/run`) that reports every message it receives.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When it arrived (for backoff checks).
    pub at: std::time::Instant,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16, Vec<(&'static str, String)>),
    /// Accept the request and never answer.
    Hang,
}

#[derive(Clone)]
pub struct Sink {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
}

impl Sink {
    pub async fn start() -> Sink {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sink = Sink {
            addr: l.local_addr().unwrap(),
            requests: Arc::default(),
            script: Arc::default(),
        };
        let s = sink.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = l.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = s.serve(conn).await;
                });
            }
        });
        sink
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next answers, in order; once used up every request gets 200.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.script.lock().unwrap().extend(replies);
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    /// Waits until at least `n` requests came (10 s at most).
    pub async fn wait_for(&self, n: usize) -> Vec<Recorded> {
        for _ in 0..400 {
            if self.count() >= n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let r = self.requests.lock().unwrap().clone();
        assert!(r.len() >= n, "the sink got {} requests, not {n}", r.len());
        r
    }

    async fn serve(&self, conn: tokio::net::TcpStream) -> std::io::Result<()> {
        let (rd, mut wr) = conn.into_split();
        let mut rd = BufReader::new(rd);
        loop {
            let mut line = String::new();
            if rd.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let mut parts = line.split_whitespace();
            let (method, path) = (
                parts.next().unwrap_or_default().to_string(),
                parts.next().unwrap_or_default().to_string(),
            );
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                rd.read_line(&mut h).await?;
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
            let len = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            rd.read_exact(&mut body).await?;
            self.requests.lock().unwrap().push(Recorded {
                method,
                path,
                headers,
                body,
                at: std::time::Instant::now(),
            });
            let reply = self.script.lock().unwrap().pop_front();
            match reply.unwrap_or(Reply::Status(200, vec![])) {
                Reply::Hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    return Ok(());
                }
                Reply::Status(code, extra) => {
                    let mut head = format!("HTTP/1.1 {code} X\r\ncontent-length: 2\r\n");
                    for (k, v) in extra {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n{}");
                    wr.write_all(head.as_bytes()).await?;
                }
            }
        }
    }
}

/// aiosmtpd on a free port; dropped, it stops.
pub struct Smtp {
    pub port: u16,
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Smtp {
    pub async fn start() -> Smtp {
        let script = format!("{}/tests/peers/smtp_sink.py", env!("CARGO_MANIFEST_DIR"));
        let mut child = tokio::process::Command::new(fleetops_testkit::python::python())
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 with aiosmtpd is needed: pip install aiosmtpd");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("aiosmtpd did not start (pip install aiosmtpd)")
            .unwrap()
            .unwrap_or_default();
        let port = first
            .strip_prefix("READY ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("aiosmtpd said {first:?} (pip install aiosmtpd)"));
        Smtp { port, child, lines }
    }

    /// The next message received (10 s at most).
    pub async fn next(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("no e-mail arrived")
            .unwrap()
            .unwrap();
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Verifies a Standard Webhooks signature with the reference Python library.
pub fn verify_standard_webhook(secret: &str, r: &Recorded) {
    let headers: serde_json::Map<String, serde_json::Value> = r
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let input = serde_json::json!({
        "headers": headers,
        "body": String::from_utf8(r.body.clone()).unwrap(),
    });
    let mut child = std::process::Command::new(fleetops_testkit::python::python())
        .arg(format!(
            "{}/tests/peers/verify_standard_webhook.py",
            env!("CARGO_MANIFEST_DIR")
        ))
        .arg(secret)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with standardwebhooks is needed: pip install standardwebhooks");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "standardwebhooks refused the signature: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
