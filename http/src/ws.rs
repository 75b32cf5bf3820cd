//! The live log stream over WebSocket: authentication (header or `?token=`) and every check
//! before the upgrade, so a refusal is a plain HTTP 401/403/404; then replay, the filtered
//! feed, `lagged` when this subscriber fell behind, `session_ended` and close 1000; pings
//! every `ping_interval_seconds`; close 1001 on shutdown.

use std::time::Duration;

use bytes::Bytes;
use fleetops_actors::live::{LiveEvent, Subscription, ended_frame, lagged_frame, matching_frames};
use fleetops_actors::logs::LogFilter;
use fleetops_actors::{Role, SessionsHandle};
use futures::{SinkExt, StreamExt};
use http::{HeaderValue, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role as WsRole};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use crate::app::{Cx, Req};
use crate::error::{ApiError, ApiResult};
use crate::handlers::sessions::{log_filter, session_id};
use crate::response::{Body, empty};

/// Most entries a subscriber may ask to be replayed.
pub(crate) const MAX_REPLAY: u64 = 10_000;

pub async fn live_logs(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    // Credentials: header first, else `?token=` (browsers cannot set headers on WebSockets),
    // else the console's session cookie, taken only from a page of this origin (a browser
    // names the page's origin on every handshake; a cookie is never a credential for a
    // handshake from elsewhere).
    let token = req.query.get("token").map(str::to_string);
    let cookie = crate::console::cookie::token(req.header("cookie"))
        .filter(|_| crate::console::same_origin(cx.app, &req))
        .map(str::to_string);
    let cred = req.credential().map(str::to_string).or(token).or(cookie);
    let org = req.param("org").to_string();
    let p = cx.authenticate_with(cred.as_deref(), Some(&org)).await?;
    let s = cx
        .rt()
        .access
        .project(&p, &org, req.param("project"), Role::Viewer)?;
    let id = session_id(&req)?;
    let replay = req.query.u64("replay")?.unwrap_or(0);
    if replay > MAX_REPLAY {
        return Err(ApiError::unprocessable(format!(
            "replay: at most {MAX_REPLAY}"
        )));
    }
    let filter = LogFilter {
        search: None,
        since: None,
        until: None,
        ..log_filter(&req)?
    };
    let key = handshake_key(&req)?;
    let sub = cx
        .rt()
        .sessions
        .subscribe(s.project.id, id, replay as usize, filter.clone())
        .await?;
    // The connection's slot under the ceiling goes with the WebSocket.
    let slot = req.parts.extensions.remove::<crate::edge::ConnSlot>();
    let on_upgrade = req
        .parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| ApiError::bad_request("This connection cannot be upgraded"))?;

    let sessions = cx.rt().sessions.clone();
    let closing = cx.app.closing.clone();
    let ping = Duration::from_secs(cx.rt().sessions.config().ping_interval_seconds.max(1));
    tokio::spawn(async move {
        let _slot = slot;
        match on_upgrade.await {
            Ok(upgraded) => {
                // Subscribers send nothing large (pongs and a close): small incoming limits; the
                // outgoing buffer is bounded too (it only grows while writes fail).
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .max_message_size(Some(64 * 1024))
                    .max_frame_size(Some(16 * 1024))
                    .write_buffer_size(128 * 1024)
                    .max_write_buffer_size(4 * 1024 * 1024);
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    WsRole::Server,
                    Some(config),
                )
                .await;
                pump(ws, sub, filter, sessions, id, ping, closing).await;
            }
            Err(e) => tracing::debug!(error = %e, "WebSocket upgrade failed"),
        }
    });

    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert("sec-websocket-accept", v);
    }
    Ok(r)
}

/// The client's `Sec-WebSocket-Key`, once the request is a handshake RFC 6455 accepts: an
/// `Upgrade: websocket` (else 400), version 13 (else 426 naming it), and a key that is the
/// base64 of 16 bytes (else 400).
fn handshake_key(req: &Req) -> ApiResult<String> {
    let upgrade = req.header("upgrade").is_some_and(|u| {
        u.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
    });
    if !upgrade {
        return Err(ApiError::bad_request("Expected a WebSocket upgrade"));
    }
    if req.header("sec-websocket-version").map(str::trim) != Some("13") {
        return Err(ApiError::UpgradeRequired);
    }
    let key = req.header("sec-websocket-key").map(str::trim).unwrap_or("");
    use base64::Engine;
    match base64::engine::general_purpose::STANDARD.decode(key) {
        Ok(raw) if raw.len() == 16 => Ok(key.to_string()),
        _ => Err(ApiError::bad_request(
            "Sec-WebSocket-Key must be the base64 of 16 bytes",
        )),
    }
}

