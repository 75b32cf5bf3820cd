//! Issue 15's figures, in a real browser (Debian's Chromium through chromedriver): the
//! console's page loads with 10,000 devices and a 1,000,000-line session (the navigation's
//! response end and the first contentful paint, from the page's own Performance timeline),
//! and the live tail at 1,000 lines/s (lines received against lines sent, and the longest
//! main-thread task the browser's `longtask` observer saw).
//!
//! Run: `cargo bench --bench console` (needs `chromium` and `chromium-driver` from Debian).
//! Knobs: BENCH_DEVICES (default 10000), BENCH_LINES (default 1000000), BENCH_LOADS (each
//! page's loads, default 5), BENCH_TAIL_SECS (default 10).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use fantoccini::{ClientBuilder, Locator};
use serde_json::{Value, json};
use support::*;

const DEV: &str = "/api/v1/organizations/default/projects/default";

fn main() {
    let n = env_u32("BENCH_DEVICES", 10_000) as usize;
    let lines = env_u32("BENCH_LINES", 1_000_000) as usize;
    let loads = env_u32("BENCH_LOADS", 5) as usize;
    let tail_secs = env_u32("BENCH_TAIL_SECS", 10) as u64;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());
    let (running, key, url, _dir) = rt.block_on(start_fleetops_with(|c| {
        c.devices.offline_after_seconds = 3600;
    }));
    let c = reqwest::Client::new();
    let (first, sid, tok) = rt.block_on(async {
        let mut ids = Vec::with_capacity(n);
        let mut left: Vec<usize> = (0..n).collect();
        while !left.is_empty() {
            let chunk: Vec<usize> = left.drain(..left.len().min(32)).collect();
            let made = futures::future::join_all(chunk.iter().map(|i| {
                c.post(format!("{url}{DEV}/devices"))
                    .bearer_auth(&key)
                    .json(&json!({"name": format!("robot-{i:05}"), "labels": {"fleet": "bench"}}))
                    .send()
            }))
            .await;
            for r in made {
                let v: Value = r.unwrap().json().await.unwrap();
                ids.push((v["id"].as_u64().unwrap(), v["device_token"].as_str().unwrap().to_string()));
            }
        }
        // Half the fleet heartbeats once (online), the rest never did (offline).
        for (id, tok) in ids.iter().step_by(2).take(n / 2) {
            c.post(format!("{url}{DEV}/devices/{id}/heartbeat"))
                .bearer_auth(tok)
                .json(&json!({"metrics": {"cpu": 0.4, "temp": 51.0}}))
                .send()
                .await
                .unwrap();
        }
        let (dev, tok) = ids[0].clone();
        let s: Value = c
            .post(format!("{url}{DEV}/sessions"))
            .bearer_auth(&tok)
            .json(&json!({"device_id": dev}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let sid = s["id"].as_u64().unwrap();
        let t = Instant::now();
        let mut sent = 0;
        while sent < lines {
            let batch: Vec<Value> = (sent..(sent + 1000).min(lines))
                .map(|i| json!({"timestamp": format!("2026-03-01T10:{:02}:{:02}.{:03}Z", (i / 60_000) % 60, (i / 1000) % 60, i % 1000),
                    "level": if i % 100 == 0 { "error" } else { "info" }, "module": if i % 8 == 0 { "arm" } else { "nav" },
                    "message": format!("step {i} motor ok")}))
                .collect();
            sent += batch.len();
            let r = c
                .post(format!("{url}{DEV}/sessions/{sid}/logs"))
                .bearer_auth(&tok)
                .json(&batch)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
        }
        println!("{n} devices, {lines} log lines stored in {:.1} s", t.elapsed().as_secs_f64());
        (dev, sid, tok)
    });

    let profile = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut driver = std::process::Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromedriver");
    let results = rt.block_on(async {
        let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.path().display())]}
        }))
        .unwrap();
        let mut b = None;
        for _ in 0..100 {
            if let Ok(cl) = ClientBuilder::rustls()
                .unwrap()
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                b = Some(cl);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let b = b.expect("a WebDriver session");
        b.goto(&format!("{url}/console/login")).await.unwrap();
        b.find(Locator::Css("#email")).await.unwrap().send_keys("admin@localhost").await.unwrap();
        b.find(Locator::Css("#password")).await.unwrap().send_keys("bench-password").await.unwrap();
        b.find(Locator::Css("#signin")).await.unwrap().click().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let base = format!("{url}/console/default/default");
        let pages = [
            ("fleet, page 1 of 10,000 devices (2 counts)", base.clone()),
            ("fleet, offline filter", format!("{base}?status=offline")),
            ("fleet, name search", format!("{base}?name=robot-0999")),
            ("fleet, page 100", format!("{base}?page=100")),
            ("device (24 h chart, sessions, history)", format!("{base}/devices/{first}")),
            ("session, 1,000,000 lines, first 200", format!("{base}/sessions/{sid}")),
            ("session, level=error", format!("{base}/sessions/{sid}?level=error")),
            ("session, text search", format!("{base}/sessions/{sid}?search=step+99999+")),
            ("alerts", format!("{base}/alerts")),
        ];
        let mut out = Vec::new();
        for (name, page) in pages {
            let mut resp = Vec::new();
            let mut fcp = Vec::new();
            let mut painted = 0u64;
            for _ in 0..loads {
                b.goto(&page).await.unwrap();
                // Read after two animation frames, so the first paint has been recorded.
                let v = b
                    .execute_async(
                        "var done = arguments[arguments.length - 1];
                         requestAnimationFrame(function () { requestAnimationFrame(function () {
                           var n = performance.getEntriesByType('navigation')[0];
                           var p = performance.getEntriesByName('first-contentful-paint')[0];
                           done([n.responseEnd, p ? p.startTime : n.domContentLoadedEventEnd, p ? 1 : 0]);
                         }); });",
                        vec![],
                    )
                    .await
                    .unwrap();
                resp.push(v[0].as_f64().unwrap());
                fcp.push(v[1].as_f64().unwrap());
                painted += v[2].as_u64().unwrap_or(0);
            }
            resp.sort_by(f64::total_cmp);
            fcp.sort_by(f64::total_cmp);
            out.push((
                name,
                resp[resp.len() / 2],
                fcp[fcp.len() / 2],
                fcp[fcp.len() - 1],
                painted,
            ));
        }
        // The live tail at 1,000 lines/s: 10 lines every 10 ms.
        b.goto(&format!("{base}/sessions/{sid}")).await.unwrap();
        b.execute(
            "window.__long = []; new PerformanceObserver(function (l) { l.getEntries().forEach(function (e) { window.__long.push(e.duration); }); }).observe({type: 'longtask', buffered: true}); return 1;",
            vec![],
        )
        .await
        .unwrap();
        while b.find(Locator::Css("#tail[data-open='1']")).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before: u64 = b
            .find(Locator::Css("#tail-lines"))
            .await
            .unwrap()
            .attr("data-received")
            .await
            .unwrap()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let start = Instant::now();
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while start.elapsed() < Duration::from_secs(tail_secs) {
            tick.tick().await;
            let batch: Vec<Value> = (0..10)
                .map(|i| json!({"timestamp": "2026-03-02T00:00:00.000Z", "level": "info", "module": "tail", "message": format!("live {}", sent + i)}))
                .collect();
            sent += 10;
            let r = c
                .post(format!("{url}{DEV}/sessions/{sid}/logs"))
                .bearer_auth(&tok)
                .json(&batch)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
        }
        let rate = sent as f64 / start.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let got: u64 = b
            .find(Locator::Css("#tail-lines"))
            .await
            .unwrap()
            .attr("data-received")
            .await
            .unwrap()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let long = b
            .execute("return window.__long;", vec![])
            .await
            .unwrap();
        let long: Vec<f64> = long
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        b.close().await.unwrap();
        (out, sent, got - before, rate, long)
    });
    let _ = driver.kill();
    let _ = driver.wait();
    rt.block_on(running.stop());

    let (pages, sent, got, rate, long) = results;
    println!();
    println!(
        "| page (release build, {n} devices, {lines} lines) | response end, median ms | first render, median ms | max ms | loads with a paint entry |"
    );
    println!("|---|---|---|---|---|");
    for (name, resp, fcp, max, painted) in pages {
        println!("| {name} | {resp:.0} | {fcp:.0} | {max:.0} | {painted} of {loads} |");
    }
    println!(
        "first render: the first contentful paint where the browser recorded one, else DOMContentLoaded"
    );
    println!(
        "live tail: {sent} lines sent at {rate:.0} lines/s, {got} received by the page ({} dropped); main-thread tasks over 50 ms: {}, longest {:.0} ms",
        sent.saturating_sub(got),
        long.len(),
        long.iter().copied().fold(0.0, f64::max)
    );
}
