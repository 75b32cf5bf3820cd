//! The install and rollback hooks: their environment, their runs (output kept bounded), and
//! the update's log lines sent to the service.

use super::*;

pub(super) fn hook_env(
    cfg: &Config,
    pkg: &serde_json::Value,
    capsule: &Path,
) -> Vec<(String, String)> {
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    vec![
        (
            "FLEETOPS_CAPSULE_PATH".into(),
            capsule.display().to_string(),
        ),
        (
            "FLEETOPS_CONFIG_PATH".into(),
            config_path(cfg).display().to_string(),
        ),
        ("FLEETOPS_DEPLOYMENT_ID".into(), s(&pkg["deployment_id"])),
        ("FLEETOPS_DEPLOYMENT_NAME".into(), s(&pkg["name"])),
        (
            "FLEETOPS_COMPOSITION_TAG".into(),
            s(&pkg["composition_tag"]),
        ),
        ("FLEETOPS_CAPSULE_NAME".into(), s(&pkg["capsule"]["name"])),
        (
            "FLEETOPS_CAPSULE_VERSION".into(),
            s(&pkg["capsule"]["version"]),
        ),
    ]
}

/// At most this much of a hook's output is kept (its end), ...
pub(super) const HOOK_KEPT_BYTES: usize = 64 << 10;
/// ... and at most this many of its last lines go to the daemon's session.
pub(super) const HOOK_KEPT_LINES: usize = 1000;

/// Runs `cmd` with `sh -c`, its stderr and stdout one stream: its exit code (`None`: a
/// signal) and the end of its output (at most 64 KiB).
pub(super) async fn hook(cmd: &str, env: &[(String, String)]) -> (Option<i32>, String) {
    use tokio::io::AsyncReadExt;
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("exec 2>&1\n{cmd}"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return (Some(127), format!("cannot run the hook: {e}")),
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut cut = false;
    if let Some(mut out) = child.stdout.take() {
        let mut buf = vec![0u8; 16 << 10];
        while let Ok(n) = out.read(&mut buf).await {
            if n == 0 {
                break;
            }
            kept.extend_from_slice(&buf[..n]);
            if kept.len() > HOOK_KEPT_BYTES {
                kept.drain(..kept.len() - HOOK_KEPT_BYTES);
                cut = true;
            }
        }
    }
    let code = match child.wait().await {
        Ok(s) => s.code(),
        Err(e) => return (Some(127), format!("waiting for the hook: {e}")),
    };
    let text = String::from_utf8_lossy(&kept).into_owned();
    // Cut, the first line kept is only the end of one.
    let text = match text.split_once('\n') {
        Some((_, rest)) if cut => rest.to_string(),
        _ => text,
    };
    (code, text)
}

/// The last `n` characters of `text`, trimmed.
pub(super) fn last_chars(text: &str, n: usize) -> String {
    let t = text.trim();
    let skip = t.chars().count().saturating_sub(n);
    t.chars().skip(skip).collect()
}

/// Where the daemon keeps its own record of updates: lines of module `fleetops-agent` in its
/// session (tagged `agent`), through the same spool as its followed logs. Every stage is
/// also one line on stderr.
#[derive(Clone, Default)]
pub struct Log {
    /// Into the daemon's session; `None`: stderr only.
    tx: Option<tokio::sync::mpsc::Sender<Entry>>,
    /// A line longer than this is cut (`[logs] max_line_bytes`).
    max_line: usize,
}

impl Log {
    pub fn new(tx: Option<tokio::sync::mpsc::Sender<Entry>>, max_line: usize) -> Self {
        Self { tx, max_line }
    }

    pub(super) async fn line(&self, level: &'static str, message: String) {
        if let Some(tx) = &self.tx {
            let mut e = lines::entry(message.as_bytes(), "fleetops-agent", level, self.max_line);
            e.level = level;
            let _ = tx.send(e).await;
        }
    }

    /// One line on stderr, and in the session, for a stage of update `st`.
    pub(super) async fn stage(&self, st: &State, stage: &str) {
        let line = format!("update {}: {stage}", st.title());
        eprintln!("fleetops-agent: {line}");
        let level = match stage {
            "failed" | "rollback_failed" => "error",
            _ => "info",
        };
        self.line(level, line).await;
    }

    /// A hook's last lines of output (`info`, or `warn` when the hook failed), then how it
    /// ended (`info` or `error`).
    pub(super) async fn hook(&self, st: &State, which: &str, code: Option<i32>, output: &str) {
        let ok = code == Some(0) || (which == "install" && code == Some(100));
        let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
        let from = lines.len().saturating_sub(HOOK_KEPT_LINES);
        for l in &lines[from..] {
            let level = if ok { "info" } else { "warn" };
            self.line(level, (*l).to_string()).await;
        }
        let level = if ok { "info" } else { "error" };
        let end = format!(
            "update {}: the {which} hook ended with {}",
            st.title(),
            describe(code)
        );
        self.line(level, end).await;
    }
}
