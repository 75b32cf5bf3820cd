//! Two nodes against one on the same engines (PostgreSQL with fsync on, moto, nats-server),
//! each node its own release process: authenticated `GET .../devices/{id}`, webhook intake
//! (durable 202s) and log ingest (10-line and 1,000-line batches spread over 64 sessions), each
//! measured with all
//! connections on node A, then split over A and B, next to the bare-hyper baseline in the
//! same run; with each node's CPU time per request, the cost that scales with nodes.
//!
//! Run: `cargo bench --bench nodes` (needs `wrk`, Debian's `postgresql` and `nats-server`,
//! and moto: `pip install 'moto[server]'`).
//! Knobs: BENCH_SECS (default 10), BENCH_CONNECTIONS (default 64).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use fleetops_testkit::nodes as harness;

use serde_json::json;
use support::*;

const DEV: &str = "/api/v1/organizations/default/projects/default";

/// One load: its URL path, headers and wrk script.
struct Load {
    name: &'static str,
    path: String,
    headers: Vec<String>,
    script: Option<String>,
    /// What a request carries, for the per-second figure (lines for ingest).
    per_request: f64,
}

/// wrk on each of `bases` at once, `conns` connections split between them: the summed
/// requests per second, the worst p50 and p99, and the non-2xx answers.
fn run(bases: &[&str], load: &Load, conns: u32, secs: u32) -> (f64, f64, f64, u64) {
    let each = (conns / bases.len() as u32).max(1);
    let handles: Vec<_> = bases
        .iter()
        .map(|b| {
            let url = format!("{b}{}", load.path);
            let (headers, script) = (load.headers.clone(), load.script.clone());
            std::thread::spawn(move || wrk(&url, &headers, each, secs, script.as_deref()))
        })
        .collect();
    let rs: Vec<WrkResult> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    (
        rs.iter().map(|r| r.requests_per_sec).sum(),
        rs.iter().map(|r| r.p50_ms).fold(0.0, f64::max),
        rs.iter().map(|r| r.p99_ms).fold(0.0, f64::max),
        rs.iter().map(|r| r.non_2xx).sum(),
    )
}

