//! Alert rules on two nodes: one node's evaluator judges a project under its lease, fed the
//! signals of both nodes, and its notifier alone sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{Engines, Node, call, client};

const DEV: &str = "/api/v1/organizations/default/projects/default";

/// An HTTP endpoint on loopback answering 200 to everything, counting the requests.
async fn sink() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let n = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let n = n.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // One request: its header, then Content-Length bytes of body.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    buf.drain(..end + 4 + len);
                    n.fetch_add(1, Ordering::SeqCst);
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, count)
}

async fn post_line(c: &reqwest::Client, n: &Node, sid: u64, token: &str, message: &str) {
    let (s, b) = call(
        c,
        Method::POST,
        n.url(&format!("{DEV}/sessions/{sid}/logs")),
        token,
        Some(json!([{"level": "error", "module": "arm", "message": message}])),
    )
    .await;
    assert_eq!(s, 202, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_fed_by_both_nodes_fires_once_and_is_notified_once() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (url, received) = sink().await;
    let (s, i) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/integrations")),
        &key,
        Some(json!({"type": "webhook", "name": "sink", "config": {"url": url, "signing_secret": "s"}})),
    )
    .await;
    assert_eq!(s, 201, "{i}");
    // Two matching lines within a minute, one ingested by each node.
    let (s, r) = call(
        &c,
        Method::POST,
        b.url(&format!("{DEV}/alert-rules")),
        &key,
        Some(
            json!({"name": "overheat", "severity": "critical", "integration_ids": [i["id"]],
            "condition": {"type": "log_pattern", "pattern": "overheat", "level": "error",
                "module": "arm", "count": 2, "window_seconds": 60}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let (s, d) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/devices")),
        &key,
        Some(json!({"name": "arm-1"})),
    )
    .await;
    assert_eq!(s, 201, "{d}");
    let token = d["device_token"].as_str().unwrap().to_string();
    let (s, sess) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/sessions")),
        &token,
        Some(json!({"device_id": d["id"]})),
    )
    .await;
    assert_eq!(s, 201, "{sess}");
    let sid = sess["id"].as_u64().unwrap();
    // A rule change reaches the other node over the bus within milliseconds; a second is
    // ample on a loaded machine.
    tokio::time::sleep(Duration::from_secs(1)).await;
    post_line(&c, &a, sid, &token, "overheat at joint 1").await;
    post_line(&c, &b, sid, &token, "overheat at joint 2").await;
    let t = Instant::now();
    let alerts = loop {
        let (s, v) = call(&c, Method::GET, b.url(&format!("{DEV}/alerts")), &key, None).await;
        assert_eq!(s, 200, "{v}");
        if !v["items"].as_array().unwrap().is_empty() || t.elapsed() > Duration::from_secs(10) {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let items: Vec<&Value> = alerts["items"].as_array().unwrap().iter().collect();
    assert_eq!(items.len(), 1, "{alerts}");
    assert_eq!(items[0]["state"], "firing");
    while received.load(Ordering::SeqCst) == 0 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Time for a second node's notifier to send it again, were it to.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(received.load(Ordering::SeqCst), 1);
    let (_, again) = call(&c, Method::GET, a.url(&format!("{DEV}/alerts")), &key, None).await;
    assert_eq!(again["items"].as_array().unwrap().len(), 1, "{again}");
}
