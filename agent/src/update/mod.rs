//! The update loop of `daemon`: which package the robot should run, and installing it.
//!
//! Every `[update] poll_seconds` the agent asks `GET /api/v1/device/deployment`, naming the
//! ETag of the last package it finished, so an unchanged answer is a 304. A new package is
//! worked through these stages, each reported once:
//!
//! 1. `downloading`: the capsule is downloaded to `state_dir/updates/{id}.part`, resumed
//!    with a `Range` from where an interrupted download stopped, then its size and SHA-256
//!    are checked against the package (a mismatch is reported `failed`).
//! 2. The package's effective configuration is written to `[update] config_path` (JSON).
//! 3. `installing`: `[update] install_hook` runs. Exit 0 is `succeeded`; exit 100 is
//!    `rebooting` (the hook reboots the robot; `succeeded` is reported when the agent starts
//!    again); anything else is `failed` with the hook's last output as the message.
//! 4. After a failed install, `[update] rollback_hook` runs (before any report), then
//!    `failed` is reported, then `rolled_back` (exit 0) or `rollback_failed` with the end of
//!    the rollback hook's output.
//!
//! A failed package answered with a new ETag (a member retried it for this device) is
//! installed again from its start; a succeeded one never is.
//!
//! The stage and what was reported are kept in `state_dir/update.json` (written whole and
//! synced before each report), so an agent killed mid-update, or a robot that lost power,
//! resumes where it was on its next start: a download goes on from its last byte, an install
//! the agent did not see end runs again (install hooks must be safe to run twice), and no
//! stage is reported twice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest;
use tokio::io::AsyncWriteExt;

use crate::client::{self, CallError};
use crate::config::Config;
use crate::files::write_private;
use crate::identity::Identity;
use crate::lines::{self, Entry};

/// Where an update stands, as kept on disk.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct State {
    /// The package being installed, or the last one finished.
    pub deployment_id: Option<u64>,
    /// Its answer's ETag.
    pub etag: Option<String>,
    /// `downloading`, `installing`, `rebooting`, `succeeded` or `failed`.
    pub stage: String,
    /// Stages reported for it.
    pub reported: Vec<String>,
    /// Why it failed, until that is reported.
    #[serde(default)]
    pub message: Option<String>,
    /// After a failed install with a rollback hook: `pending` until the hook has run, then
    /// `rolled_back` or `rollback_failed` (reported after `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<String>,
    /// Why the rollback hook failed (the end of its output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_message: Option<String>,
    /// What the package installs (`nav 1.0.1`), for the agent's own lines.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub what: String,
    /// The hooks' variables while the rollback hook is `pending`, so that a rollback an
    /// agent did not see end runs again with them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

impl State {
    fn finished(&self) -> bool {
        matches!(self.stage.as_str(), "succeeded" | "failed")
    }

    /// `4 (nav 1.0.1)`.
    fn title(&self) -> String {
        let id = self
            .deployment_id
            .map_or_else(String::new, |d| d.to_string());
        if self.what.is_empty() {
            id
        } else {
            format!("{id} ({})", self.what)
        }
    }

    /// A finished package with nothing left to run or report.
    fn settled(&self) -> bool {
        self.finished()
            && self.reported.contains(&self.stage)
            && self
                .rollback
                .as_ref()
                .is_none_or(|r| r != "pending" && self.reported.contains(r))
    }
}

/// What an answer naming package `deployment_id` asks of the agent where it stands.
#[derive(Debug, PartialEq)]
enum Step {
    /// Install it from the start: a package new to the agent, or a failed one a member
    /// retried (the service answers it with a new ETag).
    Start,
    /// Go on with the package being installed.
    Resume,
    /// Nothing to install: only its ETag is kept (a succeeded package is never installed
    /// again).
    Keep,
}

fn next_step(st: &State, deployment_id: u64, etag: Option<&str>) -> Step {
    if st.deployment_id != Some(deployment_id) {
        return Step::Start;
    }
    if !st.finished() {
        return Step::Resume;
    }
    if st.stage == "failed" && etag.is_some() && etag != st.etag.as_deref() {
        return Step::Start;
    }
    Step::Keep
}

fn state_file(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("update.json")
}

