//! Shared by the benches: the bare-hyper baseline server, a wrk runner and parser, and a
//! probe of the disk's fsync latency (printed beside durable-write figures).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

pub use fleetops_testkit::postgres;

/// `BENCH_BACKEND`: where the records of the servers a bench starts live, `sled` (the
/// default) or `postgres` (a private cluster of Debian's PostgreSQL in a temporary directory,
/// fsync on, a database per server).
pub fn backend() -> &'static str {
    match std::env::var("BENCH_BACKEND").as_deref() {
        Ok("postgres") => "postgres",
        Ok("sled") | Err(_) => "sled",
        Ok(other) => panic!("BENCH_BACKEND is sled or postgres, not {other}"),
    }
}

/// The benches' cluster: durable, as in production.
pub fn bench_cluster() -> &'static postgres::Cluster {
    static CLUSTER: std::sync::OnceLock<postgres::Cluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| postgres::Cluster::start_new(true))
}

/// The mean of the store's durable-commit timings so far, in ms: sled's group-commit fsyncs,
/// or PostgreSQL's commits.
pub fn commit_ms(store: &fleetops_storage::Store) -> f64 {
    let s = store.flush_timings().snapshot();
    if s.count == 0 {
        return f64::NAN;
    }
    s.sum_seconds * 1000.0 / s.count as f64
}

/// A bare hyper 1 hello-world server: the ceiling this machine allows for HTTP/1.1 on
/// loopback, measured in the same run as fleetops so the ratio survives noisy machines.
pub async fn start_baseline() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req| async {
                    let mut r =
                        Response::new(Full::new(Bytes::from_static(b"{\"hello\":\"world\"}")));
                    r.headers_mut()
                        .insert("content-type", "application/json".parse().unwrap());
                    Ok::<_, Infallible>(r)
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, task)
}

/// One wrk run's figures.
#[derive(Debug, Clone)]
pub struct WrkResult {
    pub requests_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub non_2xx: u64,
    pub errors: String,
}

/// Runs wrk (Debian's `wrk`) against `url` with `connections` connections for `secs`.
/// `script` is an optional Lua file (for methods and bodies).
pub fn wrk(
    url: &str,
    headers: &[String],
    connections: u32,
    secs: u32,
    script: Option<&str>,
) -> WrkResult {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t2",
        &format!("-c{connections}"),
        &format!("-d{secs}s"),
        "--latency",
        "--timeout",
        "10s",
    ]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    if let Some(s) = script {
        cmd.args(["-s", s]);
    }
    cmd.arg(url);
    let out = cmd
        .output()
        .expect("wrk not found: install it with `apt-get install wrk`");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    parse_wrk(&text)
}

fn ms(v: &str) -> f64 {
    let v = v.trim();
    let (num, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(v.len()));
    let n: f64 = num.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => f64::NAN,
    }
}

pub fn parse_wrk(text: &str) -> WrkResult {
    let mut r = WrkResult {
        requests_per_sec: 0.0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        non_2xx: 0,
        errors: String::new(),
    };
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            r.requests_per_sec = v.trim().parse().unwrap_or(0.0);
        } else if let Some(v) = t.strip_prefix("50%") {
            r.p50_ms = ms(v);
        } else if let Some(v) = t.strip_prefix("99%") {
            r.p99_ms = ms(v);
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            r.non_2xx = v.trim().parse().unwrap_or(0);
        } else if t.starts_with("Socket errors:") {
            r.errors = t.to_string();
        }
    }
    if r.requests_per_sec == 0.0 {
        eprintln!("wrk output not understood:\n{text}");
    }
    r
}

/// Median latency of write + fsync of 4 KiB in `dir`, over `n` rounds.
pub fn fsync_latency_ms(dir: &std::path::Path, n: usize) -> f64 {
    use std::io::Write;
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let buf = vec![7u8; 4096];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&buf).unwrap();
        f.sync_data().unwrap();
        v.push(t.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    v.sort();
    v.get(n / 2)
        .copied()
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
        * 1000.0
}

/// Resident memory of a process in MB, from /proc.
pub fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

