//! kill -9 mid-rollout: the restarted server continues where the rollout stood.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::deployments::DEPS;

each_backend!(a_rollout_continues_where_it_stood_after_kill_9);
/// kill -9 of the real binary while a rollout is between phases: after the restart the
/// controller continues from the stored decisions (no phase started twice, none skipped).
async fn a_rollout_continues_where_it_stood_after_kill_9() {
    use crate::cli::{client, field, serve};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[pipeline]\nrollout_tick_ms = 50\n[tiers.free]\nrequests_per_minute = 10000000\n",
    )
    .unwrap();
    let mut p = serve(dir.path(), &[]);
    let c = client();
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let secret = field(&p.stdout, "project secret:").unwrap().to_string();
    let cap = crate::crash::publish(&c, &p.base, &secret, "nav", "1.0.0")
        .await
        .unwrap();
    let mut fleet = Vec::new();
    for i in 0..12 {
        let r: Value = c
            .post(format!("{}{DEV}/devices", p.base))
            .bearer_auth(&key)
            .json(&json!({"name": format!("k{i}"), "labels": {"fleet": "k"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        fleet.push(Robot::new(
            r["id"].as_u64().unwrap(),
            r["device_token"].as_str().unwrap().to_string(),
        ));
    }
    let r: Value = c
        .post(format!("{}{DEPS}", p.base))
        .bearer_auth(&key)
        .json(
            &json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
            "target_devices": [{"labels": {"fleet": "k"}}],
            "rollout": {"phases": [
                {"name": "canary", "devices": {"count": 3}, "min_wait_seconds": 1},
                {"name": "mid", "devices": {"count": 4}, "min_wait_seconds": 1},
                {"name": "rest", "devices": {"percent": 100}}
            ]}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let dep = r["id"].as_u64().unwrap();
    let act = c
        .post(format!("{}{DEPS}/{dep}/activate", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(act.status(), 200);
    let view = |base: String| {
        let (c, key) = (c.clone(), key.clone());
        async move {
            c.get(format!("{base}{DEPS}/{dep}/rollout"))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    // Follow it until the middle phase has started, then kill.
    let t = Instant::now();
    loop {
        for r in fleet.iter_mut() {
            r.cycle(&c, &p.base).await;
        }
        if view(p.base.clone()).await["current_phase"] == "mid" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "mid never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);
    let p = serve(dir.path(), &[]);
    let r = view(p.base.clone()).await;
    assert_eq!(r["current_phase"], "mid", "{r}");
    assert_eq!(r["state"], "running");
    let t = Instant::now();
    let r = loop {
        for r in fleet.iter_mut() {
            r.cycle(&c, &p.base).await;
        }
        let r = view(p.base.clone()).await;
        if r["state"] == "completed" {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "never completed: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let phases: Vec<&str> = r["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["canary", "mid", "rest", "rest"], "{r}");
    // The last phase passed only once every robot had reported.
    assert!(fleet.iter().all(|r| r.running == Some(dep)));
}