fn load(cfg: &Config) -> State {
    std::fs::read(state_file(cfg))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save(cfg: &Config, s: &State) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(s).map_err(|e| e.to_string())?;
    write_private(&state_file(cfg), &bytes).map_err(|e| format!("update.json: {e}"))
}

/// Polls and installs for as long as the daemon runs.
pub async fn run_forever(cfg: Config, http: reqwest::Client, id: Identity, log: Log) {
    let mut tick = tokio::time::interval(Duration::from_secs(cfg.update.poll_seconds.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = poll_once(&cfg, &http, &id, &log).await {
            eprintln!("fleetops-agent: update: {e}");
        }
    }
}

/// One look at which package to run, and the work it asks for.
pub async fn poll_once(
    cfg: &Config,
    http: &reqwest::Client,
    id: &Identity,
    log: &Log,
) -> Result<(), String> {
    let mut st = load(cfg);
    if st.finished() && !st.settled() {
        // Finished while the service was out of reach, or just before a restart.
        return settle(cfg, http, id, log, &mut st).await;
    }
    if st.stage == "rebooting" {
        // The install asked for a reboot and the agent has started again.
        finish(cfg, http, id, log, &mut st, "succeeded", None).await?;
        return Ok(());
    }
    let url = format!("{}/api/v1/device/deployment", id.server);
    let etag = st.etag.clone().filter(|_| st.finished());
    let r = client::call(
        || {
            let mut r = http.get(&url).bearer_auth(&id.device_token);
            if let Some(e) = &etag {
                r = r.header("If-None-Match", e);
            }
            Ok(r)
        },
        Some(3),
    )
    .await
    .map_err(|e| e.to_string())?;
    if r.status() == reqwest::StatusCode::NOT_MODIFIED
        || r.status() == reqwest::StatusCode::NO_CONTENT
    {
        return Ok(());
    }
    let new_etag = r
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let pkg: serde_json::Value = r
        .json()
        .await
        .map_err(|e| format!("unreadable package: {e}"))?;
    let dep = pkg["deployment_id"]
        .as_u64()
        .ok_or("the package names no deployment_id")?;
    match next_step(&st, dep, new_etag.as_deref()) {
        Step::Keep => {
            st.etag = new_etag;
            return save(cfg, &st);
        }
        Step::Start => {
            st = State {
                deployment_id: Some(dep),
                etag: new_etag,
                stage: "downloading".into(),
                what: format!(
                    "{} {}",
                    pkg["capsule"]["name"].as_str().unwrap_or("?"),
                    pkg["capsule"]["version"].as_str().unwrap_or("?")
                ),
                ..State::default()
            };
            save(cfg, &st)?;
        }
        Step::Resume => {}
    }
    if cfg.update.install_hook.trim().is_empty() {
        return Ok(());
    }
    install(cfg, http, id, log, &mut st, &pkg).await
}

/// Reports `stage` of the current package once (`message`: why it failed).
async fn report(
    cfg: &Config,
    http: &reqwest::Client,
    id: &Identity,
    log: &Log,
    st: &mut State,
    stage: &str,
    message: Option<&str>,
) -> Result<(), String> {
    if st.reported.iter().any(|r| r == stage) {
        return Ok(());
    }
    let dep = st.deployment_id.ok_or("no package")?;
    log.stage(st, stage).await;
    let url = format!("{}/api/v1/device/deployment/{dep}/status", id.server);
    let mut body = serde_json::json!({"status": stage});
    if let Some(m) = message {
        body["message"] = serde_json::Value::String(last_chars(m, 2000));
    }
    match client::call(
        || Ok(http.post(&url).bearer_auth(&id.device_token).json(&body)),
        None,
    )
    .await
    {
        Ok(_) => {}
        // The package was deleted meanwhile: nothing to report on.
        Err(CallError::Status(s, _)) if s == reqwest::StatusCode::NOT_FOUND => {}
        // Refused for good (a service that does not take this stage): said, and not sent
        // again, so that it never holds up the next package.
        Err(CallError::Status(s, why))
            if s.is_client_error()
                && s != reqwest::StatusCode::UNAUTHORIZED
                && s != reqwest::StatusCode::FORBIDDEN =>
        {
            eprintln!("fleetops-agent: update {dep}: the service refused {stage} ({s}): {why}");
        }
        Err(e) => return Err(format!("reporting {stage}: {e}")),
    }
    st.reported.push(stage.to_string());
    save(cfg, st)
}

/// Records the end of the current package and reports it.
async fn finish(
    cfg: &Config,
    http: &reqwest::Client,
    id: &Identity,
    log: &Log,
    st: &mut State,
    stage: &str,
    message: Option<&str>,
) -> Result<(), String> {
    st.stage = stage.to_string();
    st.message = message.map(str::to_string);
    save(cfg, st)?;
    remove_capsule(cfg, st);
    report(cfg, http, id, log, st, stage, message).await
}

async fn install(
    cfg: &Config,
    http: &reqwest::Client,
    id: &Identity,
    log: &Log,
    st: &mut State,
    pkg: &serde_json::Value,
) -> Result<(), String> {
    let dep = st.deployment_id.ok_or("no package")?;
    let dir = cfg.state_dir.join("updates");
    crate::files::private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let capsule = dir.join(format!("{dep}.capsule"));
    if st.stage == "downloading" {
        report(cfg, http, id, log, st, "downloading", None).await?;
        let c = &pkg["capsule"];
        let (Some(url), Some(sha), Some(size)) = (
            c["download_url"].as_str(),
            c["sha256"].as_str(),
            c["size_bytes"].as_u64(),
        ) else {
            return finish(
                cfg,
                http,
                id,
                log,
                st,
                "failed",
                Some("the package names no capsule to download"),
            )
            .await;
        };
        let part = dir.join(format!("{dep}.part"));
        download(http, url, &part, size).await?;
        let got = digest(&part)?;
        if got.1 != size || got.0 != sha.to_ascii_lowercase() {
            let _ = std::fs::remove_file(&part);
            let why = format!(
                "the capsule does not match its package: {} bytes with SHA-256 {}, expected {size} bytes with {sha}",
                got.1, got.0
            );
            return finish(cfg, http, id, log, st, "failed", Some(&why)).await;
        }
        std::fs::rename(&part, &capsule).map_err(|e| format!("{}: {e}", capsule.display()))?;
        match write_configuration(cfg, http, pkg).await {
            Ok(()) => {}
            Err(ConfigProblem::Transient(e)) => return Err(e),
            // Nothing is installed with a configuration that is not the package's.
            Err(ConfigProblem::Refused(why)) => {
                let _ = std::fs::remove_file(&capsule);
                return finish(cfg, http, id, log, st, "failed", Some(&why)).await;
            }
        }
        st.stage = "installing".into();
        save(cfg, st)?;
    }
    if st.stage != "installing" {
        return Ok(());
    }
    report(cfg, http, id, log, st, "installing", None).await?;
    let env = hook_env(cfg, pkg, &capsule);
    let (code, output) = hook(&cfg.update.install_hook, &env).await;
    log.hook(st, "install", code, &output).await;
    match code {
        Some(0) => finish(cfg, http, id, log, st, "succeeded", None).await,
        Some(100) => {
            st.stage = "rebooting".into();
            save(cfg, st)?;
            report(cfg, http, id, log, st, "rebooting", None).await
        }
        _ => {
            st.stage = "failed".into();
            st.message = Some(format!(
                "the install hook ended with {}: {}",
                describe(code),
                last_chars(&output, 1000)
            ));
            if !cfg.update.rollback_hook.trim().is_empty() {
                st.rollback = Some("pending".into());
                st.env = env;
            }
            save(cfg, st)?;
            settle(cfg, http, id, log, st).await
        }
    }
}

/// Ends a failed or succeeded package: runs the rollback hook when one is `pending` (before
/// any report, so a robot out of reach of the service is rolled back at once), then
/// reports the package's end and the rollback's outcome, in that order, each once.
async fn settle(
    cfg: &Config,
    http: &reqwest::Client,
    id: &Identity,
    log: &Log,
    st: &mut State,
) -> Result<(), String> {
    if st.rollback.as_deref() == Some("pending") && cfg.update.rollback_hook.trim().is_empty() {
        // The hook was taken out of the configuration meanwhile: nothing was rolled back.
        st.rollback = None;
        st.env.clear();
        save(cfg, st)?;
    }
    if st.rollback.as_deref() == Some("pending") {
        let (rc, out) = hook(&cfg.update.rollback_hook, &st.env).await;
        log.hook(st, "rollback", rc, &out).await;
        let (outcome, message) = rollback_outcome(rc, &out);
        st.rollback = Some(outcome.to_string());
        st.rollback_message = message;
        st.env.clear();
        save(cfg, st)?;
    }
    remove_capsule(cfg, st);
    let (stage, message) = (st.stage.clone(), st.message.clone());
    report(cfg, http, id, log, st, &stage, message.as_deref()).await?;
    if let Some(outcome) = st.rollback.clone() {
        let message = st.rollback_message.clone();
        report(cfg, http, id, log, st, &outcome, message.as_deref()).await?;
    }
    Ok(())
}

/// The downloaded capsule of a finished package goes once its hooks have run.
fn remove_capsule(cfg: &Config, st: &State) {
    if let Some(dep) = st.deployment_id {
        let capsule = cfg.state_dir.join("updates").join(format!("{dep}.capsule"));
        let _ = std::fs::remove_file(capsule);
    }
}

/// What the rollback hook's end is reported as, and why when it failed.
fn rollback_outcome(code: Option<i32>, output: &str) -> (&'static str, Option<String>) {
    match code {
        Some(0) => ("rolled_back", None),
        _ => (
            "rollback_failed",
            Some(format!(
                "the rollback hook ended with {}: {}",
                describe(code),
                last_chars(output, 1000)
            )),
        ),
    }
}

fn describe(code: Option<i32>) -> String {
    code.map_or_else(|| "a signal".to_string(), |c| format!("status {c}"))
}

/// Downloads `url` into `part`, going on from the bytes already there, at most `size`
/// bytes in all (what the checksum then judges).
async fn download(http: &reqwest::Client, url: &str, part: &Path, size: u64) -> Result<(), String> {
    for attempt in 0u32.. {
        let have = std::fs::metadata(part).map_or(0, |m| m.len());
        if have >= size {
            return Ok(());
        }
        let mut req = http.get(url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) if e.is_builder() => return Err(format!("the capsule's link: {e}")),
            Err(_) => {
                tokio::time::sleep(client::backoff(attempt)).await;
                continue;
            }
        };
        let status = resp.status();
        // A part that does not start where this file ends is not the rest of it.
        let starts_here = resp
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<u64>().ok())
            == Some(have);
        let append = match status {
            reqwest::StatusCode::PARTIAL_CONTENT if starts_here => true,
            reqwest::StatusCode::PARTIAL_CONTENT => {
                let _ = std::fs::remove_file(part);
                continue;
            }
            reqwest::StatusCode::OK => false,
            // Nothing past what is here (or the file shrank): start again.
            reqwest::StatusCode::RANGE_NOT_SATISFIABLE => {
                let _ = std::fs::remove_file(part);
                continue;
            }
            s if s.is_server_error() || s == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                tokio::time::sleep(client::backoff(attempt)).await;
                continue;
            }
            s => return Err(format!("downloading the capsule: the link answered {s}")),
        };
        let mut f = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(part)
            .await
            .map_err(|e| format!("{}: {e}", part.display()))?;
        let mut resp = resp;
        let mut broken = false;
        let mut written = if append { have } else { 0 };
        loop {
            match resp.chunk().await {
                Ok(Some(bytes)) => {
                    // Never past the package's size, whatever the link sends.
                    let room = size.saturating_sub(written);
                    let take = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
                    f.write_all(&bytes[..take])
                        .await
                        .map_err(|e| format!("{}: {e}", part.display()))?;
                    written += take as u64;
                    if written >= size {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        f.sync_all()
            .await
            .map_err(|e| format!("{}: {e}", part.display()))?;
        if !broken {
            return Ok(());
        }
        tokio::time::sleep(client::backoff(attempt)).await;
    }
    Ok(())
}

/// A file's SHA-256 (hex) and size.
fn digest(path: &Path) -> Result<(String, u64), String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        let k = f
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex::encode(h.finalize()), n))
}

