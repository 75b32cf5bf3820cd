//! A data directory below `[storage] min_free_bytes` (set above the free space, so no disk is
//! filled): writes are 507 with the contract's envelope and write nothing; reads, exports,
//! deletes and signing in go on; the free space is on `/metrics`.

use serde_json::json;

use crate::common::*;
use crate::sessions::{device, session};

const FLOOR: u64 = u64::MAX / 2;

each_backend!(below_the_disk_floor_writes_are_507_and_reads_exports_and_deletes_go_on);
async fn below_the_disk_floor_writes_are_507_and_reads_exports_and_deletes_go_on() {
    let s = start().await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let r = s
        .post(&logs, &tok, json!([{"level": "info", "message": "before"}]))
        .await;
    assert_eq!(r.status, 202);
    let s = s.restart_with(|c| c.storage.min_free_bytes = FLOOR).await;
    let key = s.key().to_string();

    // Writes through every kind of credential: refused, nothing written.
    let r = s
        .post(&logs, &tok, json!([{"level": "info", "message": "after"}]))
        .await;
    let detail = r.assert_error(507);
    assert!(detail.contains("min_free_bytes"), "{detail}");
    let r = s
        .post(&format!("{DEV}/devices"), &key, json!({"name": "r2"}))
        .await;
    r.assert_error(507);
    let r = s
        .post(
            &format!("{DEV}/devices/{d}/heartbeat"),
            &tok,
            json!({"metrics": {"cpu": 1.0}}),
        )
        .await;
    r.assert_error(507);
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/a.txt")))
                .bearer_auth(&key)
                .body("x"),
        )
        .await;
    r.assert_error(507);
    let r = s
        .raw(
            s.http
                .post(s.url("/api/v1/scm/webhooks"))
                .header("x-github-event", "ping")
                .header("x-github-delivery", "d-1")
                .body("{}"),
        )
        .await;
    r.assert_error(507);
    // The caller is checked first: a bad credential is still 401.
    let r = s.post(&logs, "fops_not-a-key", json!([])).await;
    r.assert_error(401);

    // Reads, exports, sign-in and deletes go on.
    let r = s.get(&format!("{logs}?limit=10"), &key).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 1);
    assert_eq!(r.body["items"][0]["message"], "before");
    let r = s
        .http
        .get(s.url(&format!("{logs}/export?format=csv")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("before"));
    let r = s
        .http
        .post(s.url("/api/v1/auth/login"))
        .json(&json!({"email": "admin@localhost", "password": ADMIN_PASSWORD}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        s.metric("fleetops_data_dir_min_free_bytes").await,
        FLOOR as f64
    );
    assert!(s.metric("fleetops_data_dir_free_bytes").await > 0.0);
    let r = s.delete(&format!("{DEV}/sessions/{sid}"), &key).await;
    assert_eq!(r.status, 204);

    // With the floor lowered, the refused writes go through as if never tried.
    let s = s.restart_with(|c| c.storage.min_free_bytes = 0).await;
    let r = s
        .post(&format!("{DEV}/devices"), s.key(), json!({"name": "r2"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s.get(&format!("{DEV}/devices/{d}"), s.key()).await;
    assert_eq!(r.body["metrics"], json!({}), "{}", r.body);
}

const RULES: &str = "/api/v1/organizations/default/projects/default/alert-rules";

/// Writes `mb` MiB of real (non-sparse) bytes to `path`, so the file system's free space
/// falls by that much.
fn fill(path: &std::path::Path, mb: usize) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block = vec![0x5au8; 1 << 20];
    for _ in 0..mb {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
}

each_backend!(a_disk_space_rule_fires_a_server_alert_when_free_space_falls_and_resolves_when_freed);
async fn a_disk_space_rule_fires_a_server_alert_when_free_space_falls_and_resolves_when_freed() {
    // The data directory on a file system of its own, so only this test moves its free space
    // (a shared disk's free space moves with every other test and machine on it). Where
    // mounting is not allowed, the host's disk with margins other writes rarely come near.
    let small = fleetops_testkit::tmpfs::Tmpfs::mount(192);
    let (margin, ballast_mib) = match &small {
        Ok(_) => (24u64 << 20, 64),
        Err(e) => {
            eprintln!("{e}; watching the host disk instead");
            (256u64 << 20, 768)
        }
    };
    let data = small.as_ref().ok().map(|t| t.join("data"));
    let sink = crate::peers::Sink::start().await;
    let s = start_with(|c| {
        crate::evaluation::fast(c);
        if let Some(d) = data {
            c.data_dir = d;
            // Below the default floor of 256 MiB: the writes this test makes are not refused.
            c.storage.min_free_bytes = 0;
        }
    })
    .await;
    let hook = crate::evaluation::webhook(&s, &sink).await;
    // The threshold sits `margin` under today's free space; the ballast takes it as far again
    // below it.
    let free = s.metric("fleetops_data_dir_free_bytes").await as u64;
    assert!(
        free > (ballast_mib + 64) << 20,
        "{free} bytes free: too few for this test's ballast"
    );
    let below = free - margin;
    let id = crate::evaluation::rule(
        &s,
        hook,
        json!({"type": "disk_space", "below_bytes": below, "duration_seconds": 0}),
    )
    .await;
    let r = s.get(&format!("{RULES}/{id}"), s.key()).await;
    assert_eq!(
        r.body["condition"],
        json!({"type": "disk_space", "below_bytes": below, "duration_seconds": 0})
    );
    // Absent for a dozen evaluation ticks while the space is above the threshold.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    assert_eq!(crate::evaluation::alerts(&s, "").await["total"], 0);

    let ballast = match &small {
        Ok(t) => t.join("ballast"),
        Err(_) => s._dir.path().join("ballast"),
    };
    fill(&ballast, ballast_mib as usize);
    let l = crate::evaluation::wait_alerts(&s, "state=firing", 1).await;
    let a = &l["items"][0];
    assert_eq!(a["rule_id"], id);
    assert_eq!(a["device_id"], serde_json::Value::Null);
    assert_eq!(a["provenance"], serde_json::Value::Null);
    let summary = a["summary"].as_str().unwrap();
    assert!(
        summary.contains("data directory") && summary.contains(&format!("below {below}")),
        "{summary}"
    );
    let got = sink.wait_for(1).await;
    assert_eq!(got[0].header("x-fleetops-event"), Some("alert.firing"));
    assert_eq!(got[0].json()["device_id"], serde_json::Value::Null);

    std::fs::remove_file(&ballast).unwrap();
    crate::evaluation::wait_alerts(&s, "state=resolved", 1).await;
    let got = sink.wait_for(2).await;
    assert_eq!(got[1].header("x-fleetops-event"), Some("alert.resolved"));
    assert_eq!(crate::evaluation::alerts(&s, "").await["total"], 1);
    // The server stops before its file system is unmounted.
    drop(s);
}

each_backend!(only_a_superuser_writes_a_disk_space_condition);
async fn only_a_superuser_writes_a_disk_space_condition() {
    let s = start().await;
    let admin = s.member_key("admin").await;
    let cond = json!({"type": "disk_space", "below_bytes": 1_000_000, "duration_seconds": 60});
    let r = s
        .post(
            RULES,
            &admin,
            json!({"name": "disk", "condition": cond, "severity": "critical"}),
        )
        .await;
    assert_eq!(r.assert_error(403), "Not enough permissions");
    let r = s
        .post(
            RULES,
            &admin,
            json!({"name": "hot", "condition": {"type": "metric_threshold", "metric": "t", "operator": "gt", "threshold": 1.0, "duration_seconds": 0}, "severity": "warning"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let hot = r.body["id"].as_u64().unwrap();
    let r = s
        .patch(
            &format!("{RULES}/{hot}"),
            &admin,
            json!({"condition": cond}),
        )
        .await;
    assert_eq!(r.assert_error(403), "Not enough permissions");

    // The superuser may; an admin may then rename it or route it.
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "disk", "condition": cond, "severity": "critical"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let disk = r.body["id"].as_u64().unwrap();
    let r = s
        .patch(
            &format!("{RULES}/{disk}"),
            &admin,
            json!({"name": "data disk"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["condition"], cond);

    // Checked like any condition, and never backtested (free space has no history).
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "zero", "condition": {"type": "disk_space", "below_bytes": 0}, "severity": "critical"}),
        )
        .await;
    r.assert_error(422);
    let r = s
        .post(
            &format!("{RULES}/backtest"),
            s.key(),
            json!({"condition": cond}),
        )
        .await;
    let detail = r.assert_error(422);
    assert!(detail.contains("cannot be backtested"), "{detail}");
}
