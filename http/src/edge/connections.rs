//! Connections: the ceiling and the per-address count (trusted proxies exempt), what is in
//! flight on a connection (for the idle close), and handlers' polls timed.

use super::*;

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

impl Edge {
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
}