fn text(b: Bytes) -> Option<Message> {
    Utf8Bytes::try_from(b).ok().map(Message::Text)
}

fn close(code: CloseCode) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(""),
    }))
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Whether a write finished in time: a subscriber whose socket takes no bytes for this long
/// (it does not read) is dropped rather than held with its buffers.
async fn within<E>(
    limit: Duration,
    write: impl std::future::Future<Output = Result<(), E>>,
) -> bool {
    matches!(tokio::time::timeout(limit, write).await, Ok(Ok(())))
}

async fn pump(
    ws: Ws,
    sub: Subscription,
    filter: LogFilter,
    sessions: SessionsHandle,
    id: u64,
    ping_every: Duration,
    closing: tokio_util::sync::CancellationToken,
) {
    let (mut tx, mut rx) = ws.split();
    let stall = ping_every.saturating_mul(2);
    let mut sub = sub;
    let mut next = sub.next_seq;
    loop {
        // Frames are fed, then flushed once: one write per batch, not one per entry.
        for frame in std::mem::take(&mut sub.replay) {
            if let Some(m) = text(frame)
                && !within(stall, tx.feed(m)).await
            {
                return;
            }
        }
        if !within(stall, tx.flush()).await {
            return;
        }
        if let Some(status) = sub.ended {
            if let Some(m) = text(ended_frame(status)) {
                let _ = within(stall, tx.send(m)).await;
            }
            let _ = within(stall, tx.send(close(CloseCode::Normal))).await;
            return;
        }
        let Some(mut feed) = sub.feed.take() else {
            let _ = within(stall, tx.send(close(CloseCode::Normal))).await;
            return;
        };
        let mut ping = tokio::time::interval(ping_every);
        ping.tick().await;
        // Runs until the feed closes (the actor restarted) or the conversation ends.
        let resumed = loop {
            tokio::select! {
                ev = feed.recv() => match ev {
                    Some(LiveEvent::Batch(b)) => {
                        let end = b.end_seq();
                        if end <= next {
                            continue; // already sent (replayed after a resume)
                        }
                        if b.first_seq > next
                            && let Some(m) = text(lagged_frame(b.first_seq - next))
                            && !within(stall, tx.feed(m)).await
                        {
                            return;
                        }
                        for frame in matching_frames(&b, &filter) {
                            if let Some(m) = text(frame.clone())
                                && !within(stall, tx.feed(m)).await
                            {
                                return;
                            }
                        }
                        if !within(stall, tx.flush()).await {
                            return;
                        }
                        next = end;
                    }
                    Some(LiveEvent::Skipped(to)) => {
                        if to > next {
                            if let Some(m) = text(lagged_frame(to - next))
                                && !within(stall, tx.send(m)).await
                            {
                                return;
                            }
                            next = to;
                        }
                    }
                    Some(LiveEvent::Ended(status)) => {
                        if let Some(s) = status
                            && let Some(m) = text(ended_frame(s))
                        {
                            let _ = within(stall, tx.send(m)).await;
                        }
                        let _ = within(stall, tx.send(close(CloseCode::Normal))).await;
                        return;
                    }
                    // The actor is gone (restarted): resume from the next entry.
                    None => break true,
                },
                msg = rx.next() => match msg {
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                    // tungstenite queued the pong; flushing sends it.
                    Some(Ok(Message::Ping(_))) => {
                        if !within(stall, tx.flush()).await {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                },
                _ = ping.tick() => {
                    if !within(stall, tx.send(Message::Ping(Bytes::new()))).await {
                        return;
                    }
                }
                _ = closing.cancelled() => {
                    let _ = within(stall, tx.send(close(CloseCode::Away))).await;
                    return;
                }
            }
        };
        if !resumed {
            return;
        }
        // The session's actor restarted: pick up from the next entry.
        match sessions.resume(id, next, filter.clone()).await {
            Ok(s) => {
                // The replay covers every buffered entry from `next` up to here.
                next = next.max(s.next_seq);
                sub = s;
            }
            Err(_) => {
                let _ = within(stall, tx.send(close(CloseCode::Error))).await;
                return;
            }
        }
    }
}
