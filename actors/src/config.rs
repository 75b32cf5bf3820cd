//! The parts of `config.toml` the runtime reads. Every field has a documented default so an
//! empty file (or none) runs.

use serde::Deserialize;

/// `[supervision]`: how actors are restarted and bounded.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SupervisionConfig {
    /// Restarts allowed per actor within `restart_window_seconds` before it is left down
    /// (requests to it get 503) until the window has passed.
    pub max_restarts: u32,
    pub restart_window_seconds: u64,
    /// Delay before the second and later restarts inside one window, doubling each time.
    /// The first restart is immediate.
    pub restart_backoff_ms: u64,
    pub max_restart_backoff_ms: u64,
    /// How long a call may wait in an actor's mailbox before it is abandoned (503 with
    /// `Retry-After`, never applied); once taken on, its caller waits for the answer.
    pub call_timeout_ms: u64,
    /// Calls that may wait in one actor's mailbox; beyond it callers get 503 at once.
    pub mailbox_limit: usize,
    /// Interval of the housekeeper's passes (expired uploads, delivery retention, pruning).
    pub housekeeping_seconds: u64,
    /// A deleted organization's data is purged in the background, at most this many records
    /// a step, each step durable before the next.
    pub purge_records_per_step: usize,
    /// The pause between two purge steps, which leaves the store to other writers.
    pub purge_pause_ms: u64,
}

impl Default for SupervisionConfig {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            restart_window_seconds: 60,
            restart_backoff_ms: 100,
            max_restart_backoff_ms: 5_000,
            call_timeout_ms: 5_000,
            mailbox_limit: 4_096,
            housekeeping_seconds: 60,
            purge_records_per_step: 500,
            purge_pause_ms: 1,
        }
    }
}

/// `[devices]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DevicesConfig {
    /// A device without a heartbeat for this long is `offline`.
    pub offline_after_seconds: u64,
}

impl Default for DevicesConfig {
    fn default() -> Self {
        Self {
            offline_after_seconds: 60,
        }
    }
}

/// `[sessions]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// Largest artifact file (413 beyond).
    pub max_artifact_bytes: u64,
    /// Recent entries an active session keeps in memory for live-stream replay (at least the
    /// largest `replay`, 10,000).
    pub buffer_entries: usize,
    /// Bytes of those entries at most (the newest batch always stays): a replay covers the
    /// newest `buffer_entries` entries or `buffer_bytes`, whichever is less.
    pub buffer_bytes: usize,
    /// Batches a live subscriber may fall behind before it is told `lagged` and skipped ahead.
    pub subscriber_queue: usize,
    /// Bytes of batches queued for one live subscriber; past it the subscriber is skipped
    /// ahead (told `lagged`), so a viewer that does not read holds at most this much.
    pub subscriber_queue_bytes: usize,
    /// Seconds between WebSocket pings.
    pub ping_interval_seconds: u64,
    /// An active session's actor with no appends, artifacts or subscribers for this long is
    /// stopped and its replay buffer released; the next append or subscriber starts it again
    /// from storage.
    pub idle_seconds: u64,
    /// Deepest a log query pages: `offset + limit` at most this (422 beyond). A query holds
    /// the first `offset + limit` matches' sort keys (24 bytes each) while it reads, so this
    /// bounds its memory; `since` pages further at no cost.
    pub max_result_window: usize,
    /// Log exports and artifact ZIPs streaming at once (503 past it); each holds a blocking
    /// thread until its reader has taken it all, or has left a piece untaken for
    /// `stalled_reader_seconds`.
    pub max_streams: usize,
    /// Of those, at most this many for one organization's projects (503 past it), so slow
    /// readers of one tenant never hold every place.
    pub max_streams_per_org: usize,
    /// How long such a stream waits for its reader to take a piece before it is cut short
    /// (the response then ends in an error, not as if whole).
    pub stalled_reader_seconds: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            max_artifact_bytes: 1024 * 1024 * 1024,
            buffer_entries: 10_000,
            buffer_bytes: 16 * 1024 * 1024,
            subscriber_queue: 256,
            subscriber_queue_bytes: 8 * 1024 * 1024,
            ping_interval_seconds: 30,
            idle_seconds: 300,
            max_result_window: 1_000_000,
            max_streams: 32,
            max_streams_per_org: 8,
            stalled_reader_seconds: 60,
        }
    }
}

/// `[logs]`: how a session's log batches are sealed (`actors/src/session/sealer.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogsConfig {
    /// A session's batches are sealed once this many lines ...
    pub seal_lines: usize,
    /// ... or this many bytes have arrived unsealed ...
    pub seal_bytes: usize,
    /// ... or its oldest unsealed batch is this old (checked every housekeeping pass), and
    /// when the session ends.
    pub seal_age_seconds: u64,
    /// A sealed chunk merges consecutive batches up to this many lines ...
    pub chunk_lines: usize,
    /// ... and this many bytes (a batch larger than either stays one chunk).
    pub chunk_bytes: usize,
    /// Seals running at once (each on a blocking thread); a seal due while all run waits for
    /// the next trigger or housekeeping pass.
    pub max_concurrent_seals: usize,
    /// Days an ended session is kept, with its logs and files, before the housekeeper deletes
    /// it (0: for good). A project may set its own through the API.
    pub retention_days: u32,
    /// Bytes of sealed chunks fetched from the blob store kept in memory for later reads.
    pub cache_bytes: usize,
}

