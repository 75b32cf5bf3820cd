//! One typed configuration tree, read from `config.toml` (or `--config PATH`) and overridden
//! by `FLEETOPS_*` environment variables. Every key is optional; `config.toml` at the top of
//! the repository documents each default. Unknown keys are an error, so a typo never passes
//! silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fleetops_actors::config::{
    AuthConfig, DevicesConfig, RuntimeConfig, SessionsConfig, SupervisionConfig,
};
use fleetops_http::{HttpConfig, Tier};
use serde::Deserialize;

/// How the tracing log (standard error) is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (`FLEETOPS_LISTEN`); port 0 picks a free port.
    pub listen: String,
    /// Where sled and the local blobs live (`FLEETOPS_DATA_DIR`).
    pub data_dir: PathBuf,
    /// Base of absolute URLs the server hands out (`FLEETOPS_PUBLIC_URL`); empty: derived from
    /// the listening address.
    pub public_url: String,
    /// tracing filter (`FLEETOPS_LOG`), e.g. `info` or `fleetops=debug`.
    pub log: String,
    /// `text` (for a terminal) or `json` (one object a line, for a log shipper;
    /// `FLEETOPS_LOG_FORMAT`).
    pub log_format: LogFormat,
    pub http: HttpConfig,
    pub auth: AuthConfig,
    pub supervision: SupervisionConfig,
    pub devices: DevicesConfig,
    pub sessions: SessionsConfig,
    /// `[logs]`: sealing a session's log batches into chunks of a target size.
    pub logs: fleetops_actors::config::LogsConfig,
    pub pipeline: fleetops_actors::config::PipelineConfig,
    /// `[scm]`: the inbound webhook (secret, rotation, limits, retention).
    pub scm: fleetops_actors::config::ScmConfig,
    /// `[runs]`: test-run leases.
    pub runs: fleetops_actors::config::RunsConfig,
    /// `[alerts]`: evaluation and outbound notifications.
    pub alerts: fleetops_actors::config::AlertsConfig,
    /// `[smtp]`: where e-mail integrations send.
    pub smtp: fleetops_actors::config::SmtpConfig,
    /// `[secrets]`: where the key that encrypts integration secrets lives.
    pub secrets: fleetops_actors::config::SecretsConfig,
    /// `[storage]`: where artifacts (and later capsules) live.
    pub storage: fleetops_storage::blobs::StorageConfig,
    /// `[database]`: where the metadata lives (empty `url`: sled in the data directory).
    pub database: fleetops_storage::DatabaseConfig,
    /// `[bus]`: the NATS server several nodes share (empty: one node, in-process).
    pub bus: fleetops_actors::bus::BusConfig,
    /// `[tiers.<name>]`; a table given here replaces only the keys it sets.
    pub tiers: BTreeMap<String, TierFile>,
    pub admin: AdminConfig,
}

/// A tier as written in the file: any key may be left out.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierFile {
    pub requests_per_minute: Option<u32>,
    pub storage_bytes: Option<u64>,
}

/// `[admin]`: the superuser created on the first start of an empty data directory.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// `FLEETOPS_ADMIN_EMAIL`.
    pub email: String,
    /// `FLEETOPS_ADMIN_PASSWORD`; empty: generated and printed once.
    pub password: String,
    /// The tier of organization `default` made by the first start (`FLEETOPS_ADMIN_TIER`):
    /// `enterprise` by default, since on a self-hosted server the operator's own fleet should
    /// not meet the hosted `free` tier's 60 requests a minute.
    pub tier: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            email: "admin@localhost".into(),
            password: String::new(),
            tier: "enterprise".into(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            data_dir: PathBuf::from("./data"),
            public_url: String::new(),
            log: "info".into(),
            log_format: LogFormat::Text,
            http: HttpConfig::default(),
            auth: AuthConfig::default(),
            supervision: SupervisionConfig::default(),
            devices: DevicesConfig::default(),
            sessions: SessionsConfig::default(),
            logs: fleetops_actors::config::LogsConfig::default(),
            pipeline: fleetops_actors::config::PipelineConfig::default(),
            scm: fleetops_actors::config::ScmConfig::default(),
            runs: fleetops_actors::config::RunsConfig::default(),
            alerts: fleetops_actors::config::AlertsConfig::default(),
            smtp: fleetops_actors::config::SmtpConfig::default(),
            secrets: fleetops_actors::config::SecretsConfig::default(),
            storage: fleetops_storage::blobs::StorageConfig::default(),
            database: fleetops_storage::DatabaseConfig::default(),
            bus: Default::default(),
            tiers: BTreeMap::new(),
            admin: AdminConfig::default(),
        }
    }
}

