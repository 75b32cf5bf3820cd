//! Issue 8's list figures: page 1 of the device, organization device, session and delivery
//! lists, filtered and not, with BENCH_RECORDS (default 1,000,000) devices, sessions and
//! deliveries in one project, next to a bare hyper hello-world in the same run.
//!
//! The records are written straight into the store (through the same typed writes the actors
//! use, so their list entries and counters are the real ones), then the server answers.
//! 1% of the devices are online; the rest were seen a day ago or never.
//!
//! Run: `cargo bench --bench lists` (needs `wrk`). Knobs: BENCH_RECORDS, BENCH_SECS
//! (default 5), BENCH_CONNECTIONS (default 4), BENCH_BACKEND (`postgres`: seeded on sled,
//! copied into the bench's PostgreSQL cluster as `admin migrate` copies, then served there).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Instant;

use fleetops_storage::{Delivery, DeliveryOutcome, Device, Session, SessionStatus};
use support::*;

/// Ids far above what the server hands out, so nothing it creates collides.
const BASE: u64 = 1 << 40;

fn main() {
    let n = env_u32("BENCH_RECORDS", 1_000_000) as u64;
    let secs = env_u32("BENCH_SECS", 5);
    let conns = env_u32("BENCH_CONNECTIONS", 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("machine: {}", machine());

    let (addr, task) = rt.block_on(start_baseline());
    wrk(&format!("http://{addr}/"), &[], conns, 1, None);
    let base = wrk(&format!("http://{addr}/"), &[], conns, secs, None);
    task.abort();

    // Seeded on sled either way: a million listed writes one at a time would take hours on
    // PostgreSQL. For BENCH_BACKEND=postgres the seeded store is then moved into the
    // database with `admin migrate`'s copy, as an operator would move it, and served there.
    let on_postgres = backend() == "postgres";
    let (running, key, url, data) = rt.block_on(start_fleetops_with(|c| c.database.url.clear()));
    let proj = "/api/v1/organizations/default/projects/default";
    let store = running.runtime.store().clone();
    let org = store.org_by_slug("default").unwrap().unwrap();
    let pid = store
        .project_by_slug(org.id, "default")
        .unwrap()
        .unwrap()
        .id;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;

    let t = Instant::now();
    for i in 0..n {
        let d = Device {
            id: BASE + i,
            project_id: pid,
            name: format!("robot-{}", i % 1000),
            labels: BTreeMap::new(),
            token_hash: {
                let mut h = [0u8; 32];
                h[..8].copy_from_slice(&(BASE + i).to_be_bytes());
                h
            },
            created_at: now - (n - i) as i64,
            last_seen_at: match i % 100 {
                0 => Some(now),
                1..=49 => Some(now - 86_400_000),
                _ => None,
            },
            metrics: BTreeMap::new(),
        };
        store.insert_device(&d).unwrap();
    }
    let devices_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        let s = Session {
            id: BASE + i,
            project_id: pid,
            device_id: BASE + i % 100,
            device_name: "robot".into(),
            status: match i % 10 {
                0 => SessionStatus::Active,
                1 => SessionStatus::Failed,
                _ => SessionStatus::Completed,
            },
            started_at: now - (n - i) as i64,
            ended_at: None,
            tags: Vec::new(),
            package_id: None,
        };
        store.put_session(&s).unwrap();
    }
    let sessions_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let mut batch: Vec<(Delivery, Option<bytes::Bytes>)> = (i..(i + 1000).min(n))
            .map(|j| {
                let mut d = Delivery::received(
                    BASE + j,
                    format!("00000000-0000-4000-8000-{j:012}"),
                    "push".into(),
                    now - (n - j) as i64,
                    false,
                    0,
                );
                d.project_id = Some(pid);
                if j % 3 == 0 {
                    d.outcome = DeliveryOutcome::Processed;
                    d.reason = None;
                }
                (d, None)
            })
            .collect();
        store.claim_deliveries(&mut batch, i64::MAX).unwrap();
        i += 1000;
    }
    let deliveries_s = t.elapsed().as_secs_f64();
    println!(
        "seeded {n} devices in {devices_s:.0} s, {n} sessions in {sessions_s:.0} s, {n} deliveries in {deliveries_s:.0} s; sled on disk {:.0} MB",
        store.size_on_disk().unwrap() as f64 / 1e6
    );
    let (running, url, store) = if on_postgres {
        rt.block_on(running.stop());
        drop(store);
        let t = Instant::now();
        let database = bench_cluster().database();
        // sled's flusher may hold its lock a moment after the server stopped.
        let sled = (0..100)
            .find_map(|_| {
                let s = fleetops_storage::Store::open(&data.path().join("data")).ok();
                if s.is_none() {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                s
            })
            .expect("the stopped server's store opens");
        let report = sled.copy_to_postgres(&database).unwrap();
        drop(sled);
        println!(
            "copied into PostgreSQL in {:.0} s: {report:?}",
            t.elapsed().as_secs_f64()
        );
        let (running, url) = rt.block_on(restart_fleetops(&data, &database));
        let store = running.runtime.store().clone();
        (running, url, store)
    } else {
        (running, url, store)
    };

    // The 1% that should be online beat now (seeding took longer than the offline window).
    let beat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for i in (0..n).step_by(100) {
        let mut d = store.device(pid, BASE + i).unwrap().unwrap();
        d.last_seen_at = Some(beat);
        store.heartbeat_device(&d, false).unwrap();
    }
    let auth = vec![format!("Authorization: Bearer {key}")];
    let lists = [
        ("devices", format!("{proj}/devices")),
        (
            "devices ?status=online (1%)",
            format!("{proj}/devices?status=online"),
        ),
        (
            "devices ?status=offline (99%)",
            format!("{proj}/devices?status=offline"),
        ),
        (
            "devices ?name= (0.1%)",
            format!("{proj}/devices?name=robot-7"),
        ),
        (
            "devices ?name=&status=online",
            format!("{proj}/devices?name=robot-700&status=online"),
        ),
        ("devices page 100", format!("{proj}/devices?page=100")),
        (
            "org devices ?status=online",
            "/api/v1/organizations/default/devices?status=online".to_string(),
        ),
        ("sessions", format!("{proj}/sessions")),
        (
            "sessions ?status=failed",
            format!("{proj}/sessions?status=failed"),
        ),
        (
            "sessions ?device_id=",
            format!("{proj}/sessions?device_id={}", BASE + 7),
        ),
        (
            "sessions ?device_id=&status=active",
            format!("{proj}/sessions?device_id={}&status=active", BASE + 10),
        ),
        ("project deliveries", format!("{proj}/webhook-deliveries")),
        (
            "deliveries ?outcome=processed",
            "/api/v1/scm/deliveries?outcome=processed".to_string(),
        ),
    ];
    println!();
    println!("| list (page 1, 50 items, {n} records) | requests/s | p50 ms | p99 ms | non-2xx |");
    println!("|---|---|---|---|---|");
    println!(
        "| bare hyper hello-world | {:.0} | {:.2} | {:.2} | {} |",
        base.requests_per_sec, base.p50_ms, base.p99_ms, base.non_2xx
    );
    for (name, path) in &lists {
        let u = format!("{url}{path}");
        wrk(&u, &auth, conns, 1, None);
        let r = wrk(&u, &auth, conns, secs, None);
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} |",
            r.requests_per_sec, r.p50_ms, r.p99_ms, r.non_2xx
        );
    }
    println!("{conns} connections, {secs} s each");
    println!("{}", rt.block_on(poll_summary(&url)));
    rt.block_on(running.stop());
}
