//! Hostile connections: slowloris, silent or partial HTTP/2 prefaces, idle ones, the connection
//! ceiling and one address's share of connections and of the unauthenticated routes.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

/// Reads one HTTP/2 frame: (type, flags, payload); `None` once the server closed.
async fn h2_frame(c: &mut TcpStream) -> Option<(u8, u8, Vec<u8>)> {
    let mut head = [0u8; 9];
    c.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    c.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], payload))
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