/// The built-in tiers (name, requests per minute, storage bytes), best last.
const DEFAULT_TIERS: [(&str, u32, u64); 4] = [
    ("free", 60, 1_000_000_000),
    ("personal", 300, 50_000_000_000),
    ("team", 1000, 50_000_000_000),
    ("enterprise", 10_000, 500_000_000_000),
];

impl Config {
    /// Reads `path` if given (it must exist), else `./config.toml` if present, else
    /// defaults; then applies the environment.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let mut cfg = match path {
            Some(p) => Self::from_file(p)?,
            None if Path::new("config.toml").exists() => Self::from_file(Path::new("config.toml"))?,
            None => Self::default(),
        };
        cfg.apply_env(|k| std::env::var(k).ok())?;
        Ok(cfg)
    }

    pub fn from_file(p: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))
    }

    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        if let Some(v) = get("FLEETOPS_LISTEN") {
            self.listen = v;
        }
        if let Some(v) = get("FLEETOPS_DATA_DIR") {
            self.data_dir = PathBuf::from(v);
        }
        if let Some(v) = get("FLEETOPS_DATABASE_URL") {
            self.database.url = v;
        }
        if let Some(v) = get("FLEETOPS_BUS_URL") {
            self.bus.url = v;
        }
        if let Some(v) = get("FLEETOPS_BUS_PASSWORD") {
            self.bus.password = v;
        }
        if let Some(v) = get("FLEETOPS_BUS_TOKEN") {
            self.bus.token = v;
        }
        if let Some(v) = get("FLEETOPS_BUS_NKEY_SEED") {
            self.bus.nkey_seed = v;
        }
        if let Some(v) = get("FLEETOPS_PUBLIC_URL") {
            self.public_url = v;
        }
        if let Some(v) = get("FLEETOPS_JWT_SECRET") {
            self.auth.jwt_secret = v;
        }
        if let Some(v) = get("FLEETOPS_SCM_WEBHOOK_SECRET") {
            self.scm.webhook_secret = v;
        }
        if let Some(v) = get("FLEETOPS_ALERTS_ALLOW_PRIVATE_TARGETS") {
            self.alerts.allow_private_targets = match v.trim() {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                other => anyhow::bail!(
                    "FLEETOPS_ALERTS_ALLOW_PRIVATE_TARGETS must be true or false, not {other:?}"
                ),
            };
        }
        if let Some(v) = get("FLEETOPS_SECRETS_KEY_FILE") {
            self.secrets.key_file = v;
        }
        if let Some(v) = get("FLEETOPS_SECRETS_KEY") {
            self.secrets.key = v;
        }
        if let Some(v) = get("FLEETOPS_ALLOW_SHARED_DATA_DIR") {
            self.storage.allow_shared_data_dir = match v.trim() {
                "true" | "1" => true,
                "false" | "0" | "" => false,
                other => anyhow::bail!(
                    "FLEETOPS_ALLOW_SHARED_DATA_DIR must be true or false, not {other:?}"
                ),
            };
        }
        if let Some(v) = get("FLEETOPS_LOG") {
            self.log = v;
        }
        if let Some(v) = get("FLEETOPS_LOG_FORMAT") {
            self.log_format = match v.as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => anyhow::bail!("FLEETOPS_LOG_FORMAT must be text or json, not {other:?}"),
            };
        }
        if let Some(v) = get("FLEETOPS_ADMIN_EMAIL") {
            // A value from a secret file often ends in a newline; an address never does.
            self.admin.email = v.trim().to_string();
        }
        if let Some(v) = get("FLEETOPS_ADMIN_PASSWORD") {
            self.admin.password = v;
        }
        if let Some(v) = get("FLEETOPS_ADMIN_TIER") {
            self.admin.tier = v.trim().to_string();
        }
        Ok(())
    }

    /// Checks what can be checked before anything starts.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !self.auth.jwt_secret.is_empty() && self.auth.jwt_secret.len() < 32 {
            anyhow::bail!("the configured JWT secret is shorter than 32 bytes");
        }
        for (name, t) in self.tiers().iter().map(|t| (&t.name, t)) {
            if t.requests_per_minute == 0 {
                anyhow::bail!("tiers.{name}.requests_per_minute must be at least 1");
            }
        }
        if !self.tiers().iter().any(|t| t.name == self.admin.tier) {
            anyhow::bail!(
                "[admin] tier {:?} is not a tier ([tiers.<name>] or free, personal, team, enterprise)",
                self.admin.tier
            );
        }
        if self.bus.nodes == 0 {
            anyhow::bail!("[bus] nodes must be at least 1");
        }
        self.bus.validate()?;
        if self.bus.nodes > 1 && self.bus.url.is_empty() {
            anyhow::bail!(
                "[bus] nodes is more than 1 but [bus] url is empty: several nodes share a bus"
            );
        }
        let tick = self.pipeline.rollout_tick_ms.max(self.alerts.tick_ms);
        if self.bus.lease_ttl_ms > 3_600_000 || self.bus.lease_ttl_ms < 2 * tick.max(50) {
            anyhow::bail!(
                "[bus] lease_ttl_ms must be at least twice [pipeline] rollout_tick_ms and \
                 [alerts] tick_ms ({} ms here) and at most an hour",
                2 * tick.max(50)
            );
        }
        if !self.bus.url.is_empty() {
            if !self.database.is_postgres() {
                anyhow::bail!(
                    "[bus] url joins several nodes, which share their records through \
                     PostgreSQL: set [database] url too"
                );
            }
            if self.storage.backend != "s3" {
                anyhow::bail!(
                    "[bus] url joins several nodes, which share blobs and log segments through \
                     an S3-compatible store: set [storage] backend = \"s3\" too"
                );
            }
        }
        if self.sessions.max_result_window < 10_000 {
            anyhow::bail!(
                "[sessions] max_result_window must be at least 10000 (a log query's largest limit)"
            );
        }
        if let Some(needed) = self.paced_flood_seconds()
            && needed >= self.http.body_timeout_seconds
        {
            tracing::warn!(
                needed,
                body_timeout_seconds = self.http.body_timeout_seconds,
                "at [http] unauthenticated_body_bytes_per_second, max_large_bodies deliveries of \
                 [scm] max_body_bytes take longer than the body deadline to read together: in a \
                 flood some get 408 rather than 401 or 503; raise the pace or the deadline"
            );
        }
        Ok(())
    }

    /// Seconds a webhook body of the largest size may need when every large reader holds one
    /// and the pace is shared: its 5 s wait for a reader plus its share of the pace. The body
    /// deadline covers both.
    pub fn paced_flood_seconds(&self) -> Option<u64> {
        let pace = self.http.unauthenticated_body_bytes_per_second;
        (pace > 0).then(|| {
            5 + (self.scm.max_body_bytes as u128 * self.http.max_large_bodies.max(1) as u128)
                .div_ceil(pace as u128) as u64
        })
    }

    /// The built-in tiers with the file's tables laid over them, plus any new tier the file
    /// names (missing keys then take the free tier's values).
    pub fn tiers(&self) -> Vec<Tier> {
        let mut out: Vec<Tier> = DEFAULT_TIERS
            .iter()
            .map(|(n, rpm, bytes)| Tier {
                name: n.to_string(),
                requests_per_minute: *rpm,
                storage_bytes: *bytes,
            })
            .collect();
        for (name, f) in &self.tiers {
            let idx = match out.iter().position(|t| &t.name == name) {
                Some(i) => i,
                None => {
                    out.push(Tier {
                        name: name.clone(),
                        requests_per_minute: DEFAULT_TIERS[0].1,
                        storage_bytes: DEFAULT_TIERS[0].2,
                    });
                    out.len() - 1
                }
            };
            if let Some(t) = out.get_mut(idx) {
                if let Some(v) = f.requests_per_minute {
                    t.requests_per_minute = v;
                }
                if let Some(v) = f.storage_bytes {
                    t.storage_bytes = v;
                }
            }
        }
        out
    }

    /// The tiers as this node enforces them: each rate limit divided by `[bus] nodes`,
    /// rounded up (every node counts its own requests).
    pub fn node_tiers(&self) -> Vec<Tier> {
        let nodes = self.bus.nodes.max(1);
        self.tiers()
            .into_iter()
            .map(|t| Tier {
                requests_per_minute: t.requests_per_minute.div_ceil(nodes),
                ..t
            })
            .collect()
    }

    /// `[http]` as this node enforces it: the login limits divided by `[bus] nodes`, rounded
    /// up.
    pub fn node_http(&self) -> HttpConfig {
        let nodes = self.bus.nodes.max(1);
        let mut h = self.http.clone();
        h.login_per_minute = h.login_per_minute.div_ceil(nodes);
        h.login_per_account_per_minute = h.login_per_account_per_minute.div_ceil(nodes);
        h
    }

    pub fn runtime(&self) -> RuntimeConfig {
        RuntimeConfig {
            supervision: self.supervision.clone(),
            devices: self.devices.clone(),
            sessions: self.sessions.clone(),
            logs: self.logs.clone(),
            min_free_bytes: self.storage.min_free_bytes,
            auth: self.auth.clone(),
            tiers: self.tiers().into_iter().map(|t| t.name.clone()).collect(),
            quotas: self
                .tiers()
                .into_iter()
                .map(|t| (t.name, t.storage_bytes))
                .collect(),
            pipeline: self.pipeline.clone(),
            scm: self.scm.clone(),
            runs: self.runs.clone(),
            alerts: self.alerts.clone(),
            smtp: self.smtp.clone(),
            secrets: self.secrets.clone(),
            bus: self.bus.clone(),
            uploads: (
                self.http.max_streamed_uploads,
                self.http.max_streamed_uploads_per_org,
            ),
            public_url: self.public_url.trim_end_matches('/').to_string(),
            tmp_dir: Some(self.data_dir.join("tmp")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_enforces_its_share_of_every_rate_limit_rounded_up() {
        let mut c: Config = toml::from_str(
            "[bus]\nnodes = 3\n[tiers.free]\nrequests_per_minute = 100\n[http]\nlogin_per_minute = 10\n",
        )
        .unwrap();
        let free = c
            .node_tiers()
            .into_iter()
            .find(|t| t.name == "free")
            .unwrap();
        assert_eq!(free.requests_per_minute, 34);
        assert_eq!(c.node_http().login_per_minute, 4);
        assert_eq!(c.node_http().login_per_account_per_minute, 7);
        c.bus.nodes = 0;
        assert!(c.validate().is_err());
        // Several nodes without a bus are not several nodes.
        c.bus.nodes = 2;
        assert!(c.validate().is_err());
        c.bus.nodes = 1;
        c.bus.lease_ttl_ms = 600;
        assert!(c.validate().is_err(), "shorter than two rollout ticks");
    }

    #[test]
    fn partial_tier_keeps_other_defaults_and_env_wins() {
        let mut c: Config =
            toml::from_str("listen = \"0.0.0.0:1\"\n[tiers.free]\nrequests_per_minute = 100000\n")
                .unwrap();
        let free = c.tiers().into_iter().find(|t| t.name == "free").unwrap();
        assert_eq!(free.requests_per_minute, 100_000);
        assert_eq!(free.storage_bytes, 1_000_000_000);
        c.apply_env(|k| (k == "FLEETOPS_LISTEN").then(|| "127.0.0.1:9".to_string()))
            .unwrap();
        assert_eq!(c.listen, "127.0.0.1:9");
    }

    #[test]
    fn the_first_start_is_enterprise_unless_told_and_a_tier_must_exist() {
        assert_eq!(Config::default().admin.tier, "enterprise");
        let mut c = Config::default();
        c.admin.tier = "platinum".into();
        assert!(c.validate().is_err());
        c.tiers.insert("platinum".into(), TierFile::default());
        c.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_short_secrets_are_refused() {
        assert!(toml::from_str::<Config>("lissten = 1").is_err());
        let mut c = Config::default();
        c.auth.jwt_secret = "short".into();
        assert!(c.validate().is_err());
        let mut c = Config::default();
        c.sessions.max_result_window = 9_999;
        assert!(c.validate().is_err(), "a window below the largest limit");
    }

    #[test]
    fn the_shipped_config_toml_parses() {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
        let c: Config = toml::from_str(&text).unwrap();
        c.validate().unwrap();
        // The shipped pace reads eight 25 MiB deliveries together well inside the deadline.
        assert!(c.paced_flood_seconds().unwrap() < c.http.body_timeout_seconds);
    }
}