fn main() {
    let secs = env_u32("BENCH_SECS", 10);
    let conns = env_u32("BENCH_CONNECTIONS", 64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());
    let (addr, task) = rt.block_on(start_baseline());
    wrk(&format!("http://{addr}/"), &[], conns, 2, None);
    let base = wrk(&format!("http://{addr}/"), &[], conns, secs, None);
    task.abort();

    let engines = rt.block_on(harness::Engines::start_in(bench_cluster()));
    let a = engines.node("a");
    let key = a.printed("API key:");
    let c = reqwest::Client::new();
    // Sixty-four sessions: a fleet's robots each send to their own session.
    let sessions = rt.block_on(sessions(&c, &a.base, &key, 64));
    let (device, _token, _session) = rt.block_on(async {
        let d: serde_json::Value = c
            .post(a.url(&format!("{DEV}/devices")))
            .bearer_auth(&key)
            .json(&json!({"name": "bench", "labels": {"site": "bench"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = d["device_token"].as_str().unwrap().to_string();
        let s: serde_json::Value = c
            .post(a.url(&format!("{DEV}/sessions")))
            .bearer_auth(&token)
            .json(&json!({"device_id": d["id"]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (d["id"].as_u64().unwrap(), token, s["id"].as_u64().unwrap())
    });
    let dir = tempfile::tempdir().unwrap();
    let lua = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        Some(p.display().to_string())
    };
    // Each request to the next of the sessions.
    let paths: Vec<String> = sessions
        .iter()
        .map(|sid| lua_string(&format!("{DEV}/sessions/{sid}/logs")))
        .collect();
    let ingest = |body: &str| {
        format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = {}\nlocal paths = {{{}}}\nlocal n = math.random(0, 63)\nfunction request()\n  n = n + 1\n  return wrk.format(nil, paths[(n % #paths) + 1])\nend\n",
            lua_string(body),
            paths.join(", ")
        )
    };
    let body = std::fs::read(format!(
        "{}/tests/payloads/pull_request.opened.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let sig = fleetops_testkit::sign(harness::WEBHOOK_SECRET, &body);
    let body_path = dir.path().join("body.json");
    std::fs::write(&body_path, &body).unwrap();
    let deliver = format!(
        r#"local f = io.open("{}", "rb")
local body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Host-Event"] = "pull_request"
wrk.headers["X-Hub-Signature-256"] = "{sig}"
local counter = 0
local prefix = 0
function init(args)
  math.randomseed(os.time() + math.random(0, 1000000))
  prefix = math.random(0, 2147483647)
end
function request()
  counter = counter + 1
  wrk.headers["X-Host-Delivery"] = string.format("%08x-%04x-4%03x-a%03x-%012x", prefix,
    math.random(0, 65535), math.random(0, 4095), math.random(0, 4095), counter)
  return wrk.format(nil, nil, nil, nil)
end
"#,
        body_path.display()
    );
    let loads = [
        Load {
            name: "GET device (API key)",
            path: format!("{DEV}/devices/{device}"),
            headers: vec![format!("Authorization: Bearer {key}")],
            script: None,
            per_request: 1.0,
        },
        Load {
            name: "webhook deliveries (durable 202)",
            path: "/api/v1/scm/webhooks".into(),
            headers: Vec::new(),
            script: lua("deliver.lua", deliver),
            per_request: 1.0,
        },
        Load {
            name: "log lines, 10-line batches to 64 sessions (durable 202)",
            path: format!("{DEV}/sessions/{}/logs", sessions[0]),
            headers: vec![format!("Authorization: Bearer {key}")],
            script: lua(
                "ingest10.lua",
                ingest(&serde_json::to_string(&batch(10, 0)).unwrap()),
            ),
            per_request: 10.0,
        },
        Load {
            name: "log lines, 1,000-line batches to 64 sessions (durable 202)",
            path: format!("{DEV}/sessions/{}/logs", sessions[0]),
            headers: vec![format!("Authorization: Bearer {key}")],
            script: lua(
                "ingest1000.lua",
                ingest(&serde_json::to_string(&batch(1000, 0)).unwrap()),
            ),
            per_request: 1000.0,
        },
    ];
    let measure = |nodes: &[&harness::Node]| -> Vec<(f64, f64, f64, u64, f64)> {
        let bases: Vec<&str> = nodes.iter().map(|n| n.base.as_str()).collect();
        loads
            .iter()
            .map(|l| {
                run(&bases, l, conns, 2); // warm-up
                let cpu0: f64 = nodes
                    .iter()
                    .map(|n| cpu_seconds_of(&n.pid().to_string()))
                    .sum();
                let (rps, p50, p99, non2xx) = run(&bases, l, conns, secs);
                let cpu1: f64 = nodes
                    .iter()
                    .map(|n| cpu_seconds_of(&n.pid().to_string()))
                    .sum();
                let per_req_ms = 1000.0 * (cpu1 - cpu0) / (rps * secs as f64).max(1.0);
                // Only what was accepted counts.
                let ok = (rps - non2xx as f64 / secs as f64).max(0.0);
                (ok * l.per_request, p50, p99, non2xx, per_req_ms)
            })
            .collect()
    };
    let one = measure(&[&a]);
    let b = engines.node("b");
    let two = measure(&[&a, &b]);

    println!();
    println!(
        "engines: PostgreSQL (fsync on; the disk's fsync {:.2} ms), moto, nats-server; {conns} connections, {secs} s each; bare hyper {:.0} req/s",
        fsync_latency_ms(&std::env::temp_dir(), 50),
        base.requests_per_sec
    );
    println!(
        "| load | nodes | accepted per second | % of bare hyper | p50 ms | p99 ms | non-2xx | node CPU ms per request |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, l) in loads.iter().enumerate() {
        for (n, r) in [(1, &one[i]), (2, &two[i])] {
            println!(
                "| {} | {n} | {:.0} | {:.1}% | {:.2} | {:.2} | {} | {:.3} |",
                l.name,
                r.0,
                100.0 * r.0 / l.per_request / base.requests_per_sec,
                r.1,
                r.2,
                r.3,
                r.4
            );
        }
    }
}
