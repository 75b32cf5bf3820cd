//! The parts of `config.toml` the edge reads.

use std::net::IpAddr;

use serde::Deserialize;

/// `[http]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Largest ordinary JSON body (413 beyond).
    pub max_body_bytes: usize,
    /// Peers whose `X-Forwarded-For` is believed (for the login limiter).
    pub trusted_proxies: Vec<IpAddr>,
    /// Login attempts per client per minute (an IPv6 client counted by its /64).
    pub login_per_minute: u32,
    /// Login attempts per account per minute, from any address (each costs a password
    /// hash); past it 429, for unknown accounts alike.
    pub login_per_account_per_minute: u32,
    /// When set, `/metrics` needs `Authorization: Bearer <token>`.
    pub metrics_token: String,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace_seconds: u64,
    /// A client must send a request's whole header within this, and an idle keep-alive
    /// connection is closed after waiting this long for the next request (HTTP/1).
    pub header_read_timeout_seconds: u64,
    /// A buffered body (JSON, a webhook delivery) must arrive whole within this (408 past
    /// it); a streamed upload may pause at most this long between two pieces.
    pub body_timeout_seconds: u64,
    /// A connection with no request in flight for this long is closed (HTTP/2, whose pings
    /// alone would keep it open forever; idle HTTP/1 meets the header timeout first).
    pub idle_timeout_seconds: u64,
    /// Connections served at once; past it new connections wait in the accept backlog.
    pub max_connections: usize,
    /// Connections open at once from one client (an IPv6 client counted by its /64); past
    /// it a new one is closed at once. Peers in `trusted_proxies` are not counted.
    pub max_connections_per_address: usize,
    /// Bytes of request bodies all connections together may hold in memory (503 with
    /// `Retry-After` past it): buffered bodies as their bytes arrive, and each streamed
    /// upload's write buffer (1 MiB, or 5 MiB on S3, times three) while it runs.
    pub body_budget_bytes: usize,
    /// A streamed upload (artifacts, capsules, configurations) must bring at least this many
    /// bytes a second, averaged over each `body_timeout_seconds`; a slower one is ended
    /// (408). 0: no floor.
    pub min_upload_bytes_per_second: u64,
    /// Streamed uploads running at once (503 with `Retry-After` past it), of which at most
    /// `max_streamed_uploads_per_org` for one organization.
    pub max_streamed_uploads: usize,
    pub max_streamed_uploads_per_org: usize,
    /// Buffered bodies over 1 MiB (or of no declared length) read at once; the others wait,
    /// reading nothing, within their body deadline.
    pub max_large_bodies: usize,
    /// Bytes per second all large bodies on routes that take no credential (the webhook
    /// intake) are read at together, 0 for no pace: a flood of unsigned bodies costs at most
    /// this much reading and hashing, whatever its senders push.
    pub unauthenticated_body_bytes_per_second: u64,
    /// Requests in flight from one client address on the routes that take no credential
    /// (the webhook intake, login, health, metrics, signed links); 503 with `Retry-After`
    /// past it.
    pub max_unauthenticated_per_address: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            trusted_proxies: Vec::new(),
            login_per_minute: 10,
            login_per_account_per_minute: 20,
            metrics_token: String::new(),
            shutdown_grace_seconds: 10,
            header_read_timeout_seconds: 10,
            body_timeout_seconds: 60,
            idle_timeout_seconds: 60,
            max_connections: 4096,
            max_connections_per_address: 1024,
            body_budget_bytes: 256 * 1024 * 1024,
            min_upload_bytes_per_second: 1024,
            max_streamed_uploads: 64,
            max_streamed_uploads_per_org: 16,
            max_large_bodies: 8,
            unauthenticated_body_bytes_per_second: 64 * 1024 * 1024,
            max_unauthenticated_per_address: 512,
        }
    }
}

/// One rate-limit and storage tier.
#[derive(Debug, Clone, PartialEq)]
pub struct Tier {
    pub name: String,
    pub requests_per_minute: u32,
    pub storage_bytes: u64,
}
