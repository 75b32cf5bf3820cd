//! Limits at the edge that no actor sees: how many connections are served at once, how long a
//! client may take to send its headers and its body, and how many bytes of buffered request
//! bodies all connections together may hold. Each limit counts when it is hit (`/metrics`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::HttpConfig;
use crate::error::{ApiError, ApiResult};

pub struct Edge {
    /// Request bodies in memory, in KiB: buffered bodies as their bytes arrive, and each
    /// streamed upload's write buffer for as long as it runs.
    body_budget: Arc<Semaphore>,
    budget_kib: u32,
    /// Bodies declared over `LARGE_BODY` read at once (`max_large_bodies`): a flood of big
    /// unsigned webhook bodies is read a few at a time, so the bytes it pushes do not crowd
    /// every other request off the async threads.
    large_readers: Arc<Semaphore>,
    /// The same for bodies read before the sender is known: their own readers, so a flood of
    /// unsigned deliveries never holds the readers an authenticated large batch needs.
    unauthenticated_readers: Arc<Semaphore>,
    /// The share of the body budget unauthenticated bodies may hold together (7/8, in KiB: 224
    /// of the default 256 MiB, so eight 25 MiB deliveries fit): the rest stays for
    /// authenticated bodies (four 8 MiB log batches at the default) whatever a flood holds.
    unauthenticated_budget: Arc<Semaphore>,
    unauthenticated_budget_kib: u32,
    /// The share of the body budget streamed uploads' write buffers may hold together (half,
    /// in KiB): slow uploads, which may hold theirs for long, never take what heartbeats,
    /// log batches and other buffered bodies need.
    stream_budget: Arc<Semaphore>,
    /// Large bodies turned away after `LARGE_BODY_WAIT` without a reader.
    pub large_body_waits: AtomicU64,
    /// The pace, in KiB, of large bodies on routes that take no credential (None: unpaced).
    unauthenticated_pace: Option<governor::DefaultDirectRateLimiter>,
    /// Times a large unauthenticated body waited for its pace.
    pub paced_waits: AtomicU64,
    pub body_timeout: Duration,
    /// A streamed upload must bring at least this many bytes a second of waiting for it (0:
    /// no floor); a slower one is ended (`[http] min_upload_bytes_per_second`).
    min_upload_rate: u64,
    /// Streamed uploads ended for being slower than that.
    pub slow_uploads: AtomicU64,
    pub connections: Arc<Semaphore>,
    pub header_timeouts: AtomicU64,
    /// HTTP/2 connections whose peer stopped answering pings.
    pub keepalive_timeouts: AtomicU64,
    /// Connections closed by `idle_timeout_seconds`.
    pub idle_closes: AtomicU64,
    pub idle_timeout: Duration,
    pub body_timeouts: AtomicU64,
    pub budget_refusals: AtomicU64,
    /// The most bytes of buffered bodies held at once since start-up (KiB).
    pub budget_peak_kib: AtomicU64,
    pub connection_waits: AtomicU64,
    pub connections_open: AtomicI64,
    /// Requests in flight per client address on routes that take no credential.
    per_address: Arc<dashmap::DashMap<std::net::IpAddr, usize>>,
    /// Connections open per client (an IPv6 client by its /64).
    conns_per_address: Arc<dashmap::DashMap<std::net::IpAddr, usize>>,
    max_conns_per_address: usize,
    /// Peers not counted per address (they carry many clients' connections).
    trusted_proxies: Vec<std::net::IpAddr>,
    /// Connections closed at once over `max_connections_per_address`.
    pub connection_refusals: AtomicU64,
    max_per_address: usize,
    pub per_address_refusals: AtomicU64,
}

impl Edge {
    pub fn new(cfg: &HttpConfig) -> Self {
        let large_readers = Arc::new(Semaphore::new(cfg.max_large_bodies.max(1)));
        let budget_kib = u32::try_from(cfg.body_budget_bytes / 1024)
            .unwrap_or(u32::MAX)
            .clamp(1, Semaphore::MAX_PERMITS as u32);
        let unauthenticated_pace = std::num::NonZeroU32::new(
            u32::try_from(cfg.unauthenticated_body_bytes_per_second.div_ceil(1024))
                .unwrap_or(u32::MAX),
        )
        .map(|kib| {
            governor::RateLimiter::direct(
                governor::Quota::per_second(kib)
                    .allow_burst(std::num::NonZeroU32::MIN.saturating_add(PACE_BURST_KIB - 1)),
            )
        });
        let unauthenticated_budget_kib = (budget_kib / 8 * 7).max(1);
        Self {
            body_budget: Arc::new(Semaphore::new(budget_kib as usize)),
            budget_kib,
            large_readers,
            unauthenticated_readers: Arc::new(Semaphore::new(cfg.max_large_bodies.max(1))),
            unauthenticated_budget: Arc::new(Semaphore::new(unauthenticated_budget_kib as usize)),
            unauthenticated_budget_kib,
            stream_budget: Arc::new(Semaphore::new((budget_kib / 2).max(1) as usize)),
            large_body_waits: AtomicU64::new(0),
            unauthenticated_pace,
            paced_waits: AtomicU64::new(0),
            body_timeout: Duration::from_secs(cfg.body_timeout_seconds.max(1)),
            min_upload_rate: cfg.min_upload_bytes_per_second,
            slow_uploads: AtomicU64::new(0),
            connections: Arc::new(Semaphore::new(cfg.max_connections.max(1))),
            header_timeouts: AtomicU64::new(0),
            keepalive_timeouts: AtomicU64::new(0),
            idle_closes: AtomicU64::new(0),
            idle_timeout: Duration::from_secs(cfg.idle_timeout_seconds.max(1)),
            body_timeouts: AtomicU64::new(0),
            budget_refusals: AtomicU64::new(0),
            budget_peak_kib: AtomicU64::new(0),
            connection_waits: AtomicU64::new(0),
            connections_open: AtomicI64::new(0),
            per_address: Arc::new(dashmap::DashMap::new()),
            conns_per_address: Arc::new(dashmap::DashMap::new()),
            max_conns_per_address: cfg.max_connections_per_address.max(1),
            trusted_proxies: cfg.trusted_proxies.clone(),
            connection_refusals: AtomicU64::new(0),
            max_per_address: cfg.max_unauthenticated_per_address.max(1),
            per_address_refusals: AtomicU64::new(0),
        }
    }
}

mod bodies;
mod connections;

pub use bodies::*;
pub use connections::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// A trusted proxy is not held to the per-address connection cap, also when it connects
    /// to a dual-stack listener and arrives IPv4-mapped; a client is.
    #[test]
    fn a_trusted_proxy_is_not_capped_even_ipv4_mapped() {
        let proxy: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        let cfg = HttpConfig {
            max_connections_per_address: 1,
            trusted_proxies: vec![proxy],
            ..HttpConfig::default()
        };
        let edge = Edge::new(&cfg);
        let mapped: std::net::IpAddr = "::ffff:10.0.0.5".parse().unwrap();
        let held: Vec<_> = (0..3)
            .map(|_| match edge.connection_from(mapped) {
                Admission::Admitted(slot) => slot,
                Admission::Refused => panic!("the proxy was capped"),
            })
            .collect();
        assert!(held.iter().all(Option::is_none));
        let client: std::net::IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        let first = edge.connection_from(client);
        assert!(matches!(first, Admission::Admitted(Some(_))));
        assert!(matches!(edge.connection_from(client), Admission::Refused));
    }
}
