//! Hostile streamed uploads: slower than the minimum rate, counted in the body budget, at most
//! half of it, and one organization's share.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

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

/// A whole chunked upload of one byte on a connection of its own: its status line.
async fn chunked_upload(s: &Srv, sid: u64, tok: &str, name: &str) -> String {
    let mut c = TcpStream::connect(addr(s)).await.unwrap();
    c.write_all(upload_head(sid, tok, name).as_bytes())
        .await
        .unwrap();
    c.write_all(b"1\r\ny\r\n0\r\n\r\n").await.unwrap();
    status_of(&mut c, Duration::from_secs(5)).await.unwrap()
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