fn config_path(cfg: &Config) -> PathBuf {
    cfg.update
        .config_path
        .clone()
        .unwrap_or_else(|| cfg.state_dir.join("configuration.json"))
}

/// Writes the package's effective configuration (inline, or from its link), or `{}`.
async fn write_configuration(
    cfg: &Config,
    http: &reqwest::Client,
    pkg: &serde_json::Value,
) -> Result<(), ConfigProblem> {
    let c = &pkg["configuration"];
    let data = if c.is_null() {
        serde_json::json!({})
    } else if !c["config_data"].is_null() {
        c["config_data"].clone()
    } else if let Some(url) = c["download_url"].as_str() {
        fetch_configuration(http, url, c).await?
    } else {
        serde_json::json!({})
    };
    let path = config_path(cfg);
    let bytes =
        serde_json::to_vec_pretty(&data).map_err(|e| ConfigProblem::Transient(e.to_string()))?;
    write_private(&path, &bytes)
        .map_err(|e| ConfigProblem::Transient(format!("{}: {e}", path.display())))
}

/// The largest effective configuration the agent takes.
const MAX_CONFIGURATION_BYTES: u64 = 16 << 20;

/// Why a downloaded configuration cannot be installed, for the `failed` report.
#[derive(Debug)]
pub enum ConfigProblem {
    /// The download did not finish (retried at the next poll).
    Transient(String),
    /// What came is not what the package names: the update fails with this reason.
    Refused(String),
}

