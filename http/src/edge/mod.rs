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

/// Whether a new connection is served: with its place in its client's share (none for a
/// trusted proxy), or refused.
pub enum Admission {
    Admitted(Option<AddressSlot>),
    Refused,
}

/// One request counted against its address; released when dropped.
pub struct AddressSlot {
    map: Arc<dashmap::DashMap<std::net::IpAddr, usize>>,
    ip: std::net::IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        self.map.remove_if_mut(&self.ip, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

/// A connection's place under `[http] max_connections`, held by the connection and by a
/// WebSocket it was upgraded to, released when the last of them ends.
#[derive(Clone)]
pub struct ConnSlot(#[allow(dead_code)] pub Arc<SlotHold>);

/// A connection's slot under `max_connections` and its place in the open-connections gauge,
/// both given back when the connection (or the WebSocket it became) ends.
pub struct SlotHold {
    _permit: OwnedSemaphorePermit,
    /// Its place in its client's share, when counted.
    _address: Option<AddressSlot>,
    edge: Arc<Edge>,
}

impl SlotHold {
    pub fn new(
        permit: OwnedSemaphorePermit,
        address: Option<AddressSlot>,
        edge: Arc<Edge>,
    ) -> Self {
        edge.connections_open.fetch_add(1, Ordering::Relaxed);
        Self {
            _permit: permit,
            _address: address,
            edge,
        }
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        self.edge.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Requests in flight on one connection, and when the last one ended: what the idle
/// watchdog reads. A request counts until its response body is done (a streamed export
/// keeps its connection busy).
pub struct Activity {
    in_flight: std::sync::atomic::AtomicUsize,
    last_ms: AtomicU64,
    born: tokio::time::Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            in_flight: Default::default(),
            last_ms: Default::default(),
            born: tokio::time::Instant::now(),
        }
    }
}

/// One request in flight on a connection.
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.last_ms
            .store(a.born.elapsed().as_millis() as u64, Ordering::Relaxed);
        a.in_flight.fetch_sub(1, Ordering::Release);
    }
}

impl Activity {
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        InFlight(self.clone())
    }

