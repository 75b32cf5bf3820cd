//! Hostile bodies: one that stalls, the shared budget of buffered bodies, large bodies read a
//! few at a time or at their pace, and a flood of large unsigned deliveries.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

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
