//! PostgreSQL stopping under load and coming back, on a cluster of the test's own: requests
//! that need it are 503 while it is down, nothing acknowledged is lost, and the same server
//! serves again once it is back, without a restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::common::postgres::Cluster;
use crate::common::*;
use crate::sessions::{device, session};

postgres_only!(
    while_postgres_is_down_requests_are_503_and_the_server_recovers_by_itself,
    threads = 4
);
async fn while_postgres_is_down_requests_are_503_and_the_server_recovers_by_itself() {
    let cluster = Cluster::private();
    let url = cluster.database();
    let s = Arc::new(start_with(move |c| c.database.url = url.clone()).await);
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");

    // A robot sending 10-line batches as fast as it is answered, keeping what was acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let robot = tokio::spawn({
        let (s, logs, tok, stop) = (s.clone(), logs.clone(), tok.clone(), stop.clone());
        async move {
            let (mut acked, mut unavailable, mut other) = (Vec::new(), 0u32, Vec::new());
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<_> = (0..10)
                    .map(|i| json!({"level": "info", "message": format!("b{n} l{i}")}))
                    .collect();
                let r = s.post(&logs, &tok, json!(batch)).await;
                match r.status.as_u16() {
                    202 => acked.push(n),
                    503 => {
                        unavailable += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    st => other.push((st, r.body.to_string())),
                }
                n += 1;
            }
            (acked, unavailable, other)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster.stop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = s.get(&format!("{DEV}/devices/{d}"), s.key()).await;
    r.assert_error(503);
    assert_eq!(r.header("retry-after"), Some("1"));
    let r = s
        .post(&format!("{DEV}/devices"), s.key(), json!({"name": "r2"}))
        .await;
    r.assert_error(503);
    tokio::time::sleep(Duration::from_secs(1)).await;

    cluster.start();
    // The same server answers again, reads and writes.
    assert!(
        eventually(30, || async {
            s.post(&format!("{DEV}/devices"), s.key(), json!({"name": "r3"}))
                .await
                .status
                == 201
        })
        .await,
        "writes never came back"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (acked, unavailable, other) = robot.await.unwrap();
    assert!(other.is_empty(), "only 202 or 503: {other:?}");
    assert!(unavailable > 0, "the robot met the outage");
    assert!(acked.len() > 10, "{} batches acknowledged", acked.len());

    // Every acknowledged line is there, once.
    let mut seen = std::collections::HashMap::new();
    let mut offset = 0;
    loop {
        let r = s
            .get(&format!("{logs}?limit=10000&offset={offset}"), s.key())
            .await;
        assert_eq!(r.status, 200);
        let items = r.body["items"].as_array().unwrap();
        for e in items {
            *seen
                .entry(e["message"].as_str().unwrap().to_string())
                .or_insert(0) += 1;
        }
        offset += items.len();
        if items.is_empty() || offset as u64 >= r.body["total"].as_u64().unwrap() {
            break;
        }
    }
    for n in &acked {
        for i in 0..10 {
            assert_eq!(
                seen.get(&format!("b{n} l{i}")),
                Some(&1),
                "batch {n} line {i}"
            );
        }
    }
    assert!(seen.values().all(|c| *c == 1), "a line stored twice");
    let r = s.get("/healthz", "").await;
    assert_eq!(r.status, 200, "{}", r.body);
}
