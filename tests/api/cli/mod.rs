//! The binary itself: first-start credentials, `admin bootstrap`, a locked data directory, and
//! a kill -9 right after acknowledged writes followed by a restart on the same data.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::common::DEV;

mod admin;
mod kill9;
mod serve;

const BIN: &str = env!("CARGO_BIN_EXE_fleetops");

pub(crate) struct Proc {
    pub child: Child,
    pub base: String,
    pub stdout: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `fleetops serve` on port 0 and reads stdout up to the listening line.
pub(crate) fn serve(dir: &std::path::Path, extra_env: &[(&str, &str)]) -> Proc {
    let stderr = match std::env::var_os("FLEETOPS_TEST_STDERR") {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap(),
        ),
        None => Stdio::null(),
    };
    serve_with_stderr(dir, extra_env, stderr)
}

/// As [`serve`], its standard error (the tracing log) going to `stderr`.
fn serve_with_stderr(dir: &std::path::Path, extra_env: &[(&str, &str)], stderr: Stdio) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .current_dir(dir)
        .env("FLEETOPS_LISTEN", "127.0.0.1:0")
        .env("FLEETOPS_DATA_DIR", dir.join("data"))
        .envs(crate::common::backend_env(dir))
        .env("FLEETOPS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut stdout = Vec::new();
    let mut base = String::new();
    for _ in 0..50 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let line = line.trim_end().to_string();
        if let Some(addr) = line.strip_prefix("fleetops: listening on ") {
            base = addr.to_string();
            stdout.push(line);
            break;
        }
        stdout.push(line);
    }
    assert!(!base.is_empty(), "no listening line in {stdout:?}");
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in reader.lines() {});
    Proc {
        child,
        base,
        stdout,
    }
}

pub(crate) fn field<'a>(lines: &'a [String], label: &str) -> Option<&'a str> {
    lines
        .iter()
        .find_map(|l| l.trim_start().strip_prefix(label).map(str::trim))
}

/// A JSON POST to a running binary: the status and the body (Null when not JSON).
async fn post_json(
    c: reqwest::Client,
    url: String,
    cred: String,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c
        .post(url)
        .bearer_auth(cred)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (
        status,
        r.json::<serde_json::Value>().await.unwrap_or_default(),
    )
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn admin(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("admin")
        .args(args)
        .current_dir(dir)
        .env("FLEETOPS_DATA_DIR", dir.join("data"))
        .envs(crate::common::backend_env(dir))
        .env("FLEETOPS_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A device `r1` and an active session of it, through a running binary: the device token and
/// the session id.
pub(crate) async fn device_and_session(
    c: &reqwest::Client,
    base: &str,
    key: &str,
) -> (String, u64) {
    let d: serde_json::Value = c
        .post(format!("{base}{DEV}/devices"))
        .bearer_auth(key)
        .json(&json!({"name": "r1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = d["device_token"].as_str().unwrap().to_string();
    let v: serde_json::Value = c
        .post(format!("{base}{DEV}/sessions"))
        .bearer_auth(&token)
        .json(&json!({"device_id": d["id"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (token, v["id"].as_u64().unwrap())
}
