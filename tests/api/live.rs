//! The live log stream over a real WebSocket: refusals before the upgrade, replay, order,
//! filters, lagged, session_ended and close 1000.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::common::*;
use crate::sessions::{device, session};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn ws_url(s: &Srv, sid: u64, query: &str) -> String {
    format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs{query}",
        s.base.replace("http://", "ws://")
    )
}

async fn connect(url: &str) -> Result<Ws, u16> {
    match tokio_tungstenite::connect_async(url).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.status(), 101);
            Ok(ws)
        }
        Err(WsError::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

/// The next text frame as JSON (pings skipped), within 5 s.
async fn next_json(ws: &mut Ws) -> Value {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("a frame within 5 s")
            .expect("stream open")
            .unwrap();
        match m {
            Message::Text(t) => return serde_json::from_str(&t).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn expect_close_1000(ws: &mut Ws) {
    let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match m {
        Message::Close(Some(f)) => assert_eq!(u16::from(f.code), 1000),
        other => panic!("expected close, got {other:?}"),
    }
}

async fn send_lines(s: &Srv, sid: u64, cred: &str, lines: &[(&str, &str, &str)]) {
    let batch: Vec<Value> = lines
        .iter()
        .map(|(level, module, msg)| json!({"level": level, "module": module, "message": msg}))
        .collect();
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            cred,
            Value::Array(batch),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
}

every_log_store!(refusals_happen_before_the_upgrade);
async fn refusals_happen_before_the_upgrade() {
    let s = start().await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    assert_eq!(connect(&ws_url(&s, sid, "")).await.err(), Some(401));
    assert_eq!(
        connect(&ws_url(&s, sid, "?token=fops_wrong")).await.err(),
        Some(401)
    );
    assert_eq!(
        connect(&ws_url(&s, 999_999, &format!("?token={}", s.key())))
            .await
            .err(),
        Some(404)
    );
    let outsider = s.user("out@x.io").await;
    assert_eq!(
        connect(&ws_url(&s, sid, &format!("?token={outsider}")))
            .await
            .err(),
        Some(403)
    );
    assert_eq!(
        connect(&ws_url(
            &s,
            sid,
            &format!("?token={}&replay=10001", s.key())
        ))
        .await
        .err(),
        Some(422)
    );
    // A plain GET (no upgrade) is 400 once everything else is fine.
    let r = s
        .get(
            &format!("/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs"),
            s.key(),
        )
        .await;
    r.assert_error(400);
}

/// Sends one handshake by hand and reads the status line and headers of the answer.
async fn raw_handshake(s: &Srv, sid: u64, headers: &[(&str, &str)]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut req = format!(
        "GET /api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs HTTP/1.1\r\n\
         Host: {addr}\r\nX-API-Key: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n",
        s.key()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed without a response");
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_string();
    let status = head[9..12].parse().unwrap();
    (status, head.to_ascii_lowercase())
}

every_log_store!(handshake_follows_rfc_6455);
async fn handshake_follows_rfc_6455() {
    let s = start().await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    let good_key = "dGhlIHNhbXBsZSBub25jZQ==";
    // An unsupported version: 426 naming the one spoken.
    for v in ["8", "14", ""] {
        let (status, head) = raw_handshake(
            &s,
            sid,
            &[
                ("Sec-WebSocket-Version", v),
                ("Sec-WebSocket-Key", good_key),
            ],
        )
        .await;
        assert_eq!(status, 426, "version {v:?}: {head}");
        assert!(head.contains("sec-websocket-version: 13\r\n"), "{head}");
    }
    let (status, _) = raw_handshake(&s, sid, &[("Sec-WebSocket-Key", good_key)]).await;
    assert_eq!(status, 426);
    // A missing key, or one that is not the base64 of 16 bytes: 400.
    for key in [
        None,
        Some("not base64!"),
        Some("dGhlIHNhbXBsZQ=="),
        Some(""),
    ] {
        let mut h = vec![("Sec-WebSocket-Version", "13")];
        if let Some(k) = key {
            h.push(("Sec-WebSocket-Key", k));
        }
        let (status, head) = raw_handshake(&s, sid, &h).await;
        assert_eq!(status, 400, "key {key:?}: {head}");
    }
    // The RFC's own example is accepted, with its accept value.
    let (status, head) = raw_handshake(
        &s,
        sid,
        &[
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", good_key),
        ],
    )
    .await;
    assert_eq!(status, 101, "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
        "{head}"
    );
}

every_log_store!(replay_live_order_filters_and_session_ended);
async fn replay_live_order_filters_and_session_ended() {
    let s = start().await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    send_lines(
        &s,
        sid,
        &tok,
        &[
            ("info", "a", "one"),
            ("warn", "b", "two"),
            ("error", "a", "three"),
        ],
    )
    .await;

    // Header auth, replay of the last 2.
    let mut req = ws_url(&s, sid, "?replay=2").into_client_request().unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.key()).parse().unwrap(),
    );
    let (mut all, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    // Token auth, a level filter and a module filter.
    let mut warn_a = connect(&ws_url(
        &s,
        sid,
        &format!("?token={}&replay=10&level=warn,error&module=a", s.key()),
    ))
    .await
    .unwrap();

    let f = next_json(&mut all).await;
    assert_eq!(f["type"], "log");
    assert_eq!(f["message"], "two");
    assert_eq!(f["level"], "WARN");
    assert_eq!(f["module"], "b");
    assert!(f["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(f["metadata"], json!({}));
    assert_eq!(next_json(&mut all).await["message"], "three");
    assert_eq!(next_json(&mut warn_a).await["message"], "three");

    send_lines(
        &s,
        sid,
        &tok,
        &[("info", "a", "four"), ("error", "a", "five")],
    )
    .await;
    send_lines(&s, sid, &tok, &[("debug", "c", "six")]).await;
    for want in ["four", "five", "six"] {
        assert_eq!(next_json(&mut all).await["message"], want);
    }
    assert_eq!(next_json(&mut warn_a).await["message"], "five");

    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/complete"),
            &tok,
            json!({"status": "failed"}),
        )
        .await;
    assert_eq!(r.status, 200);
    for ws in [&mut all, &mut warn_a] {
        let f = next_json(ws).await;
        assert_eq!(f, json!({"type": "session_ended", "status": "failed"}));
        expect_close_1000(ws).await;
    }

    // A session that is no longer active: replay, session_ended, close.
    let mut late = connect(&ws_url(&s, sid, &format!("?token={}&replay=2", s.key())))
        .await
        .unwrap();
    assert_eq!(next_json(&mut late).await["message"], "five");
    assert_eq!(next_json(&mut late).await["message"], "six");
    assert_eq!(
        next_json(&mut late).await,
        json!({"type": "session_ended", "status": "failed"})
    );
    expect_close_1000(&mut late).await;
}

every_log_store!(a_stalled_subscriber_gets_lagged_and_slows_nobody);
async fn a_stalled_subscriber_gets_lagged_and_slows_nobody() {
    let s = start_with(|c| c.sessions.subscriber_queue = 2).await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    let mut stalled = connect(&ws_url(&s, sid, &format!("?token={}", s.key())))
        .await
        .unwrap();
    let mut healthy = connect(&ws_url(&s, sid, &format!("?token={}", s.key())))
        .await
        .unwrap();
    // 50 batches of 200 lines of 2 KB (20 MB, more than socket buffers hold), each 202 at
    // once, while `stalled` reads nothing.
    let big = "x".repeat(2000);
    let started = std::time::Instant::now();
    for b in 0..50 {
        let batch: Vec<Value> = (0..200)
            .map(|i| json!({"level": "info", "message": format!("{b}-{i} {big}")}))
            .collect();
        let r = s
            .post(
                &format!("{DEV}/sessions/{sid}/logs"),
                &tok,
                Value::Array(batch),
            )
            .await;
        assert_eq!(r.status, 202);
        // The healthy one keeps up.
        for i in 0..200 {
            assert_eq!(
                next_json(&mut healthy).await["message"],
                format!("{b}-{i} {big}")
            );
        }
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    // The stalled one, read at last: some log frames, then a lagged frame with a count.
    let mut dropped = 0;
    let mut logs = 0;
    while dropped == 0 {
        let f = next_json(&mut stalled).await;
        match f["type"].as_str().unwrap() {
            "log" => logs += 1,
            "lagged" => dropped = f["dropped"].as_u64().unwrap(),
            other => panic!("{other}"),
        }
    }
    assert!(
        dropped > 0 && logs + dropped as usize <= 10_000,
        "logs {logs} dropped {dropped}"
    );
    let _ = stalled.send(Message::Close(None)).await;
}

every_log_store!(
    subscribers_resume_after_the_session_actor_restarts,
    threads = 2
);
async fn subscribers_resume_after_the_session_actor_restarts() {
    let s = start().await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    send_lines(&s, sid, &tok, &[("info", "a", "before")]).await;
    let mut ws = connect(&ws_url(&s, sid, &format!("?token={}&replay=1", s.key())))
        .await
        .unwrap();
    assert_eq!(next_json(&mut ws).await["message"], "before");
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.sessions.inject_panic(sid).await.unwrap();
    assert!(eventually(5, || async { rt.restarts() >= 1 }).await);
    // The feed closed with the old actor; the subscriber resumes from the next entry and
    // sees every later line exactly once.
    send_lines(
        &s,
        sid,
        &tok,
        &[("info", "a", "after-1"), ("warn", "a", "after-2")],
    )
    .await;
    assert_eq!(next_json(&mut ws).await["message"], "after-1");
    assert_eq!(next_json(&mut ws).await["message"], "after-2");
    send_lines(&s, sid, &tok, &[("info", "a", "after-3")]).await;
    assert_eq!(next_json(&mut ws).await["message"], "after-3");
}

every_log_store!(a_stalled_subscriber_is_bounded_in_bytes);
/// The live queue is bounded in bytes too: with room for 256 batches but only 1 MiB, a
/// subscriber that reads nothing is skipped ahead, and `/metrics` counts the skipped batches.
async fn a_stalled_subscriber_is_bounded_in_bytes() {
    let s = start_with(|c| {
        c.sessions.subscriber_queue = 256;
        c.sessions.subscriber_queue_bytes = 1024 * 1024;
    })
    .await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    let mut stalled = connect(&ws_url(&s, sid, &format!("?token={}", s.key())))
        .await
        .unwrap();
    let big = "x".repeat(2000);
    for b in 0..40 {
        let batch: Vec<Value> = (0..200)
            .map(|i| json!({"level": "info", "message": format!("{b}-{i} {big}")}))
            .collect();
        let r = s
            .post(
                &format!("{DEV}/sessions/{sid}/logs"),
                &tok,
                Value::Array(batch),
            )
            .await;
        assert_eq!(r.status, 202);
    }
    let m = s
        .http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let skipped: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("fleetops_live_batches_skipped "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(skipped >= 1.0, "{skipped}");
    // Read until every entry is accounted for, read or told as dropped (one or more gaps).
    let (mut dropped, mut logs) = (0usize, 0usize);
    while logs + dropped < 8_000 {
        let f = next_json(&mut stalled).await;
        match f["type"].as_str().unwrap() {
            "log" => logs += 1,
            "lagged" => dropped += f["dropped"].as_u64().unwrap() as usize,
            other => panic!("{other}"),
        }
    }
    assert!(dropped > 0);
    assert_eq!(
        logs + dropped,
        8_000,
        "every entry read or counted as dropped once"
    );
}

every_log_store!(an_oversized_incoming_message_closes_the_socket);
/// Subscribers send nothing large: a 100 KB message ends the conversation.
async fn an_oversized_incoming_message_closes_the_socket() {
    let s = start().await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    let mut ws = connect(&ws_url(&s, sid, &format!("?token={}", s.key())))
        .await
        .unwrap();
    ws.send(Message::Text("y".repeat(100_000).into()))
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await;
    assert_eq!(end, Ok(true));
}

every_log_store!(websockets_count_against_the_connection_ceiling);
/// A WebSocket keeps its connection's place under `[http] max_connections`: with a ceiling of
/// 2 and two subscribers open, a third client waits until one leaves.
async fn websockets_count_against_the_connection_ceiling() {
    let s = start_with(|c| {
        c.http.max_connections = 2;
        c.http.header_read_timeout_seconds = 1;
    })
    .await;
    let (d, tok) = device(&s, "r").await;
    let sid = session(&s, d, &tok).await;
    let url = ws_url(&s, sid, &format!("?token={}", s.key()));
    // The setup's idle pooled connection is closed by the header timeout first.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut a = connect(&url).await.unwrap();
    // The upgraded socket still counts as an open connection, beside the scrape's own.
    assert_eq!(s.metric("fleetops_http_connections_open").await, 2.0);
    let b = connect(&url).await.unwrap();
    let fresh = reqwest::Client::new();
    let waited = tokio::time::timeout(
        Duration::from_millis(700),
        fresh.get(s.url("/healthz")).send(),
    )
    .await;
    assert!(waited.is_err(), "served past the ceiling");
    let _ = a.send(Message::Close(None)).await;
    drop(a);
    drop(b);
    let r = tokio::time::timeout(Duration::from_secs(5), fresh.get(s.url("/healthz")).send())
        .await
        .expect("served once a subscriber left")
        .unwrap();
    assert_eq!(r.status(), 200);
}