/// Downloads the effective configuration the package links to, reading at most the size the
/// package gives (and never more than [`MAX_CONFIGURATION_BYTES`]), and checks its size and
/// SHA-256 against the package before it parses it as JSON.
async fn fetch_configuration(
    http: &reqwest::Client,
    url: &str,
    c: &serde_json::Value,
) -> Result<serde_json::Value, ConfigProblem> {
    let (Some(size), Some(sha)) = (c["size_bytes"].as_u64(), c["sha256"].as_str()) else {
        return Err(ConfigProblem::Refused(
            "the package names no size and SHA-256 for its configuration".into(),
        ));
    };
    if size > MAX_CONFIGURATION_BYTES {
        return Err(ConfigProblem::Refused(format!(
            "the configuration is {size} bytes, over the agent's {MAX_CONFIGURATION_BYTES}"
        )));
    }
    let mut r = client::call(|| Ok(http.get(url)), Some(10))
        .await
        .map_err(|e| ConfigProblem::Transient(format!("downloading the configuration: {e}")))?;
    let mut bytes = Vec::with_capacity(size as usize);
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| ConfigProblem::Transient(format!("downloading the configuration: {e}")))?
    {
        if bytes.len() as u64 + chunk.len() as u64 > size {
            return Err(ConfigProblem::Refused(format!(
                "the configuration is larger than the {size} bytes its package names"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    check_configuration(&bytes, size, sha)
}

/// A downloaded configuration checked against its package's size and SHA-256, then parsed.
pub fn check_configuration(
    bytes: &[u8],
    size: u64,
    sha: &str,
) -> Result<serde_json::Value, ConfigProblem> {
    let got = hex::encode(sha2::Sha256::digest(bytes));
    if bytes.len() as u64 != size || !got.eq_ignore_ascii_case(sha.trim()) {
        return Err(ConfigProblem::Refused(format!(
            "the configuration does not match its package: {} bytes with SHA-256 {got}, expected {size} bytes with {sha}",
            bytes.len()
        )));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ConfigProblem::Refused(format!("the configuration is not JSON: {e}")))
}

fn hook_env(cfg: &Config, pkg: &serde_json::Value, capsule: &Path) -> Vec<(String, String)> {
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
const HOOK_KEPT_BYTES: usize = 64 << 10;
/// ... and at most this many of its last lines go to the daemon's session.
const HOOK_KEPT_LINES: usize = 1000;

/// Runs `cmd` with `sh -c`, its stderr and stdout one stream: its exit code (`None`: a
/// signal) and the end of its output (at most 64 KiB).
async fn hook(cmd: &str, env: &[(String, String)]) -> (Option<i32>, String) {
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
fn last_chars(text: &str, n: usize) -> String {
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

    async fn line(&self, level: &'static str, message: String) {
        if let Some(tx) = &self.tx {
            let mut e = lines::entry(message.as_bytes(), "fleetops-agent", level, self.max_line);
            e.level = level;
            let _ = tx.send(e).await;
        }
    }

    /// One line on stderr, and in the session, for a stage of update `st`.
    async fn stage(&self, st: &State, stage: &str) {
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
    async fn hook(&self, st: &State, which: &str, code: Option<i32>, output: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_is_checked_against_its_package_before_it_is_taken() {
        let body = br#"{"speed": 2}"#;
        let sha = hex::encode(sha2::Sha256::digest(body));
        assert!(matches!(
            check_configuration(body, body.len() as u64, &sha.to_ascii_uppercase()),
            Ok(v) if v == serde_json::json!({"speed": 2})
        ));
        // Another size, another digest, or bytes that are not JSON: refused, with why.
        for (bytes, size, digest, why) in [
            (&body[..], 99, sha.clone(), "does not match"),
            (
                &body[..],
                body.len() as u64,
                "00".repeat(32),
                "does not match",
            ),
        ] {
            match check_configuration(bytes, size, &digest) {
                Err(ConfigProblem::Refused(m)) => assert!(m.contains(why), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        let junk = b"speed: [";
        let junk_sha = hex::encode(sha2::Sha256::digest(junk));
        match check_configuration(junk, junk.len() as u64, &junk_sha) {
            Err(ConfigProblem::Refused(m)) => assert!(m.contains("not JSON"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    fn at(stage: &str, etag: Option<&str>) -> State {
        State {
            deployment_id: Some(4),
            etag: etag.map(str::to_string),
            stage: stage.into(),
            reported: vec![stage.into()],
            ..State::default()
        }
    }

    #[test]
    fn a_failed_package_answered_with_a_new_etag_is_installed_again() {
        assert_eq!(
            next_step(&at("failed", Some("\"a\"")), 4, Some("\"b\"")),
            Step::Start
        );
        assert_eq!(
            next_step(&at("failed", None), 4, Some("\"b\"")),
            Step::Start
        );
        // The same answer again is no retry.
        assert_eq!(
            next_step(&at("failed", Some("\"a\"")), 4, Some("\"a\"")),
            Step::Keep
        );
        assert_eq!(next_step(&at("failed", Some("\"a\"")), 4, None), Step::Keep);
    }

    #[test]
    fn a_succeeded_package_is_not_installed_again_whatever_its_etag() {
        assert_eq!(
            next_step(&at("succeeded", Some("\"a\"")), 4, Some("\"b\"")),
            Step::Keep
        );
    }

    #[test]
    fn a_new_package_starts_and_an_unfinished_one_goes_on() {
        assert_eq!(next_step(&State::default(), 4, Some("\"a\"")), Step::Start);
        assert_eq!(
            next_step(&at("succeeded", Some("\"a\"")), 5, Some("\"a\"")),
            Step::Start
        );
        assert_eq!(
            next_step(&at("installing", Some("\"a\"")), 4, Some("\"b\"")),
            Step::Resume
        );
        assert_eq!(next_step(&at("downloading", None), 4, None), Step::Resume);
    }

    #[test]
    fn a_failed_package_is_settled_once_its_rollback_ran_and_both_were_reported() {
        let mut st = at("failed", None);
        assert!(st.settled());
        st.rollback = Some("pending".into());
        assert!(!st.settled());
        st.rollback = Some("rolled_back".into());
        assert!(!st.settled());
        st.reported.push("rolled_back".into());
        assert!(st.settled());
        // Killed after the rollback, before `failed` was reported.
        st.reported = vec!["downloading".into(), "installing".into()];
        assert!(!st.settled());
    }

    #[test]
    fn the_rollback_hooks_end_is_rolled_back_or_rollback_failed_with_its_words() {
        assert_eq!(rollback_outcome(Some(0), "ok"), ("rolled_back", None));
        let (o, m) = rollback_outcome(Some(4), "no previous version");
        assert_eq!(o, "rollback_failed");
        assert_eq!(
            m.as_deref(),
            Some("the rollback hook ended with status 4: no previous version")
        );
        assert_eq!(rollback_outcome(None, "").0, "rollback_failed");
    }

    #[test]
    fn a_state_kept_before_rollbacks_existed_still_reads() {
        let st: State = serde_json::from_str(
            r#"{"deployment_id": 4, "etag": null, "stage": "failed", "reported": ["failed"]}"#,
        )
        .unwrap();
        assert_eq!(st.rollback, None);
        assert!(st.settled());
    }
}
