//! Request bodies: the shared budget of buffered bytes, large bodies read a few at a time,
//! unauthenticated ones at their pace, deadlines, and streamed uploads' reservations and
//! idle limits.

use super::*;

/// Bodies past this declared size (or of no declared size) count under `max_large_bodies`.
pub(super) const LARGE_BODY: usize = 1024 * 1024;

/// How long a large body waits for a reader before it is turned away (503, retry).
pub(super) const LARGE_BODY_WAIT: Duration = Duration::from_secs(5);

/// How much of the pace may be used at once after a quiet spell, in KiB: a lone delivery's
/// first MiB is not held back.
pub(super) const PACE_BURST_KIB: u32 = 1024;

/// The piece a paced read waits for at a time, in KiB (hyper hands over up to about 400 KiB
/// a frame).
pub(super) const PACE_PIECE_KIB: u32 = 64;

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
    pub(super) fn add(slot: &mut Option<OwnedSemaphorePermit>, more: OwnedSemaphorePermit) {
        match slot {
            Some(p) => p.merge(more),
            None => *slot = Some(more),
        }
    }
}
/// A streamed upload's reservation: its place in the streams' share and in the body budget.
pub struct StreamHold {
    _share: OwnedSemaphorePermit,
    _budget: OwnedSemaphorePermit,
}

impl Edge {
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
    pub(super) async fn pace(&self, pace: &governor::DefaultDirectRateLimiter, kib: u64) {
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
