//! The agent's configuration file (`/etc/fleetops-agent.toml` unless `--config` names
//! another), every key with a default but `server`. Unknown keys stop the agent, so a typo is
//! never silently ignored.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The service's base URL, e.g. `https://fleet.example.com`.
    pub server: String,
    /// Where the agent keeps its identity (its device token, 0600) and its log spool.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// A PEM file of CA certificates trusted besides the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The device's name at enrollment; default: the host name.
    #[serde(default)]
    pub name: Option<String>,
    /// The device's labels at enrollment (the enrollment token's, with these winning).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The enrollment token (`fopse_...`); `FLEETOPS_ENROLLMENT_TOKEN` wins. Needed only
    /// until the agent has enrolled.
    #[serde(default)]
    pub enrollment_token: Option<String>,
    #[serde(default)]
    pub heartbeat: Heartbeat,
    #[serde(default)]
    pub logs: Logs,
    #[serde(default)]
    pub run: Run,
    #[serde(default)]
    pub update: Update,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Update {
    /// How often `daemon` asks which package to run.
    pub poll_seconds: u64,
    /// Installs a verified capsule (`sh -c`, with `FLEETOPS_CAPSULE_PATH` and the others in
    /// docs/agent.md). Exit 0: installed; exit 100: installed, rebooting (reported
    /// `succeeded` once the agent starts again); anything else: failed. Empty: the agent
    /// does not update the robot.
    pub install_hook: String,
    /// Run after a failed install, with the same environment.
    pub rollback_hook: String,
    /// Where the package's effective configuration is written (JSON); default
    /// `state_dir/configuration.json`.
    pub config_path: Option<PathBuf>,
}

impl Default for Update {
    fn default() -> Self {
        Self {
            poll_seconds: 30,
            install_hook: String::new(),
            rollback_hook: String::new(),
            config_path: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Heartbeat {
    pub interval_seconds: u64,
    /// Built-in metrics: `load` (1-minute load average), `memory` (used %), `disk` (used %
    /// of `disk_path`), `uptime` (seconds).
    pub builtins: Vec<String>,
    pub disk_path: PathBuf,
    /// Metrics read from a command's output (its first number), run with `sh -c`.
    pub commands: BTreeMap<String, String>,
    /// Metrics read from a file (its first number).
    pub files: BTreeMap<String, PathBuf>,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            interval_seconds: 30,
            builtins: vec![
                "load".into(),
                "memory".into(),
                "disk".into(),
                "uptime".into(),
            ],
            disk_path: PathBuf::from("/"),
            commands: BTreeMap::new(),
            files: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Logs {
    /// A batch is sent at this many lines ...
    pub batch_lines: usize,
    /// ... or once its first line is this old.
    pub flush_ms: u64,
    /// Bytes of batches kept on disk while the service is out of reach; past it the oldest
    /// go, and how many lines went is logged once the service is back.
    pub max_buffer_bytes: u64,
    /// A line longer than this is cut (bytes).
    pub max_line_bytes: usize,
    /// Batches go gzip-compressed (a tenth of the bytes on a robot's link, for typical logs).
    pub compress: bool,
    /// Files `daemon` follows (`*` and `?` in the file name), rotation handled.
    pub files: Vec<String>,
    /// `daemon` follows the systemd journal too.
    pub journal: bool,
}

impl Default for Logs {
    fn default() -> Self {
        Self {
            batch_lines: 500,
            flush_ms: 1000,
            max_buffer_bytes: 64 << 20,
            max_line_bytes: 16 << 10,
            compress: true,
            files: Vec::new(),
            journal: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Run {
    /// Files uploaded as the session's artifacts when the command ends: `*` and `?` in the
    /// file name (`recordings/*.mcap`, `core*`), relative to the working directory.
    pub artifacts: Vec<String>,
}

impl Default for Run {
    fn default() -> Self {
        Self {
            artifacts: vec![
                "*.mcap".into(),
                "*.bag".into(),
                "core".into(),
                "core.*".into(),
            ],
        }
    }
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/fleetops-agent")
}

impl Config {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let c: Config = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !(c.server.starts_with("http://") || c.server.starts_with("https://")) {
            return Err(format!(
                "{}: server must be an http:// or https:// URL",
                path.display()
            ));
        }
        if c.heartbeat.interval_seconds == 0 || !(1..=10_000).contains(&c.logs.batch_lines) {
            return Err(format!(
                "{}: heartbeat.interval_seconds must be above 0 and logs.batch_lines 1 to 10000 \
                 (the service takes at most 10,000 entries a batch)",
                path.display()
            ));
        }
        Ok(c)
    }

    pub fn server(&self) -> &str {
        self.server.trim_end_matches('/')
    }
}
