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

mod configuration;
mod download;
mod hooks;

pub use configuration::*;
use download::*;
pub use hooks::Log;
use hooks::*;

#[cfg(test)]
mod tests;
