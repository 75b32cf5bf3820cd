//! The bus is the nodes' own: a client that reaches the NATS server reads nothing the nodes
//! send and makes no node act on what it publishes; and a server without the bus never runs
//! beside nodes on their database. (How nodes log in to NATS: `nats_login.rs`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{Engines, Node, call, client};
use crate::live::{DEV, Ws, next_json, post_lines, session, tail};

/// What a plain NATS client subscribed to everything has seen: (subject, payload).
type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A plain NATS client (no fleetops key) that records every message on the server.
async fn eavesdrop(url: &str) -> (async_nats::Client, Seen) {
    let raw = async_nats::connect(url).await.unwrap();
    let mut sub = raw.subscribe(">").await.unwrap();
    raw.flush().await.unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            s.lock()
                .unwrap()
                .push((m.subject.to_string(), m.payload.to_vec()));
        }
    });
    (raw, seen)
}

/// Waits up to 10 s for a recorded message on `subject`.
async fn seen_on(seen: &Seen, subject: &str) -> Vec<Vec<u8>> {
    for _ in 0..200 {
        let on: Vec<Vec<u8>> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _)| s == subject)
            .map(|(_, p)| p.clone())
            .collect();
        if !on.is_empty() {
            return on;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing seen on {subject}");
}

/// One unlabelled sample of `n`'s `/metrics`.
async fn metric(c: &reqwest::Client, n: &Node, name: &str) -> f64 {
    let text = c
        .get(n.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

async fn complete(c: &reqwest::Client, n: &Node, sid: u64, token: &str) {
    let (s, b) = call(
        c,
        Method::POST,
        n.url(&format!("{DEV}/sessions/{sid}/complete")),
        token,
        Some(json!({"status": "completed"})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
}

/// Frames `ws` receives within `wait` (pings skipped).
async fn frames_within(ws: &mut Ws, wait: Duration) -> Vec<String> {
    let mut out = Vec::new();
    let until = tokio::time::Instant::now() + wait;
    while let Ok(Some(m)) = tokio::time::timeout_at(until, ws.next()).await {
        match m.unwrap() {
            Message::Text(t) => out.push(t.to_string()),
            Message::Ping(_) | Message::Pong(_) => {}
            other => out.push(format!("{other:?}")),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_nats_client_reads_no_log_line_the_nodes_send_each_other() {
    let engines = Engines::start().await;
    let (_raw, seen) = eavesdrop(&engines.nats.url()).await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    let marker = format!("confidential-{}", uuid::Uuid::new_v4().simple());
    let lines: Vec<String> = (0..20).map(|i| format!("{marker} {i}")).collect();
    post_lines(&c, &a, sid, &token, &lines).await;
    for l in &lines {
        assert_eq!(&next_json(&mut ws).await["message"], l.as_str());
    }
    // The batch did travel on the bus, and nothing on it shows the lines.
    let live = seen_on(&seen, &format!("fleetops.live.{sid}")).await;
    assert!(!live.is_empty());
    let all = seen.lock().unwrap().clone();
    for (subject, payload) in &all {
        assert!(
            !payload
                .windows(marker.len())
                .any(|w| w == marker.as_bytes()),
            "a log line in clear on {subject}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_captured_and_moved_bus_messages_change_nothing_a_subscriber_on_another_node_sees() {
    let engines = Engines::start().await;
    let (raw, seen) = eavesdrop(&engines.nats.url()).await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    // A session that gets lines and ends, every message about it captured.
    let (done, done_token) = session(&c, &a, &key).await;
    let mut ws_done = tail(&b, done, &key).await;
    post_lines(&c, &a, done, &done_token, &["captured line".to_string()]).await;
    assert_eq!(next_json(&mut ws_done).await["message"], "captured line");
    complete(&c, &a, done, &done_token).await;
    assert_eq!(next_json(&mut ws_done).await["type"], "session_ended");
    let done_subject = format!("fleetops.live.{done}");
    let captured = seen_on(&seen, &done_subject).await;
    assert!(
        captured.len() >= 2,
        "a batch and an end: {}",
        captured.len()
    );
    // Another active session, with a live subscriber on B and no line yet.
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    let subject = format!("fleetops.live.{sid}");
    let rejected_before = metric(&c, &b, "fleetops_bus_rejected").await;
    // Every subject seen, and the victim's: the captured messages moved onto it, garbage,
    // and messages as a node sent them before the bus was sealed (a sender id, then an end
    // or a log signal).
    let mut subjects: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(s, _)| s.clone())
        .collect();
    subjects.push(subject.clone());
    subjects.sort();
    subjects.dedup();
    let mut forged: Vec<Vec<u8>> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, p)| p.clone())
        .collect();
    forged.push(b"garbage".to_vec());
    forged.push(vec![0; 200]);
    let mut end = uuid::Uuid::new_v4().as_bytes().to_vec();
    end.push(2);
    end.extend_from_slice(b"failed");
    forged.push(end);
    let mut sent = 0u64;
    for s in &subjects {
        if *s == done_subject {
            continue;
        }
        for p in &forged {
            raw.publish(s.clone(), p.clone().into()).await.unwrap();
            sent += 1;
        }
    }
    raw.flush().await.unwrap();
    // B's subscriber saw nothing: not ended, no line.
    let frames = frames_within(&mut ws, Duration::from_secs(2)).await;
    assert!(frames.is_empty(), "the subscriber saw {frames:?}");
    // It is still the session's: a real line arrives, and the session is active.
    post_lines(&c, &a, sid, &token, &["real line".to_string()]).await;
    let f = next_json(&mut ws).await;
    assert_eq!(f["type"], "log", "{f}");
    assert_eq!(f["message"], "real line");
    let (s, body) = call(
        &c,
        Method::GET,
        b.url(&format!("{DEV}/sessions/{sid}")),
        &key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["status"], "active", "{body}");
    // And B counted them.
    let mut counted = 0.0;
    for _ in 0..100 {
        counted = metric(&c, &b, "fleetops_bus_rejected").await - rejected_before;
        if counted >= forged.len() as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        counted >= forged.len() as f64,
        "B rejected {counted} of the {sent} forged messages"
    );
}

/// The project's alerts as `n` lists them.
async fn alerts(c: &reqwest::Client, n: &Node, key: &str) -> Vec<serde_json::Value> {
    let (s, v) = call(c, Method::GET, n.url(&format!("{DEV}/alerts")), key, None).await;
    assert_eq!(s, 200, "{v}");
    v["items"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_replayed_to_the_evaluators_fire_no_alert() {
    let engines = Engines::start().await;
    let (raw, seen) = eavesdrop(&engines.nats.url()).await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    // Three matching lines within a minute fire; each node gets one, so two arrive.
    let (s, r) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/alert-rules")),
        &key,
        Some(json!({"name": "overheat", "severity": "critical",
            "condition": {"type": "log_pattern", "pattern": "overheat", "level": "error",
                "count": 3, "window_seconds": 60}})),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let (sid, token) = session(&c, &a, &key).await;
    // Both nodes' evaluators are running (a rule reaches the other node at once).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (n, line) in [(&a, "overheat 1"), (&b, "overheat 2")] {
        let (s, body) = call(
            &c,
            Method::POST,
            n.url(&format!("{DEV}/sessions/{sid}/logs")),
            &token,
            Some(json!([{"level": "error", "module": "arm", "message": line}])),
        )
        .await;
        assert_eq!(s, 202, "{body}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signals: Vec<(String, Vec<u8>)> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| s.starts_with("fleetops.signals."))
        .cloned()
        .collect();
    assert!(signals.len() >= 2, "{} signals seen", signals.len());
    // Each node's signals published again on their own subject: the judging evaluator,
    // whichever node it is on, is sent the other node's lines again and again.
    for _ in 0..5 {
        for (s, p) in &signals {
            raw.publish(s.clone(), p.clone().into()).await.unwrap();
        }
    }
    raw.flush().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in [&a, &b] {
        let fired = alerts(&c, n, &key).await;
        assert!(fired.is_empty(), "replayed signals fired {fired:?}");
    }
    let rejected = metric(&c, &a, "fleetops_bus_rejected").await
        + metric(&c, &b, "fleetops_bus_rejected").await;
    assert!(rejected >= 5.0, "{rejected} rejected");
    // A third real line fires it: the rule was live all along.
    let (s, body) = call(
        &c,
        Method::POST,
        b.url(&format!("{DEV}/sessions/{sid}/logs")),
        &token,
        Some(json!([{"level": "error", "module": "arm", "message": "overheat 3"}])),
    )
    .await;
    assert_eq!(s, 202, "{body}");
    let t = std::time::Instant::now();
    while alerts(&c, &b, &key).await.is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the third line fired nothing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The configuration of a server without a bus (one server, `FLEETOPS_BUS_URL` missing).
fn without_bus(c: String) -> String {
    let start = c.find("url = \"nats://").expect("a bus url");
    let end = start + c[start..].find('\n').unwrap();
    let c = format!("{}url = \"\"{}", &c[..start], &c[end..]);
    c.replacen("nodes = 2", "nodes = 1", 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_bus_is_refused_on_the_database_the_nodes_share() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let refused = engines
        .try_node_with("lone", without_bus)
        .err()
        .expect("a server without [bus] url started beside the nodes");
    assert!(refused.contains("shared by fleetops nodes"), "{refused}");
    assert!(refused.contains("[bus] url"), "{refused}");
    // The node still serves.
    let (s, _) = call(&client(), Method::GET, a.url("/readyz"), "", None).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_refused_on_a_database_a_lone_server_holds() {
    let engines = Engines::start().await;
    let lone = engines.node_with("lone", without_bus);
    let refused = engines
        .try_node_with("a", |c| c)
        .err()
        .expect("a node started beside a lone server");
    assert!(
        refused.contains("held by a fleetops server without [bus] url"),
        "{refused}"
    );
    // Once the lone server is gone, nodes start.
    lone.stop();
    let a = engines.node("a2");
    let (s, _) = call(&client(), Method::GET, a.url("/readyz"), "", None).await;
    assert_eq!(s, 200);
}
