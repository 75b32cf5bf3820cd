//! The edge under hostile clients, through the real server: slowloris connections closed by
//! the header timeout while normal requests go on, bodies that stall cut by the body
//! deadline, buffered bodies bounded by the shared budget, and the connection ceiling.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// The head of an unsigned `ping` delivery declaring `len` bytes of body.
fn webhook_head(len: usize) -> String {
    format!(
        "POST /api/v1/scm/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Host-Event: ping\r\nX-Host-Delivery: 0b4e6a2c-9d4f-4c53-9d7e-2a1f3c5b6d7e\r\nContent-Length: {len}\r\n\r\n"
    )
}

fn addr(s: &Srv) -> String {
    s.base.trim_start_matches("http://").to_string()
}

/// Reads until the server closes the connection (or `limit` passes); whether it closed.
async fn closed_within(c: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline.into(), c.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

each_backend!(slowloris_connections_are_closed_while_normal_requests_go_on);
async fn slowloris_connections_are_closed_while_normal_requests_go_on() {
    let s = start_with(|c| c.http.header_read_timeout_seconds = 1).await;
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut c = TcpStream::connect(addr(&s)).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(c);
    }
    // Normal requests meanwhile keep their latency.
    let started = Instant::now();
    for _ in 0..20 {
        let t = Instant::now();
        let r = s.get(&format!("{DEV}/devices"), s.key()).await;
        assert_eq!(r.status, 200);
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
    }
    // One byte now and then does not keep a connection: all closed after about 1 s.
    for c in &mut slow {
        let _ = c.write_all(b"a").await;
    }
    let mut closed = 0;
    for c in &mut slow {
        if closed_within(
            c,
            Duration::from_secs(4)
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(100)),
        )
        .await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 200);
    assert!(s.metric("fleetops_http_header_timeouts").await >= 200.0);
}

each_backend!(a_body_that_stalls_is_cut_with_408);
async fn a_body_that_stalls_is_cut_with_408() {
    let s = start_with(|c| c.http.body_timeout_seconds = 1).await;
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    let head = format!(
        "POST {DEV}/devices HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\":",
        s.key()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let t = Instant::now();
    let mut resp = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut resp)).await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"status_code\":408"), "{text}");
    assert!(t.elapsed() >= Duration::from_millis(900));
    assert!(s.metric("fleetops_http_body_timeouts").await >= 1.0);
    // Nothing half-written: no device was created.
    let r = s.get(&format!("{DEV}/devices"), s.key()).await;
    assert_eq!(r.body["total"], 0, "{}", r.body);
}

