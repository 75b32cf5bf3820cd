//! The live tail across nodes: a subscriber on one node sees every line posted to the other,
//! in order, and the session's end.

use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{Engines, Node, call, client};

pub(crate) const DEV: &str = "/api/v1/organizations/default/projects/default";

/// A device and an active session on `n`: (session id, device token).
pub(crate) async fn session(c: &reqwest::Client, n: &Node, key: &str) -> (u64, String) {
    let (s, d) = call(
        c,
        Method::POST,
        n.url(&format!("{DEV}/devices")),
        key,
        Some(json!({"name": format!("robot-{}", uuid::Uuid::new_v4().simple())})),
    )
    .await;
    assert_eq!(s, 201, "{d}");
    let token = d["device_token"].as_str().unwrap().to_string();
    let (s, b) = call(
        c,
        Method::POST,
        n.url(&format!("{DEV}/sessions")),
        &token,
        Some(json!({"device_id": d["id"]})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    (b["id"].as_u64().unwrap(), token)
}

pub(crate) type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A live subscriber on `n`, replaying the last `replay` entries first.
async fn tail_from(n: &Node, sid: u64, key: &str, replay: usize) -> Ws {
    let url = format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs?token={key}&replay={replay}",
        n.base.replace("http://", "ws://")
    );
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

/// A live subscriber on `n` to what comes from now on.
pub(crate) async fn tail(n: &Node, sid: u64, key: &str) -> Ws {
    tail_from(n, sid, key, 0).await
}

/// The next text frame as JSON (pings skipped), within 10 s.
pub(crate) async fn next_json(ws: &mut Ws) -> Value {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame within 10 s")
            .expect("stream open")
            .unwrap();
        match m {
            Message::Text(t) => return serde_json::from_str(&t).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

pub(crate) async fn post_lines(
    c: &reqwest::Client,
    n: &Node,
    sid: u64,
    token: &str,
    lines: &[String],
) {
    let batch: Vec<Value> = lines
        .iter()
        .map(|m| json!({"level": "info", "module": "m", "message": m}))
        .collect();
    let (s, b) = call(
        c,
        Method::POST,
        n.url(&format!("{DEV}/sessions/{sid}/logs")),
        token,
        Some(Value::Array(batch)),
    )
    .await;
    assert_eq!(s, 202, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_subscriber_on_one_node_receives_every_line_posted_to_the_other_in_order() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    // 50 batches of 10 lines to A, one after another.
    let mut sent = 0;
    for batch in 0..50 {
        let lines: Vec<String> = (0..10)
            .map(|i| format!("line {}", batch * 10 + i))
            .collect();
        post_lines(&c, &a, sid, &token, &lines).await;
        sent += lines.len();
    }
    for i in 0..sent {
        let f = next_json(&mut ws).await;
        assert_eq!(f["type"], "log", "{f}");
        assert_eq!(f["message"], format!("line {i}"));
    }
    let (s, _) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/sessions/{sid}/complete")),
        &token,
        Some(json!({"status": "completed"})),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        next_json(&mut ws).await,
        json!({"type": "session_ended", "status": "completed"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_to_one_session_on_both_nodes_keep_every_line_once_and_a_subscriber_sees_them_all_in_arrival_order()
 {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws_a = tail(&a, sid, &key).await;
    let mut ws_b = tail(&b, sid, &key).await;
    // Two writers at once, one a node, 40 batches of 5 lines each.
    let mut writers = Vec::new();
    for (name, node) in [("a", &a), ("b", &b)] {
        let (c, url, token) = (c.clone(), node.base.clone(), token.clone());
        writers.push(tokio::spawn(async move {
            for batch in 0..40 {
                let lines: Vec<Value> = (0..5)
                    .map(|i| json!({"level": "info", "module": "m", "message": format!("{name} {batch} {i}")}))
                    .collect();
                let (s, body) = call(
                    &c,
                    Method::POST,
                    format!("{url}{DEV}/sessions/{sid}/logs"),
                    &token,
                    Some(Value::Array(lines)),
                )
                .await;
                assert_eq!(s, 202, "{body}");
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    // Both subscribers see the 400 lines once each, in one order, each writer's in its order.
    let mut seen = Vec::new();
    for ws in [&mut ws_a, &mut ws_b] {
        let mut lines = Vec::new();
        for _ in 0..400 {
            let f = next_json(ws).await;
            assert_eq!(f["type"], "log", "{f}");
            lines.push(f["message"].as_str().unwrap().to_string());
        }
        seen.push(lines);
    }
    // Each writer's lines in the order it sent them.
    for name in ["a", "b"] {
        let mine: Vec<&String> = seen[0]
            .iter()
            .filter(|l| l.starts_with(&format!("{name} ")))
            .collect();
        let want: Vec<String> = (0..40)
            .flat_map(|b| (0..5).map(move |i| format!("{name} {b} {i}")))
            .collect();
        assert_eq!(mine.len(), 200);
        assert!(
            mine.iter().zip(&want).all(|(x, y)| *x == y),
            "{name}'s lines out of order"
        );
    }
    // A node started afterwards replays them from the store in arrival order: the order
    // both subscribers saw.
    let late = engines.node("c");
    let mut ws_c = tail_from(&late, sid, &key, 400).await;
    let mut stored = Vec::new();
    for _ in 0..400 {
        stored.push(
            next_json(&mut ws_c).await["message"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(seen[0], stored, "node A's subscriber");
    assert_eq!(seen[1], stored, "node B's subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_bus_down_a_subscriber_on_one_node_still_gets_the_other_nodes_lines_from_the_store()
 {
    let mut engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    post_lines(&c, &a, sid, &token, &["before".to_string()]).await;
    assert_eq!(next_json(&mut ws).await["message"], "before");
    // Every batch from now on is lost to the bus: B reads them back from the store.
    engines.nats.stop();
    for i in 0..5 {
        post_lines(&c, &a, sid, &token, &[format!("dark {i}")]).await;
    }
    for i in 0..5 {
        assert_eq!(next_json(&mut ws).await["message"], format!("dark {i}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_completed_on_one_node_refuses_appends_on_the_other_even_with_the_bus_down() {
    let mut engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (sid, token) = session(&c, &a, &key).await;
    // B's session actor is up and open.
    post_lines(&c, &b, sid, &token, &["on b".to_string()]).await;
    engines.nats.stop();
    let (s, _) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/sessions/{sid}/complete")),
        &token,
        Some(json!({"status": "completed"})),
    )
    .await;
    assert_eq!(s, 200);
    let (s, body) = call(
        &c,
        Method::POST,
        b.url(&format!("{DEV}/sessions/{sid}/logs")),
        &token,
        Some(json!([{"level": "info", "message": "too late"}])),
    )
    .await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["detail"], "Session is not active");
}