impl Default for LogsConfig {
    fn default() -> Self {
        Self {
            seal_lines: 65_536,
            seal_bytes: 8 * 1024 * 1024,
            seal_age_seconds: 60,
            chunk_lines: 4_096,
            chunk_bytes: 1024 * 1024,
            max_concurrent_seals: 2,
            retention_days: 0,
            cache_bytes: 256 * 1024 * 1024,
        }
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// HS256 key (UTF-8 bytes, at least 32). Empty: one is generated once and kept in the
    /// data directory.
    pub jwt_secret: String,
    /// Lifetime of an access token.
    pub token_ttl_seconds: u64,
    /// How long after the original login a token may still be refreshed.
    pub refresh_window_seconds: u64,
    /// API keys one user may hold (each is a credential with its own rate-limit bucket);
    /// past it, creating one is 422.
    pub max_api_keys_per_user: usize,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_secret: String::new(),
            token_ttl_seconds: 3600,
            refresh_window_seconds: 7 * 24 * 3600,
            max_api_keys_per_user: 20,
        }
    }
}

/// `[secrets]`: where the key that encrypts integration secrets lives.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsConfig {
    /// A file holding the key (`FLEETOPS_SECRETS_KEY_FILE`): 32 bytes as base64, made (mode
    /// 0600) at the first start that names it, holding the data directory's key if it had
    /// one. Empty: the key is kept in the data directory.
    pub key_file: String,
    /// The key itself, 32 bytes as base64 (only from the environment, `FLEETOPS_SECRETS_KEY`;
    /// wins over `key_file`).
    #[serde(skip)]
    pub key: String,
}

/// `[pipeline]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// Up to this size confirm validates inline (200); above it, in the background (202).
    pub sync_validation_max_bytes: u64,
    /// Lifetime of an upload link; an upload never confirmed by then is purged.
    pub upload_ttl_seconds: i64,
    /// Lifetime of a download link (15 minutes by default).
    pub download_ttl_seconds: i64,
    /// Devices whose answer to the update poll is kept in memory (a few dozen bytes each; the
    /// bodies are shared per package); past it the cache starts over.
    pub device_cache_entries: usize,
    /// How often each rollout's controller checks its gate.
    pub rollout_tick_ms: u64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            sync_validation_max_bytes: 256 * 1024 * 1024,
            upload_ttl_seconds: 3600,
            download_ttl_seconds: 900,
            device_cache_entries: 100_000,
            rollout_tick_ms: 500,
        }
    }
}

/// `[scm]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScmConfig {
    /// Seeds the webhook secret (`FLEETOPS_SCM_WEBHOOK_SECRET`); once rotated through the API
    /// the stored one is current.
    pub webhook_secret: String,
    /// How long the previous secret keeps verifying after a rotation.
    pub rotation_grace_seconds: i64,
    /// Signature failures within an hour that raise the alert on `/scm/status`.
    pub signature_failure_alert_threshold: u32,
    /// The host's own cap on a delivery's body.
    pub max_body_bytes: u64,
    /// How long a delivery id is remembered (a repeat within it is 401).
    pub dedup_window_seconds: i64,
    /// How long the delivery log keeps a delivery.
    pub delivery_retention_days: i64,
    /// A secret older than this is due for rotation.
    pub rotation_days: i64,
}

impl Default for ScmConfig {
    fn default() -> Self {
        Self {
            webhook_secret: String::new(),
            rotation_grace_seconds: 86_400,
            signature_failure_alert_threshold: 5,
            max_body_bytes: 25 * 1024 * 1024,
            dedup_window_seconds: 86_400,
            delivery_retention_days: 30,
            rotation_days: 90,
        }
    }
}

/// `[runs]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsConfig {
    /// A claimed run's lease; renewed by heartbeats, expiry requeues it with `attempt` + 1.
    pub lease_seconds: i64,
}

impl Default for RunsConfig {
    fn default() -> Self {
        Self { lease_seconds: 600 }
    }
}