    /// Resolves once no request has been in flight for `limit`.
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            let wait = if self.in_flight.load(Ordering::Acquire) == 0 {
                let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
                let idle = self.born.elapsed().saturating_sub(last);
                if idle >= limit {
                    return;
                }
                limit - idle
            } else {
                limit
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// A response body that holds its request's place in the connection's activity until it
/// is done.
pub struct Tracked {
    inner: crate::response::Body,
    _in_flight: InFlight,
}

impl Tracked {
    pub fn wrap(inner: crate::response::Body, in_flight: InFlight) -> crate::response::Body {
        use http_body_util::BodyExt;
        Tracked {
            inner,
            _in_flight: in_flight,
        }
        .boxed_unsync()
    }
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Bodies past this declared size (or of no declared size) count under `max_large_bodies`.
const LARGE_BODY: usize = 1024 * 1024;

/// How long a large body waits for a reader before it is turned away (503, retry).
const LARGE_BODY_WAIT: Duration = Duration::from_secs(5);

/// How much of the pace may be used at once after a quiet spell, in KiB: a lone delivery's
/// first MiB is not held back.
const PACE_BURST_KIB: u32 = 1024;

/// The piece a paced read waits for at a time, in KiB (hyper hands over up to about 400 KiB
/// a frame).
const PACE_PIECE_KIB: u32 = 64;

/// Whether a body's reading counts against `unauthenticated_body_bytes_per_second`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The sender proved who it is before its body is read.
    Authenticated,
    /// The body is read before anything about the sender is known (the webhook intake).
    Unauthenticated,
}

/// A share of the body budget, given back when the body is dropped.
/// One permit per semaphore (the whole budget, and the unauthenticated share), grown by
/// merging as the body arrives.
#[derive(Default)]
pub struct BodyPermit {
    #[allow(dead_code)]
    budget: Option<OwnedSemaphorePermit>,
    #[allow(dead_code)]
    share: Option<OwnedSemaphorePermit>,
}

impl BodyPermit {
    fn add(slot: &mut Option<OwnedSemaphorePermit>, more: OwnedSemaphorePermit) {
        match slot {
            Some(p) => p.merge(more),
            None => *slot = Some(more),
        }
    }
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

    /// Counts a request from `ip` on a route that takes no credential; 503 with
    /// `Retry-After` when that address already has `max_unauthenticated_per_address` in
    /// flight (one address cannot take the whole budget or the connection ceiling).
    pub fn per_address(&self, ip: std::net::IpAddr) -> ApiResult<AddressSlot> {
        let ip = crate::rate_limit::client_key(ip);
        let mut n = self.per_address.entry(ip).or_insert(0);
        if *n >= self.max_per_address {
            drop(n);
            self.per_address_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::Domain(fleetops_actors::Error::Unavailable {
                retry_after_secs: 1,
            }));
        }
        *n += 1;
        drop(n);
        Ok(AddressSlot {
            map: self.per_address.clone(),
            ip,
        })
    }

    /// Counts a new connection from `peer` against its client's share
    /// (`max_connections_per_address`); `Refused` (counted) when that client already holds
    /// its share, and the connection should be closed. A trusted proxy is not counted.
    pub fn connection_from(&self, peer: std::net::IpAddr) -> Admission {
        // An IPv4 peer on a dual-stack listener arrives IPv4-mapped.
        if self.trusted_proxies.contains(&peer.to_canonical()) {
            return Admission::Admitted(None);
        }
        let ip = crate::rate_limit::client_key(peer);
        let mut n = self.conns_per_address.entry(ip).or_insert(0);
        if *n >= self.max_conns_per_address {
            drop(n);
            self.connection_refusals.fetch_add(1, Ordering::Relaxed);
            return Admission::Refused;
        }
        *n += 1;
        drop(n);
        Admission::Admitted(Some(AddressSlot {
            map: self.conns_per_address.clone(),
            ip,
        }))
    }

    /// Reads a body whole, at most `limit` bytes, reserving its bytes from the shared budget
    /// as they arrive (a client that declares a large body and sends nothing holds nothing);
    /// 503 with `Retry-After` when the budget runs out. One body holds at most the whole
    /// budget, so a single large body is always admitted when nothing else holds it. A large
    /// body read before its sender is known is read at the shared unauthenticated pace.
    pub async fn read_budgeted(
        &self,
        mut body: hyper::body::Incoming,
        limit: usize,
        declared: Option<usize>,
        pace: Pace,
    ) -> ApiResult<(Bytes, BodyPermit)> {
        use http_body_util::BodyExt;
        // Waiting here reads nothing (the sender is held back by TCP), and at most
        // `LARGE_BODY_WAIT`: past it, 503 with `Retry-After`, so senders that hold every
        // reader turn other large bodies away for a retry rather than into 408s. A body that
        // is empty or says it is small never waits.
        let large = match declared {
            Some(n) => n > LARGE_BODY,
            None => {
                use hyper::body::Body as _;
                !body.is_end_stream()
                    && body
                        .size_hint()
                        .upper()
                        .is_none_or(|n| n > LARGE_BODY as u64)
            }
        };
        let busy = || {
            ApiError::Domain(fleetops_actors::Error::Unavailable {
                retry_after_secs: 1,
            })
        };
        let readers = match pace {
            Pace::Authenticated => &self.large_readers,
            Pace::Unauthenticated => &self.unauthenticated_readers,
        };
        let unauthenticated = pace == Pace::Unauthenticated;
        let _reader = match large {
            true => match tokio::time::timeout(LARGE_BODY_WAIT, readers.acquire()).await {
                Ok(Ok(p)) => Some(p),
                _ => {
                    self.large_body_waits.fetch_add(1, Ordering::Relaxed);
                    return Err(busy());
                }
            },
            false => None,
        };
        let pace = match (large, pace) {
            (true, Pace::Unauthenticated) => self.unauthenticated_pace.as_ref(),
            _ => None,
        };
        let mut permits = BodyPermit::default();
        let mut reserved_kib: u32 = 0;
        let mut paced_kib: u64 = 0;
        // Sized from the declared length (pages are only touched as bytes arrive), so the
        // buffer does not double past what the budget counts.
        let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|_| ApiError::bad_request("Could not read the request body"))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if buf.len() + data.len() > limit {
                return Err(ApiError::too_large(format!(
                    "Request body exceeds the limit of {limit} bytes"
                )));
            }
            // The budget first, so bytes waiting on the pace are already counted.
            let len = buf.len() + data.len();
            let cap = match unauthenticated {
                true => self.unauthenticated_budget_kib,
                false => self.budget_kib,
            };
            let want = u32::try_from(len.div_ceil(1024))
                .unwrap_or(u32::MAX)
                .min(cap);
            if want > reserved_kib {
                let share = match unauthenticated {
                    true => self
                        .unauthenticated_budget
                        .clone()
                        .try_acquire_many_owned(want - reserved_kib)
                        .map(Some),
                    false => Ok(None),
                };
                match share.and_then(|share| {
                    self.body_budget
                        .clone()
                        .try_acquire_many_owned(want - reserved_kib)
                        .map(|p| (share, p))
                }) {
                    Ok((share, p)) => {
                        if let Some(share) = share {
                            BodyPermit::add(&mut permits.share, share);
                        }
                        BodyPermit::add(&mut permits.budget, p);
                        reserved_kib = want;
                        let held = self.budget_kib as usize - self.body_budget.available_permits();
                        self.budget_peak_kib
                            .fetch_max(held as u64, Ordering::Relaxed);
                    }
                    Err(_) => {
                        self.budget_refusals.fetch_add(1, Ordering::Relaxed);
                        return Err(ApiError::Domain(fleetops_actors::Error::Unavailable {
                            retry_after_secs: 1,
                        }));
                    }
                }
            }
            buf.extend_from_slice(&data);
            if let Some(pace) = pace {
                // Charged on the running total, so small frames do not round up each.
                let due = len.div_ceil(1024) as u64;
                self.pace(pace, due - paced_kib).await;
                paced_kib = due;
            }
        }
        Ok((buf.freeze(), permits))
    }

    /// Waits until `kib` more fit the pace; TCP holds the sender back meanwhile. Asked for in
    /// small pieces, so a reader with a large frame in hand is not starved by readers with
    /// small ones (a failed check reserves nothing).
    async fn pace(&self, pace: &governor::DefaultDirectRateLimiter, kib: u64) {
        let mut kib = u32::try_from(kib).unwrap_or(u32::MAX);
        while let Some(n) = std::num::NonZeroU32::new(kib.min(PACE_PIECE_KIB)) {
            if !matches!(pace.check_n(n), Ok(Ok(_))) {
                self.paced_waits.fetch_add(1, Ordering::Relaxed);
                // `n` never exceeds the burst, so this only waits.
                let _ = pace.until_n_ready(n).await;
            }
            kib -= n.get();
        }
    }

    /// Reads a whole body within the deadline (408 past it).
    pub async fn within_deadline<T>(
        &self,
        read: impl Future<Output = ApiResult<T>>,
    ) -> ApiResult<T> {
        match tokio::time::timeout(self.body_timeout, read).await {
            Ok(r) => r,
            Err(_) => {
                self.body_timeouts.fetch_add(1, Ordering::Relaxed);
                Err(ApiError::BodyTimeout)
            }
        }
    }

    /// Reserves `bytes` of the body budget for a streamed upload's write buffer, within the
    /// streams' share of it, held until the returned permits are dropped; 503 with
    /// `Retry-After` when either cannot hold it.
    pub fn reserve_stream(&self, bytes: usize) -> ApiResult<StreamHold> {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, (self.budget_kib / 2).max(1));
        let share = self.stream_budget.clone().try_acquire_many_owned(kib);
        let budget = self.body_budget.clone().try_acquire_many_owned(kib);
        match (share, budget) {
            (Ok(s), Ok(b)) => {
                let held = self.budget_kib as usize - self.body_budget.available_permits();
                self.budget_peak_kib
                    .fetch_max(held as u64, Ordering::Relaxed);
                Ok(StreamHold {
                    _share: s,
                    _budget: b,
                })
            }
            _ => {
                self.budget_refusals.fetch_add(1, Ordering::Relaxed);
                Err(ApiError::Domain(fleetops_actors::Error::Unavailable {
                    retry_after_secs: 1,
                }))
            }
        }
    }

    /// A streamed body whose sender may pause at most `body_timeout` between two pieces, and
    /// must bring at least `min_upload_bytes_per_second` on average over the time spent
    /// waiting for it, judged each time a `body_timeout` of waiting has passed (a large
    /// upload may take long as a whole, but never stalls or trickles for free; time the
    /// server spends writing is not the sender's). `reserve` bytes of the body budget are
    /// taken when the body is first read (so every check of the request comes first; 503
    /// through `ResourceBusy` when the budget cannot hold them) and given back when the
    /// stream ends or is dropped.
    pub fn idle_limited(
        self: &Arc<Self>,
        body: BoxStream<'static, std::io::Result<Bytes>>,
        reserve: Option<usize>,
    ) -> BoxStream<'static, std::io::Result<Bytes>> {
        struct Reading {
            body: BoxStream<'static, std::io::Result<Bytes>>,
            reserve: Option<usize>,
            _hold: Option<StreamHold>,
            /// Time spent waiting for the sender in this window, and the bytes it brought.
            waited: Duration,
            window_bytes: u64,
        }
        let edge = self.clone();
        let state = Reading {
            body,
            reserve,
            _hold: None,
            waited: Duration::ZERO,
            window_bytes: 0,
        };
        let rate = self.min_upload_rate;
        futures::stream::unfold(Some(state), move |state| {
            let edge = edge.clone();
            async move {
                let mut st = state?;
                let failed = |kind, msg: &'static str| {
                    Some((Err(std::io::Error::new(kind, msg)), None::<Reading>))
                };
                if let Some(bytes) = st.reserve.take() {
                    match edge.reserve_stream(bytes) {
                        Ok(p) => st._hold = Some(p),
                        Err(_) => {
                            return failed(
                                std::io::ErrorKind::ResourceBusy,
                                "the body budget is spent",
                            );
                        }
                    }
                }
                let asked = tokio::time::Instant::now();
                match tokio::time::timeout(edge.body_timeout, st.body.next()).await {
                    Ok(Some(Ok(piece))) => {
                        st.window_bytes += piece.len() as u64;
                        st.waited += asked.elapsed();
                        if st.waited >= edge.body_timeout {
                            let due = rate.saturating_mul(st.waited.as_secs());
                            if st.window_bytes < due {
                                edge.slow_uploads.fetch_add(1, Ordering::Relaxed);
                                return failed(
                                    std::io::ErrorKind::TimedOut,
                                    "the request body arrives slower than the minimum rate",
                                );
                            }
                            st.waited = Duration::ZERO;
                            st.window_bytes = 0;
                        }
                        Some((Ok(piece), Some(st)))
                    }
                    Ok(Some(Err(e))) => Some((Err(e), None)),
                    Ok(None) => None,
                    Err(_) => {
                        edge.body_timeouts.fetch_add(1, Ordering::Relaxed);
                        failed(std::io::ErrorKind::TimedOut, "the request body stalled")
                    }
                }
            }
        })
        .boxed()
    }
}

pin_project_lite::pin_project! {
    /// Times every poll of a future (a request's handler) into a histogram: what a blocking
    /// call on an async thread costs shows up as a long poll.
    pub struct PollTimed<F> {
        #[pin]
        inner: F,
        polls: Arc<crate::metrics::PollTimes>,
    }
}

impl<F> PollTimed<F> {
    pub fn new(inner: F, polls: Arc<crate::metrics::PollTimes>) -> Self {
        Self { inner, polls }
    }
}

impl<F: std::future::Future> std::future::Future for PollTimed<F> {
    type Output = F::Output;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        let started = std::time::Instant::now();
        let out = this.inner.poll(cx);
        this.polls.observe(started.elapsed());
        out
    }
}

/// A streamed upload's reservation: its place in the streams' share and in the body budget.
pub struct StreamHold {
    _share: OwnedSemaphorePermit,
    _budget: OwnedSemaphorePermit,
}

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