each_backend!(buffered_bodies_share_one_budget);
async fn buffered_bodies_share_one_budget() {
    let s = start_with(|c| {
        c.http.body_budget_bytes = 1024 * 1024;
        c.scm.webhook_secret = crate::webhooks::SECRET.into();
    })
    .await;
    // A client that declares a large body and sends nothing holds nothing...
    let mut idle = TcpStream::connect(addr(&s)).await.unwrap();
    idle.write_all(
        b"POST /api/v1/scm/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 921600\r\n\r\n{",
    )
    .await
    .unwrap();
    // ...but a delivery whose first 900 KiB arrived holds their share of the budget...
    let mut first = TcpStream::connect(addr(&s)).await.unwrap();
    first
        .write_all(
            b"POST /api/v1/scm/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 931600\r\n\r\n",
        )
        .await
        .unwrap();
    first.write_all(&vec![b' '; 921_600]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ...so a second one of the same size is refused at once, with Retry-After.
    let r = s
        .http
        .post(s.url("/api/v1/scm/webhooks"))
        .header("content-type", "application/json")
        .body(vec![b' '; 921_600])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["status_code"], 503);
    assert!(s.metric("fleetops_http_body_budget_refusals").await >= 1.0);
    // Small bodies still fit, and once the slow one is gone the large one is read (and
    // refused for its signature, as an unsigned delivery is).
    let r = s
        .post(
            &format!("{DEV}/devices"),
            s.key(),
            serde_json::json!({"name": "r1"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    drop(first);
    drop(idle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = s
        .http
        .post(s.url("/api/v1/scm/webhooks"))
        .header("content-type", "application/json")
        .header("X-Host-Event", "ping")
        .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
        .body(vec![b' '; 921_600])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // One body larger than the whole budget is still admitted when nothing else is held.
    let r = s
        .http
        .post(s.url("/api/v1/scm/webhooks"))
        .header("content-type", "application/json")
        .header("X-Host-Event", "ping")
        .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
        .body(vec![b' '; 3 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

each_backend!(past_the_connection_ceiling_new_connections_wait);
async fn past_the_connection_ceiling_new_connections_wait() {
    let s = start_with(|c| {
        c.http.max_connections = 1;
        c.http.header_read_timeout_seconds = 1;
    })
    .await;
    // The only slot, held by an idle connection.
    let mut idle = TcpStream::connect(addr(&s)).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let r = reqwest::Client::new()
        .get(s.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Served once the idle connection was closed by the header timeout.
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "{:?}",
        t.elapsed()
    );
    assert!(closed_within(&mut idle, Duration::from_secs(1)).await);
    assert!(s.metric("fleetops_http_connection_limit_waits").await >= 1.0);
}

each_backend!(one_address_holds_a_bounded_share_of_the_unauthenticated_routes);
async fn one_address_holds_a_bounded_share_of_the_unauthenticated_routes() {
    let s = start_with(|c| {
        c.http.max_unauthenticated_per_address = 2;
        c.scm.webhook_secret = crate::webhooks::SECRET.into();
    })
    .await;
    // Two deliveries whose bodies trickle in hold this address's two slots.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr(&s)).await.unwrap();
        c.write_all(
            b"POST /api/v1/scm/webhooks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = s.http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    // Authenticated routes are not counted per address.
    let r = s.get(&format!("{DEV}/devices"), s.key()).await;
    assert_eq!(r.status, 200);
    drop(held);
    assert!(
        eventually(5, || async {
            s.http.get(s.url("/healthz")).send().await.unwrap().status() == 200
        })
        .await
    );
    assert!(s.metric("fleetops_http_per_address_refusals").await >= 1.0);
}

each_backend!(silent_and_partial_preface_connections_are_closed);
/// A client that sends nothing, or only part of the HTTP/2 preface, is closed after the
/// header timeout too (hyper-util reads the opening bytes before hyper's timer starts).
async fn silent_and_partial_preface_connections_are_closed() {
    let s = start_with(|c| {
        c.http.header_read_timeout_seconds = 1;
        c.http.max_connections = 4;
    })
    .await;
    let mut silent = TcpStream::connect(addr(&s)).await.unwrap();
    let mut partial = TcpStream::connect(addr(&s)).await.unwrap();
    partial.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let t = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(4)).await);
    assert!(closed_within(&mut partial, Duration::from_secs(4)).await);
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    // Their slots are free again: normal requests are served.
    let r = s.http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// Reads one HTTP/2 frame: (type, flags, payload); `None` once the server closed.
async fn h2_frame(c: &mut TcpStream) -> Option<(u8, u8, Vec<u8>)> {
    let mut head = [0u8; 9];
    c.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    c.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], payload))
}

each_backend!(connections_with_nothing_in_flight_close_after_the_idle_limit);
/// An HTTP/2 client that answers every ping but sends no request is closed by the idle
/// limit (GOAWAY, then the socket), as is an idle HTTP/1 keep-alive connection; neither
/// counts as a header or ping timeout.
async fn connections_with_nothing_in_flight_close_after_the_idle_limit() {
    let s = start_with(|c| {
        c.http.header_read_timeout_seconds = 1;
        c.http.idle_timeout_seconds = 2;
    })
    .await;
    let mut h2 = TcpStream::connect(addr(&s)).await.unwrap();
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    h2.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap(); // SETTINGS, empty
    let t = Instant::now();
    let (mut pings, mut goaway) = (0, false);
    let closed = tokio::time::timeout(Duration::from_secs(8), async {
        while let Some((kind, flags, payload)) = h2_frame(&mut h2).await {
            match (kind, flags & 1) {
                (4, 0) => h2.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.unwrap(),
                (6, 0) => {
                    pings += 1;
                    let mut ack = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                    ack.extend_from_slice(&payload);
                    h2.write_all(&ack).await.unwrap();
                }
                (7, _) => goaway = true,
                _ => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the HTTP/2 connection was still open after 8 s"
    );
    assert!(goaway, "closed without GOAWAY");
    assert!(pings >= 1, "the server never pinged");
    assert!(
        t.elapsed() >= Duration::from_millis(1800),
        "{:?}",
        t.elapsed()
    );

    let mut h1 = TcpStream::connect(addr(&s)).await.unwrap();
    h1.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = h1.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    assert!(closed_within(&mut h1, Duration::from_secs(6)).await);
    assert!(s.metric("fleetops_http_idle_closes").await >= 1.0);
    assert_eq!(s.metric("fleetops_http_keepalive_timeouts").await, 0.0);
}

each_backend!(large_bodies_are_read_a_few_at_a_time);
/// Large buffered bodies are read `max_large_bodies` at a time: with a limit of one, a second
/// 2 MB delivery waits (reading nothing) while a stalled one holds the reader, and is read and
/// judged once the stalled one is cut by its deadline; small requests never wait.
async fn large_bodies_are_read_a_few_at_a_time() {
    let s = start_with(|c| {
        c.http.body_timeout_seconds = 3;
        c.http.max_large_bodies = 1;
        c.scm.webhook_secret = "s3cret".into();
    })
    .await;
    let mut stalled = TcpStream::connect(addr(&s)).await.unwrap();
    stalled
        .write_all(webhook_head(2_000_000).as_bytes())
        .await
        .unwrap();
    stalled.write_all(b"{\"zen\":").await.unwrap();
    // The waiting body's deadline runs while it waits: start it late enough to have time
    // left for its 2 MB once the stalled one is cut (3 s after it began).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let t = Instant::now();
    let waiting = tokio::spawn({
        let a = addr(&s);
        async move {
            let mut c = TcpStream::connect(a).await.unwrap();
            c.write_all(webhook_head(2_000_000).as_bytes())
                .await
                .unwrap();
            let _ = c.write_all(&vec![b' '; 2_000_000]).await;
            let mut buf = vec![0u8; 256];
            let n = c.read(&mut buf).await.unwrap_or(0);
            String::from_utf8_lossy(&buf[..n]).to_string()
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = s.http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        !waiting.is_finished(),
        "the second large body was read at once"
    );
    let answer = waiting.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        t.elapsed() >= Duration::from_millis(1200),
        "{:?}",
        t.elapsed()
    );
}

each_backend!(a_large_body_that_waits_too_long_for_a_reader_gets_503);
/// A large body that finds every reader held for 5 s is turned away with 503 and
/// `Retry-After` (the host retries), not left to run into its deadline.
async fn a_large_body_that_waits_too_long_for_a_reader_gets_503() {
    let s = start_with(|c| {
        c.http.body_timeout_seconds = 30;
        c.http.max_large_bodies = 1;
        c.scm.webhook_secret = "s3cret".into();
    })
    .await;
    let head = webhook_head(2_000_000);
    let mut stalled = TcpStream::connect(addr(&s)).await.unwrap();
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.write_all(b"{").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let mut second = TcpStream::connect(addr(&s)).await.unwrap();
    second.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), second.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(4500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s.metric("fleetops_http_large_body_refusals").await, 1.0);
    drop(stalled);
}

each_backend!(unauthenticated_large_bodies_are_read_at_their_pace);
/// Large bodies on the webhook intake are read at `unauthenticated_body_bytes_per_second`
/// (here 1 MiB/s): a correctly signed 3 MiB delivery is still accepted, after about two
/// seconds; an authenticated 3 MiB log batch is not paced.
async fn unauthenticated_large_bodies_are_read_at_their_pace() {
    let s = start_with(|c| {
        c.http.unauthenticated_body_bytes_per_second = 1 << 20;
        c.scm.webhook_secret = crate::webhooks::SECRET.into();
    })
    .await;
    let body = serde_json::to_vec(&serde_json::json!({"zen": "z".repeat(3 << 20)})).unwrap();
    let t = Instant::now();
    let r = s
        .raw(
            s.http
                .post(s.url("/api/v1/scm/webhooks"))
                .header("content-type", "application/json")
                .header("X-Host-Event", "ping")
                .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                .header(
                    "X-Hub-Signature-256",
                    crate::webhooks::sign(crate::webhooks::SECRET, &body),
                )
                .body(body),
        )
        .await;
    let paced = t.elapsed();
    assert_eq!(r.status, 202, "{}", r.body);
    // 1 MiB of burst, then 2 MiB at 1 MiB/s.
    assert!(paced >= Duration::from_millis(1700), "{paced:?}");
    let waits = s.metric("fleetops_http_unauthenticated_body_paced").await;
    assert!(waits >= 1.0, "{waits}");

    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    let line = serde_json::json!({"level": "info", "message": "m".repeat(1000)});
    let batch = serde_json::Value::Array(vec![line; 3_000]);
    let r = s
        .post(&format!("{DEV}/sessions/{sid}/logs"), &tok, batch)
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(
        s.metric("fleetops_http_unauthenticated_body_paced").await,
        waits,
        "an authenticated body was paced"
    );
}

each_backend!(a_flood_of_large_unsigned_deliveries_gets_401_or_503);
/// 64 concurrent unsigned 25 MiB deliveries on the shipped limits: every answer is 401 (read
/// at the pace, signature refused) or 503 with `Retry-After` (no reader within 5 s), never a
/// 408 or a 5xx of another kind; at least the eight readers' bodies are read whole and
/// counted in the budget; normal requests are served meanwhile. (A sender still writing when
/// its 503 comes may see the connection reset instead, as with any server that answers
/// before reading a body; resident memory under the flood: `cargo bench --bench hostile`.)
async fn a_flood_of_large_unsigned_deliveries_gets_401_or_503() {
    let s = start_with(|c| c.scm.webhook_secret = crate::webhooks::SECRET.into()).await;
    let body = bytes::Bytes::from(vec![b' '; 25 << 20]);
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (c, url, body) = (client.clone(), s.url("/api/v1/scm/webhooks"), body.clone());
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .header("content-type", "application/json")
                .header("X-Host-Event", "ping")
                .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                .header("X-Hub-Signature-256", format!("sha256={}", "0".repeat(64)))
                .body(body)
                .send()
                .await
                .map(|r| {
                    (
                        r.status().as_u16(),
                        r.headers()
                            .get("retry-after")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string),
                    )
                })
                .unwrap_or((0, None))
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..5 {
        let r = s.get(&format!("{DEV}/devices"), s.key()).await;
        assert_eq!(r.status, 200, "{}", r.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut by_status = std::collections::BTreeMap::new();
    for t in tasks {
        let (status, retry) = t.await.unwrap();
        if status == 503 {
            assert_eq!(retry.as_deref(), Some("1"));
        }
        *by_status.entry(status).or_insert(0) += 1;
    }
    assert!(
        by_status.keys().all(|k| [0, 401, 503].contains(k)),
        "{by_status:?}"
    );
    assert!(
        by_status.get(&401).is_some_and(|n| *n >= 8),
        "{by_status:?}"
    );
    let peak = s.metric("fleetops_http_body_budget_peak_bytes").await;
    assert!(peak >= (25 << 20) as f64, "{peak}");
}

/// An HTTP/1.1 connection from `from` (a loopback address of its own) that has made one
/// request and keeps the connection open; `None` when the server closed it at once.
async fn held_connection(s: &Srv, from: &str) -> Option<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut c = sock.connect(addr(s).parse().unwrap()).await.unwrap();
    if c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .is_err()
    {
        return None;
    }
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 && buf.starts_with(b"HTTP/1.1 200") => Some(c),
        _ => None,
    }
}

each_backend!(one_address_holds_at_most_its_share_of_connections);
/// One client holds at most `max_connections_per_address` connections: the next is closed at
/// once, while another address is served.
async fn one_address_holds_at_most_its_share_of_connections() {
    let s = start_with(|c| c.http.max_connections_per_address = 4).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(
            held_connection(&s, "127.0.0.1")
                .await
                .expect("within the share"),
        );
    }
    assert!(
        held_connection(&s, "127.0.0.1").await.is_none(),
        "the fifth from one address is closed"
    );
    assert!(
        held_connection(&s, "127.0.0.2").await.is_some(),
        "another address is served"
    );
    // A closed one gives its place back.
    drop(held.pop());
    let back = eventually(5, || async {
        held_connection(&s, "127.0.0.1").await.is_some()
    })
    .await;
    assert!(back, "the place came back");
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(s.metric("fleetops_http_connection_refusals").await >= 1.0);
}

/// The head of a chunked artifact upload of session `sid` with `token`.
fn upload_head(sid: u64, token: &str, path: &str) -> String {
    format!(
        "PUT {DEV}/sessions/{sid}/files/{path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
}

/// An upload of `a.bin` that has sent one byte and waits.
async fn hold_upload(s: &Srv, sid: u64, tok: &str) -> TcpStream {
    let mut held = TcpStream::connect(addr(s)).await.unwrap();
    held.write_all(upload_head(sid, tok, "a.bin").as_bytes())
        .await
        .unwrap();
    held.write_all(b"1\r\nx\r\n").await.unwrap();
    held
}

/// Holds an upload open and tries `second` until it is refused while the held upload is
/// still waiting; the held connection comes back. The two race for a place, so when the server
/// answered the held upload (the second took the place first), it is opened again.
async fn refused_beside_a_held_upload<F, Fut>(
    s: &Srv,
    sid: u64,
    tok: &str,
    mut second: F,
) -> Option<TcpStream>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // A loaded machine (the whole suite at once) can take seconds to read the held request.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held = hold_upload(s, sid, tok).await;
    while Instant::now() < deadline {
        if second().await {
            return Some(held);
        }
        if status_of(&mut held, Duration::from_millis(20))
            .await
            .is_some()
        {
            held = hold_upload(s, sid, tok).await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    None
}

/// The status line of the answer on `c`.
async fn status_of(c: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(within, c.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf[..n]).to_string();
    text.lines().next().map(str::to_string)
}

each_backend!(an_upload_slower_than_the_minimum_rate_is_ended_with_408);
/// A streamed upload that trickles (a byte at a time, well below the minimum rate) is ended
/// with 408, however long it keeps each pause under the body deadline.
async fn an_upload_slower_than_the_minimum_rate_is_ended_with_408() {
    let s = start_with(|c| {
        c.http.body_timeout_seconds = 1;
        c.http.min_upload_bytes_per_second = 1_000;
    })
    .await;
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(upload_head(sid, &tok, "slow.bin").as_bytes())
        .await
        .unwrap();
    let started = Instant::now();
    let mut answered = None;
    for _ in 0..20 {
        // One byte every 300 ms: each pause is inside the 1 s deadline.
        if c.write_all(b"1\r\nx\r\n").await.is_err() {
            break;
        }
        if let Some(line) = status_of(&mut c, Duration::from_millis(300)).await {
            answered = Some(line);
            break;
        }
    }
    let line = answered.expect("the trickle was answered");
    assert!(line.contains("408"), "{line}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(s.metric("fleetops_http_slow_uploads").await >= 1.0);
    let files = s.get(&format!("{DEV}/sessions/{sid}/files"), s.key()).await;
    assert_eq!(
        files.body["items"],
        serde_json::json!([]),
        "nothing half-written"
    );
}

each_backend!(streamed_uploads_are_counted_in_the_body_budget);
/// A streamed upload holds its writer's buffer in the body budget while it runs: past the
/// budget the next is 503 with `Retry-After`, and once the first ends there is room again.
async fn streamed_uploads_are_counted_in_the_body_budget() {
    // Room for one chunked upload's buffer (3 MiB on the local backend), not two.
    let s = start_with(|c| c.http.body_budget_bytes = 5 << 20).await;
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    // The first holds its share: a second chunked upload is refused.
    let mut first = refused_beside_a_held_upload(&s, sid, &tok, || async {
        chunked_upload(&s, sid, &tok, "b.bin").await.contains("503")
    })
    .await
    .expect("a second upload past the budget is 503");
    // An ordinary JSON request still fits beside it.
    let r = s.get(&format!("{DEV}/devices"), s.key()).await;
    assert_eq!(r.status, 200);
    // The first ends: the budget has room again for another chunked upload.
    first.write_all(b"0\r\n\r\n").await.unwrap();
    let line = status_of(&mut first, Duration::from_secs(5)).await.unwrap();
    assert!(line.contains("201"), "{line}");
    let line = chunked_upload(&s, sid, &tok, "c.bin").await;
    assert!(line.contains("201"), "{line}");
}

/// A whole chunked upload of one byte on a connection of its own: its status line.
async fn chunked_upload(s: &Srv, sid: u64, tok: &str, name: &str) -> String {
    let mut c = TcpStream::connect(addr(s)).await.unwrap();
    c.write_all(upload_head(sid, tok, name).as_bytes())
        .await
        .unwrap();
    c.write_all(b"1\r\ny\r\n0\r\n\r\n").await.unwrap();
    status_of(&mut c, Duration::from_secs(5)).await.unwrap()
}

each_backend!(streamed_uploads_hold_at_most_half_the_body_budget);
/// Streamed uploads hold at most half of the body budget together, so slow uploads never
/// take what buffered bodies (heartbeats, log batches) need: with room in the budget for two
/// uploads' buffers but not in its half, the second is 503 while a log batch goes through.
async fn streamed_uploads_hold_at_most_half_the_body_budget() {
    // 8 MiB: two 3 MiB buffers fit in the budget, one in its half.
    let s = start_with(|c| c.http.body_budget_bytes = 8 << 20).await;
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    let mut first = refused_beside_a_held_upload(&s, sid, &tok, || async {
        chunked_upload(&s, sid, &tok, "b.bin").await.contains("503")
    })
    .await
    .expect("a second upload past the streams' half is 503");
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            &tok,
            serde_json::json!([{"level": "info", "message": "beside the upload"}]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    first.write_all(b"0\r\n\r\n").await.unwrap();
    let line = status_of(&mut first, Duration::from_secs(5)).await.unwrap();
    assert!(line.contains("201"), "{line}");
}

each_backend!(one_organizations_uploads_hold_only_its_share);
/// One organization's uploads hold at most its share of the upload places
/// (`max_streamed_uploads_per_org`): its next upload is 503 while another organization's goes
/// through.
async fn one_organizations_uploads_hold_only_its_share() {
    let s = start_with(|c| {
        c.http.max_streamed_uploads = 3;
        c.http.max_streamed_uploads_per_org = 1;
    })
    .await;
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    let put = |sid: u64, tok: String, base: String| {
        let s = &s;
        async move {
            s.raw(
                s.http
                    .put(s.url(&format!("{base}/sessions/{sid}/files/b.bin")))
                    .bearer_auth(&tok)
                    .body(vec![1u8; 10]),
            )
            .await
        }
    };
    let held = refused_beside_a_held_upload(&s, sid, &tok, || async {
        put(sid, tok.clone(), DEV.to_string()).await.status == 503
    })
    .await
    .expect("the organization's second upload waits for its share");
    // Another organization's device uploads meanwhile.
    s.post(
        "/api/v1/organizations",
        s.key(),
        serde_json::json!({"slug": "acme"}),
    )
    .await;
    s.post(
        "/api/v1/organizations/acme/projects",
        s.key(),
        serde_json::json!({"slug": "p"}),
    )
    .await;
    let base = "/api/v1/organizations/acme/projects/p".to_string();
    let r = s
        .post(
            &format!("{base}/devices"),
            s.key(),
            serde_json::json!({"name": "r"}),
        )
        .await;
    let (d2, tok2) = (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    );
    let r = s
        .post(
            &format!("{base}/sessions"),
            &tok2,
            serde_json::json!({"device_id": d2}),
        )
        .await;
    let sid2 = r.body["id"].as_u64().unwrap();
    let r = put(sid2, tok2, base).await;
    assert_eq!(r.status, 201, "{}", r.body);
    drop(held);
}