/// `[alerts]`: rule evaluation and outbound notifications.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertsConfig {
    /// Let integrations target loopback, private, link-local, CGNAT and unique-local
    /// addresses (`FLEETOPS_ALERTS_ALLOW_PRIVATE_TARGETS`). Off: such targets are 422 at
    /// create and refused again at send time after resolving.
    pub allow_private_targets: bool,
    /// Attempts per notification (the first included) before it is recorded as failed.
    pub max_attempts: u32,
    /// Delay before the second attempt; it doubles for each later one.
    pub retry_base_ms: u64,
    /// The longest `Retry-After` honoured (longer ones are cut to this; never above 300).
    pub max_retry_after_seconds: u64,
    /// Where incident integrations send (PagerDuty Events API v2).
    pub pagerduty_events_url: String,
    pub connect_timeout_seconds: u64,
    /// The whole request, connection included.
    pub request_timeout_seconds: u64,
    /// Notifications being sent at once, across all targets.
    pub max_in_flight: usize,
    /// Of those, at most this many for one project, so one whose targets hang (each holding
    /// its slot for `request_timeout_seconds`) leaves the rest to the others.
    pub max_in_flight_per_project: usize,
    /// And at most this many for one organization's projects together.
    pub max_in_flight_per_org: usize,
    /// Alert rules one project may have (422 past it).
    pub max_rules_per_project: usize,
    /// Integrations one rule may notify (422 past it; at most 100).
    pub max_integrations_per_rule: usize,
    /// Static host entries consulted before DNS (like `/etc/hosts`); their addresses are
    /// vetted like any DNS answer.
    pub hosts: std::collections::BTreeMap<String, std::net::IpAddr>,
    /// How often the evaluators look at their due timers.
    pub tick_ms: u64,
    /// Bytes of log batches waiting for the evaluators, across projects; past it a batch is
    /// not seen by the log rules (counted as `fleetops_alert_log_batches_dropped`).
    pub max_log_bytes_in_flight: usize,
    /// Days of heartbeat metrics kept for backtests.
    pub history_days: u64,
    /// Days a resolved alert (with its notifications) is kept after it resolved; 0 keeps them
    /// for good. A firing alert, or one with a notification still owed, is always kept.
    pub retention_days: u64,
    /// At most one heartbeat per device per this many seconds is kept for backtests (so the
    /// history holds at most `history_days * 86400 / history_resolution_seconds` samples per
    /// device); a backtest sees gaps and changes no finer than this.
    pub history_resolution_seconds: u64,
    /// An alert names the deployment last activated for its device when it fires within
    /// this many seconds of the activation.
    pub correlation_window_seconds: i64,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            allow_private_targets: false,
            max_attempts: 3,
            retry_base_ms: 1_000,
            max_retry_after_seconds: 300,
            pagerduty_events_url: "https://events.pagerduty.com/v2/enqueue".into(),
            connect_timeout_seconds: 5,
            request_timeout_seconds: 10,
            max_in_flight: 64,
            max_in_flight_per_project: 8,
            max_in_flight_per_org: 16,
            max_rules_per_project: 500,
            max_integrations_per_rule: 20,
            hosts: std::collections::BTreeMap::new(),
            tick_ms: 250,
            max_log_bytes_in_flight: 64 * 1024 * 1024,
            history_days: 7,
            retention_days: 90,
            history_resolution_seconds: 10,
            correlation_window_seconds: 3600,
        }
    }
}

/// `[smtp]`: the server e-mail integrations send through.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// Empty: e-mail integrations can be created but their sends fail with a clear reason.
    pub host: String,
    pub port: u16,
    pub from: String,
    /// With a username, TLS is required (STARTTLS); without, STARTTLS is used when offered.
    pub username: String,
    /// TLS from the first byte (SMTPS, usually port 465) instead of STARTTLS.
    pub implicit_tls: bool,
    pub password: String,
    pub timeout_seconds: u64,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        Self {
            host: String::new(),
            port: 25,
            from: "fleetops@localhost".into(),
            username: String::new(),
            implicit_tls: false,
            password: String::new(),
            timeout_seconds: 10,
        }
    }
}

/// Everything the runtime needs, assembled by the binary from `config.toml` and env.
#[derive(Debug, Clone, Default)]
pub struct RuntimeConfig {
    pub supervision: SupervisionConfig,
    pub devices: DevicesConfig,
    pub sessions: SessionsConfig,
    pub logs: LogsConfig,
    /// Below this many free bytes on the data directory, writes are refused (507; 0: never).
    pub min_free_bytes: u64,
    pub auth: AuthConfig,
    /// Tier names that exist (from `[tiers.*]`), for validating organization tiers.
    pub tiers: Vec<String>,
    /// Storage limit (bytes) per tier name.
    pub quotas: std::collections::HashMap<String, u64>,
    pub pipeline: PipelineConfig,
    pub scm: ScmConfig,
    pub runs: RunsConfig,
    pub alerts: AlertsConfig,
    pub smtp: SmtpConfig,
    pub secrets: SecretsConfig,
    pub bus: crate::bus::BusConfig,
    /// Streamed uploads at once, and at most how many for one organization (from `[http]`).
    pub uploads: (usize, usize),
    /// Base of the links handed out; empty until the server knows its address.
    pub public_url: String,
    /// Where temporary copies (capsules being checked) go: inside the data directory, not a
    /// possibly small system temp file system. `None`: the system's.
    pub tmp_dir: Option<std::path::PathBuf>,
}
