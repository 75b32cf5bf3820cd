//! The accept loop: HTTP/1.1 and HTTP/2 with upgrade support (WebSockets), graceful shutdown,
//! and the per-request path from route to handler to response, with metrics and a catch for
//! handler panics so that no request is left without an answer.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::FutureExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::app::{App, Cx, Req};
use crate::config::{HttpConfig, Tier};
use crate::error::ApiError;
use crate::handlers;
use crate::metrics::Metrics;
use crate::rate_limit::RateLimits;
use crate::response::Body;
use crate::router::{Resolved, Router, routes};
use bytes::Bytes;
use fleetops_actors::Runtime;

/// The shared state is built here, where the route table, the handlers and the OpenAPI
/// document generated from them come together (`app` knows none of them).
impl App {
    pub fn new(rt: Runtime, cfg: HttpConfig, tiers: Vec<Tier>) -> anyhow::Result<Self> {
        let defs = routes();
        let router = Router::new(&defs, &crate::router::pages())?;
        let openapi = Bytes::from(serde_json::to_vec(&crate::openapi::document(
            &defs,
            &tiers.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        ))?);
        let mut metrics = Metrics::new();
        metrics.register_timings(
            "storage_flush_seconds",
            "How long each group-commit fsync took (every 201/202 waits for one)",
            rt.flush_timings(),
        );
        Ok(Self {
            limits: RateLimits::new(
                &tiers,
                cfg.login_per_minute,
                cfg.login_per_account_per_minute,
            ),
            rt,
            tiers,
            metrics,
            router,
            openapi,
            closing: tokio_util::sync::CancellationToken::new(),
            edge: Arc::new(crate::edge::Edge::new(&cfg)),
            unauthenticated: defs
                .iter()
                .filter(|d| {
                    matches!(
                        d.security,
                        crate::router::Security::None | crate::router::Security::Enrollment
                    )
                })
                .map(|d| d.op)
                .collect(),
            cfg,
        })
    }
}

