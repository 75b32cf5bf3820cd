//! Issue 2's live-stream figure: 100 WebSocket subscribers on one session while 10,000 lines/s
//! are ingested (100-line batches every 10 ms); p50/p99 delivery latency from just before the
//! POST to receipt, and the achieved ingest rate; then the same with one more subscriber that
//! never reads (stalled), to show it changes neither.
//!
//! Run: `cargo bench --bench live`. Knobs: BENCH_SECS (default 10), BENCH_SUBSCRIBERS (100).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use support::*;
use tokio_tungstenite::tungstenite::Message;

const DEV: &str = "/api/v1/organizations/default/projects/default";

struct Run {
    p50_ms: f64,
    p99_ms: f64,
    delivered: usize,
    lines_per_sec: f64,
}

async fn run(url: &str, key: &str, subscribers: usize, stalled: bool, secs: u64) -> Run {
    let c = reqwest::Client::new();
    let sid = sessions(&c, url, key, 1).await[0];
    let ws_url = format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs?token={key}",
        url.replace("http://", "ws://")
    );
    let origin = Instant::now();
    let mut readers = Vec::new();
    for _ in 0..subscribers {
        let (mut ws, _) = tokio_tungstenite::connect_async(&ws_url).await.unwrap();
        readers.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(200_000);
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Text(t) = m {
                    // The message text starts with "t=<microseconds since origin> ".
                    if let Some(us) = t
                        .split("t=")
                        .nth(1)
                        .and_then(|r| r.split(' ').next())
                        .and_then(|v| v.parse::<u64>().ok())
                    {
                        lat.push(origin.elapsed().as_micros() as f64 / 1000.0 - us as f64 / 1000.0);
                    }
                    if t.contains("session_ended") {
                        break;
                    }
                }
            }
            lat
        }));
    }
    // A subscriber that never reads: its socket fills and the server skips it ahead.
    let _stalled = if stalled {
        Some(tokio_tungstenite::connect_async(&ws_url).await.unwrap().0)
    } else {
        None
    };
    let pad = "x".repeat(60);
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut sent = 0usize;
    while start.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        let now = origin.elapsed().as_micros();
        let batch: Vec<Value> = (0..100).map(|i| json!({"level": "info", "module": "live", "message": format!("t={now} {i} {pad}")})).collect();
        let r = c
            .post(format!("{url}{DEV}/sessions/{sid}/logs"))
            .bearer_auth(key)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        sent += 100;
    }
    let rate = sent as f64 / start.elapsed().as_secs_f64();
    c.post(format!("{url}{DEV}/sessions/{sid}/complete"))
        .bearer_auth(key)
        .json(&json!({"status": "completed"}))
        .send()
        .await
        .unwrap();
    let mut all = Vec::new();
    for r in readers {
        all.extend(r.await.unwrap());
    }
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p = |q: f64| {
        all.get(((all.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    Run {
        p50_ms: p(0.5),
        p99_ms: p(0.99),
        delivered: all.len(),
        lines_per_sec: rate,
    }
}

fn main() {
    let secs = env_u32("BENCH_SECS", 10) as u64;
    let subs = env_u32("BENCH_SUBSCRIBERS", 100) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());
    let (running, key, url, _data) = rt.block_on(start_fleetops());
    for stalled in [false, true] {
        let r = rt.block_on(run(&url, &key, subs, stalled, secs));
        println!(
            "{subs} subscribers{}: ingest {:.0} lines/s, {} deliveries, latency p50 {:.2} ms, p99 {:.2} ms (goal p99 <= 50 ms)",
            if stalled { " + 1 stalled" } else { "" },
            r.lines_per_sec,
            r.delivered,
            r.p50_ms,
            r.p99_ms
        );
    }
    rt.block_on(running.stop());
}