pub fn env_u32(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// fleetops in-process on a free port with a fresh data directory, the free tier's limit
/// raised out of the way: (server, API key, base URL, the data directory guard).
pub async fn start_fleetops() -> (
    fleetops::startup::Running,
    String,
    String,
    tempfile::TempDir,
) {
    start_fleetops_with(|_| {}).await
}

/// As [`start_fleetops`], with the configuration adjusted by `f` first.
pub async fn start_fleetops_with(
    f: impl FnOnce(&mut fleetops::config::Config),
) -> (
    fleetops::startup::Running,
    String,
    String,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = bench_config(&dir);
    cfg.admin.password = "bench-password".into();
    if backend() == "postgres" {
        cfg.database.url = bench_cluster().database();
    }
    f(&mut cfg);
    let running = fleetops::startup::start(cfg).await.unwrap();
    let key = running.initial.clone().unwrap().api_key;
    let url = format!("http://{}", running.addr);
    (running, key, url, dir)
}

/// The benches' server configuration on `dir` (the data directory is `dir/data`), on sled,
/// with the free tier's rate limit raised out of the way.
fn bench_config(dir: &tempfile::TempDir) -> fleetops::config::Config {
    let mut cfg = fleetops::config::Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("data"),
        log: "warn".into(),
        ..fleetops::config::Config::default()
    };
    cfg.admin.tier = "free".into();
    cfg.tiers.insert(
        "free".into(),
        fleetops::config::TierFile {
            requests_per_minute: Some(1_000_000_000),
            storage_bytes: None,
        },
    );
    cfg
}

/// fleetops started again on the data directory of a stopped one (its records on the
/// PostgreSQL database `database`, or on sled when it is empty): (server, base URL).
pub async fn restart_fleetops(
    dir: &tempfile::TempDir,
    database: &str,
) -> (fleetops::startup::Running, String) {
    let mut cfg = bench_config(dir);
    cfg.database.url = database.to_string();
    let running = fleetops::startup::start(cfg).await.unwrap();
    let url = format!("http://{}", running.addr);
    (running, url)
}

/// A device and `n` active sessions for it; returns the session ids.
pub async fn sessions(c: &reqwest::Client, url: &str, key: &str, n: usize) -> Vec<u64> {
    const DEV: &str = "/api/v1/organizations/default/projects/default";
    let d: serde_json::Value = c
        .post(format!("{url}{DEV}/devices"))
        .bearer_auth(key)
        .json(&serde_json::json!({"name": "bench"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let s: serde_json::Value = c
            .post(format!("{url}{DEV}/sessions"))
            .bearer_auth(key)
            .json(&serde_json::json!({"device_id": d["id"]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(s["id"].as_u64().unwrap());
    }
    ids
}

/// CPU seconds this process (the in-process server, all its threads) has used so far, from
/// `/proc/self/stat` (utime + stime, at the usual 100 ticks per second).
pub fn cpu_seconds() -> f64 {
    cpu_seconds_of("self")
}

/// CPU seconds process `pid` (or `self`) has used so far.
pub fn cpu_seconds_of(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let u: f64 = f.get(11)?.parse().ok()?;
            let k: f64 = f.get(12)?.parse().ok()?;
            Some((u + k) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

/// A Lua string literal (for wrk scripts).
pub fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The server's histogram of connection-task poll times (`/metrics`), summed up: how many
/// polls, how many held an async thread over 1 ms, and the bucket bounds under which 99.9%
/// and all of them fall.
pub async fn poll_summary(url: &str) -> String {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("fleetops_http_task_poll_seconds_bucket{le=\"") else {
            continue;
        };
        let Some((le, n)) = rest.split_once("\"} ") else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::NAN)
        };
        buckets.push((le, n.trim().parse().unwrap_or(0.0)));
    }
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    let under = |bound: f64| {
        buckets
            .iter()
            .find(|b| b.0 >= bound)
            .map(|b| b.1)
            .unwrap_or(total)
    };
    let covering = |share: f64| {
        buckets
            .iter()
            .find(|b| b.1 >= total * share)
            .map(|b| b.0 * 1000.0)
            .unwrap_or(f64::NAN)
    };
    format!(
        "{total:.0} handler polls, {:.0} over 1 ms; 99.9% within {:.2} ms, all within {:.2} ms",
        total - under(0.001),
        covering(0.999),
        covering(1.0)
    )
}

/// `n` log entries numbered from `offset`: four modules, warn/error/debug/info in a fixed mix
/// (10 % `motor .. stalled` errors), rising timestamps, metadata `{"seq": k}`.
pub fn batch(n: usize, offset: usize) -> serde_json::Value {
    let modules = ["drive", "nav", "arm", "vision"];
    serde_json::Value::Array(
        (0..n)
            .map(|i| {
                let k = offset + i;
                let (level, msg) = match k % 10 {
                    0 => ("warn", format!("motor {k} temperature high")),
                    1 => ("warn", format!("battery {k} low")),
                    2 => ("error", format!("motor {k} stalled")),
                    3 | 4 => ("debug", format!("tick {k}")),
                    _ => ("info", format!("step {k} completed in 12 ms")),
                };
                serde_json::json!({"timestamp": format!("2026-05-01T10:{:02}:{:02}.{:03}Z", (k / 60000) % 60, (k / 1000) % 60, k % 1000),
                       "level": level, "module": modules[k % 4], "message": msg, "metadata": {"seq": k}})
            })
            .collect(),
    )
}