/// Serves until `shutdown` resolves, then stops accepting and waits (up to the configured
/// grace) for in-flight requests.
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    // Every connection's task, so shutdown can wait for them (each closes gracefully when
    // `app.closing` fires).
    let tracker = tokio_util::task::TaskTracker::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Without a timer hyper's header-read timeout is off: a client sending its header one
    // byte at a time would hold its connection forever.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(
            app.cfg.header_read_timeout_seconds.max(1),
        ));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .keep_alive_interval(Duration::from_secs(
            app.cfg.header_read_timeout_seconds.max(1),
        ))
        .keep_alive_timeout(Duration::from_secs(
            app.cfg.header_read_timeout_seconds.max(1),
        ));
    tokio::pin!(shutdown);
    loop {
        // A connection slot first: past the ceiling, new connections wait in the kernel's
        // accept backlog instead of each taking memory here.
        let slot = match app.edge.connections.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                app.edge.connection_waits.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    p = app.edge.connections.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = &mut shutdown => break,
                }
            }
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // One client holds at most its share of the connections: past it, closed at
                // once (before any byte is read), its slot given back.
                let crate::edge::Admission::Admitted(address) =
                    app.edge.connection_from(peer.ip())
                else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let edge = app.edge.clone();
                let header_timeout =
                    Duration::from_secs(app.cfg.header_read_timeout_seconds.max(1));
                let app = app.clone();
                let closing = app.closing.clone();
                // Shared with the requests, so a WebSocket keeps the connection's slot after
                // the upgrade ends the HTTP connection.
                let slot = crate::edge::ConnSlot(Arc::new(crate::edge::SlotHold::new(
                    slot,
                    address,
                    edge.clone(),
                )));
                let conn_slot = slot.clone();
                let activity = Arc::new(crate::edge::Activity::default());
                let seen = activity.clone();
                let svc = service_fn(move |mut req: Request<Incoming>| {
                    let app = app.clone();
                    let in_flight = seen.start();
                    req.extensions_mut().insert(conn_slot.clone());
                    // Timed here, around the handler: HTTP/2 runs each stream's handler in a
                    // task of its own, apart from the connection's.
                    let polls = app.metrics.polls.clone();
                    crate::edge::PollTimed::new(
                        async move {
                            let resp = handle(&app, req, peer).await;
                            Ok::<_, Infallible>(
                                resp.map(|b| crate::edge::Tracked::wrap(b, in_flight)),
                            )
                        },
                        polls,
                    )
                });
                let builder = builder.clone();
                tracker.spawn(async move {
                    // hyper's header timer starts only once the protocol is known (hyper-util
                    // reads the opening bytes first, with no timer): until they arrive, this
                    // deadline holds the socket, so a silent client costs one timeout.
                    // Shutdown does not wait for a client that has sent nothing yet.
                    let opening = tokio::select! {
                        biased;
                        o = opening_within(&stream, header_timeout) => o,
                        _ = closing.cancelled() => return,
                    };
                    let Some(h2) = opening else {
                        edge.header_timeouts.fetch_add(1, Ordering::Relaxed);
                        drop(slot);
                        return;
                    };
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .into_owned();
                    tokio::pin!(conn);
                    let mut closing_sent = false;
                    let result = loop {
                        tokio::select! {
                            r = conn.as_mut() => break r,
                            _ = closing.cancelled(), if !closing_sent => {
                                conn.as_mut().graceful_shutdown();
                                closing_sent = true;
                            }
                            // Nothing in flight for the idle limit: close (an HTTP/2 peer
                            // that answers pings would otherwise hold it forever).
                            _ = activity.idle_for(edge.idle_timeout), if !closing_sent => {
                                edge.idle_closes.fetch_add(1, Ordering::Relaxed);
                                conn.as_mut().graceful_shutdown();
                                closing_sent = true;
                            }
                        }
                    };
                    if let Err(e) = result
                        && e
                            .downcast_ref::<hyper::Error>()
                            .is_some_and(hyper::Error::is_timeout)
                    {
                        let counter = if h2 {
                            &edge.keepalive_timeouts
                        } else {
                            &edge.header_timeouts
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(slot);
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    app.closing.cancel();
    let grace = Duration::from_secs(app.cfg.shutdown_grace_seconds);
    tracker.close();
    tokio::select! {
        _ = tracker.wait() => {}
        _ = tokio::time::sleep(grace) => {
            tracing::warn!("in-flight requests did not finish within the shutdown grace period");
        }
    }
}

/// The HTTP/2 connection preface, which hyper-util reads whole before choosing a protocol.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the client sends the opening of its first request within `limit`: any first bytes
/// for HTTP/1 (hyper's own header timer takes over from there), the whole 24-byte preface
/// for HTTP/2. `Some(true)` for HTTP/2.
async fn opening_within(stream: &tokio::net::TcpStream, limit: Duration) -> Option<bool> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 24];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => n,
        };
        let seen = buf.get(..n).unwrap_or_default();
        if !H2_PREFACE.starts_with(seen) {
            return Some(false);
        }
        if n == H2_PREFACE.len() {
            return Some(true);
        }
        // A partial preface: look again shortly (peek returns at once while bytes wait).
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One request: route, handler, envelope, rate-limit headers, metrics.
pub async fn handle(app: &App, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    let start = Instant::now();
    let method = req.method().clone();
    let (parts, body) = req.into_parts();
    if crate::console::owns(parts.uri.path()) {
        // As for the API: a panic in a page is a 500, not a dropped connection.
        let resp = AssertUnwindSafe(crate::console::handle(app, parts, body, peer))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                tracing::error!("a console page panicked");
                ApiError::Domain(fleetops_actors::Error::Internal(
                    "console page panicked".into(),
                ))
                .into_response()
            });
        app.metrics.observe(
            "console",
            &method,
            resp.status().as_u16(),
            start.elapsed().as_secs_f64(),
        );
        return resp;
    }
    let resolved = app.router.resolve(&method, parts.uri.path());
    let (route, resp) = match resolved {
        Resolved::Found(op, template, params) => {
            let mut cx = Cx {
                app,
                rate: None,
                writes_disk: crate::router::writes_disk(&method, op),
            };
            let fut = async {
                let req = Req::new(parts, body, params, peer, app.edge.clone())?;
                // Held for the whole request on the routes that take no credential; behind a
                // trusted proxy, per forwarded client.
                let _slot = if app.unauthenticated.contains(&op) {
                    Some(
                        app.edge
                            .per_address(req.client_ip(&app.cfg.trusted_proxies))?,
                    )
                } else {
                    None
                };
                // Routes with no credential to check (the webhook intake, signed uploads)
                // meet the disk's floor before they read a body.
                if app.unauthenticated.contains(&op) {
                    cx.disk_floor()?;
                }
                handlers::dispatch(op, &mut cx, req).await
            };
            let result = match AssertUnwindSafe(fut).catch_unwind().await {
                Ok(r) => r,
                Err(_) => Err(ApiError::Domain(fleetops_actors::Error::Internal(format!(
                    "handler of {op:?} panicked"
                )))),
            };
            let mut resp = result.unwrap_or_else(ApiError::into_response);
            if let Some(h) = cx.rate {
                h.apply(resp.headers_mut());
            }
            (template, resp)
        }
        Resolved::WrongMethod(allow) => (
            "unmatched",
            ApiError::MethodNotAllowed(allow).into_response(),
        ),
        Resolved::NotFound => ("unmatched", ApiError::NotFoundRoute.into_response()),
    };
    let status = resp.status().as_u16();
    let secs = start.elapsed().as_secs_f64();
    app.metrics.observe(route, &method, status, secs);
    tracing::debug!(%method, route, status, ms = secs * 1000.0, "request");
    resp
}
