//! kill -9 of the real binary after acknowledged writes, log batches, deliveries, artifacts and
//! rollouts, and a firing alert: the restart keeps every one.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::common::DEV;

each_backend!(kill_9_after_acknowledged_writes_then_restart_keeps_everything);
async fn kill_9_after_acknowledged_writes_then_restart_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let mut ids = Vec::new();
    for i in 0..20 {
        let r = c
            .post(format!("{}{DEV}/devices", p.base))
            .bearer_auth(&key)
            .json(&json!({"name": format!("d{i}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = r.json().await.unwrap();
        ids.push(v["id"].as_u64().unwrap());
    }
    let r = c
        .post(format!("{}{DEV}/device-groups", p.base))
        .bearer_auth(&key)
        .json(&json!({"name": "g", "device_ids": ids}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = c
        .post(format!("{}/api/v1/auth/login", p.base))
        .json(&json!({"email": "admin@localhost", "password": field(&p.stdout, "admin password:").unwrap()}))
        .send()
        .await
        .unwrap();
    let jwt: serde_json::Value = r.json().await.unwrap();
    let r = c
        .post(format!("{}/api/v1/auth/api-keys", p.base))
        .bearer_auth(jwt["access_token"].as_str().unwrap())
        .json(&json!({"name": "late"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let late: serde_json::Value = r.json().await.unwrap();
    // SIGKILL right after the last acknowledgement: no graceful flush.
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);

    let p = serve(dir.path(), &[]);
    let r = c
        .get(format!("{}{DEV}/devices?page_size=100", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["total"], 20);
    let r = c
        .get(format!("{}{DEV}/device-groups", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["items"][0]["device_ids"].as_array().unwrap().len(), 20);
    let r = c
        .get(format!("{}/api/v1/users/me", p.base))
        .bearer_auth(late["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // New ids continue after the old ones.
    let r = c
        .post(format!("{}{DEV}/devices", p.base))
        .bearer_auth(&key)
        .json(&json!({"name": "new"}))
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["id"].as_u64().unwrap() > *ids.iter().max().unwrap());
}

each_backend!(kill_9_after_acknowledged_log_batches_keeps_every_line);
async fn kill_9_after_acknowledged_log_batches_keeps_every_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let r = c
        .post(format!("{}{DEV}/devices", p.base))
        .bearer_auth(&key)
        .json(&json!({"name": "d"}))
        .send()
        .await
        .unwrap();
    let d: serde_json::Value = r.json().await.unwrap();
    let r = c
        .post(format!("{}{DEV}/sessions", p.base))
        .bearer_auth(d["device_token"].as_str().unwrap())
        .json(&json!({"device_id": d["id"]}))
        .send()
        .await
        .unwrap();
    let sess: serde_json::Value = r.json().await.unwrap();
    let sid = sess["id"].as_u64().unwrap();
    // Concurrent batches, each acknowledged 202, then SIGKILL at once.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (c, url, key) = (
            c.clone(),
            format!("{}{DEV}/sessions/{sid}/logs", p.base),
            key.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let batch: Vec<_> = (0..500)
                .map(|j| json!({"level": "info", "message": format!("line {i}-{j}")}))
                .collect();
            c.post(url)
                .bearer_auth(key)
                .json(&batch)
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 202);
    }
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);

    let p = serve(dir.path(), &[]);
    let r = c
        .get(format!(
            "{}{DEV}/sessions/{sid}/logs?limit=1&search=line",
            p.base
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["total"], 16 * 500);
    // The session is still active and takes more lines after the restart.
    let r = c
        .post(format!("{}{DEV}/sessions/{sid}/logs", p.base))
        .bearer_auth(&key)
        .json(&json!([{"level": "info", "message": "after"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = c
        .get(format!("{}{DEV}/sessions/{sid}", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["metrics"]["log_count"], 16 * 500 + 1);
}

each_backend!(kill_9_between_202_and_processing_then_every_delivery_is_processed_once);
/// Deliveries answered 202 and then a kill -9 (most are still queued for the worker): after
/// the restart every one is processed, exactly once.
async fn kill_9_between_202_and_processing_then_every_delivery_is_processed_once() {
    use crate::webhooks::{SECRET, pr, sign};
    let dir = tempfile::tempdir().unwrap();
    let env = [("FLEETOPS_SCM_WEBHOOK_SECRET", SECRET)];
    let mut p = serve(dir.path(), &env);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let r = c
        .post(format!("{}{DEV}/repositories", p.base))
        .bearer_auth(&key)
        .json(&json!({"full_name": "Codertocat/Hello-World"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let n = 300u64;
    let mut tasks = Vec::new();
    for i in 0..n {
        let body = serde_json::to_vec(&pr("opened", i + 1, &format!("{i:040}"), false)).unwrap();
        let (c, url) = (c.clone(), format!("{}/api/v1/scm/webhooks", p.base));
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .header("X-Host-Event", "pull_request")
                .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                .header("X-Hub-Signature-256", sign(SECRET, &body))
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 202);
    }
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);

    let p = serve(dir.path(), &env);
    let total = |q: &'static str| {
        let (c, url, key) = (c.clone(), format!("{}{q}", p.base), key.clone());
        async move {
            let v: serde_json::Value = c
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["total"].as_u64().unwrap_or(0)
        }
    };
    assert!(
        crate::common::eventually(30, || async {
            total("/api/v1/scm/deliveries?outcome=dispatched&page_size=1").await == n
        })
        .await,
        "not every accepted delivery was processed"
    );
    assert_eq!(total("/api/v1/scm/deliveries?outcome=queued").await, 0);
    assert_eq!(
        total("/api/v1/organizations/default/projects/default/test-runs?page_size=1").await,
        n
    );
    assert_eq!(
        total("/api/v1/scm/deliveries?reason=duplicate_job").await,
        0
    );
}

each_backend!(kill_9_keeps_artifacts_transitions_rollouts_and_owed_validations);
/// kill -9 right after acknowledged artifacts, a deployment transition, a rollout result and
/// a capsule confirm answered 202 `pending`: after the restart all of them are there, and the
/// owed validation finishes.
async fn kill_9_keeps_artifacts_transitions_rollouts_and_owed_validations() {
    use crate::capsules::{archive, sha};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[pipeline]\nsync_validation_max_bytes = 64\n",
    )
    .unwrap();
    let mut p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let secret = field(&p.stdout, "project secret:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let caps = format!("{base}/api/v1/projects/default/default/capsules");
    let publish = |name: &'static str, bytes: Vec<u8>| {
        let (c, caps, secret) = (c.clone(), caps.clone(), secret.clone());
        async move {
            let r: serde_json::Value = c
                .post(format!("{caps}/upload-url"))
                .header("X-Project-Secret", &secret)
                .json(
                    &json!({"name": name, "version": "1.0.0", "capsule_type": "SW",
                    "file_format": ".tar", "file_size_bytes": bytes.len()}),
                )
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let id = r["capsule_id"].as_u64().unwrap();
            let put = c
                .put(r["upload_url"].as_str().unwrap())
                .body(bytes.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(put.status(), 200);
            let r = c
                .post(format!("{caps}/{id}/confirm"))
                .header("X-Project-Secret", &secret)
                .json(&json!({"checksum_sha256": sha(&bytes)}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
            id
        }
    };
    let status_of = |base: String, id: u64| {
        let (c, key) = (c.clone(), key.clone());
        async move {
            let v: serde_json::Value = c
                .get(format!(
                    "{base}/api/v1/projects/default/default/capsules/{id}"
                ))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["validation_status"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
    };
    let small = publish("nav", archive(".tar", b"small")).await;
    assert!(
        crate::common::eventually(10, || async {
            status_of(base.clone(), small).await == "passed"
        })
        .await
    );
    // A device, a session and an artifact.
    let r: serde_json::Value = c
        .post(format!("{base}{DEV}/devices"))
        .bearer_auth(&key)
        .json(&json!({"name": "r1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (device, token) = (
        r["id"].as_u64().unwrap(),
        r["device_token"].as_str().unwrap().to_string(),
    );
    let r: serde_json::Value = c
        .post(format!("{base}{DEV}/sessions"))
        .bearer_auth(&token)
        .json(&json!({"device_id": device}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = r["id"].as_u64().unwrap();
    let r = c
        .put(format!("{base}{DEV}/sessions/{sid}/files/run/trace.bin"))
        .bearer_auth(&token)
        .body(vec![42u8; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // A deployment activated, and a rollout result.
    let deps = format!("{base}/api/v1/projects/default/default/deployments");
    let r: serde_json::Value = c
        .post(&deps)
        .bearer_auth(&key)
        .json(
            &json!({"name": "d", "composition_tag": "registry.example/nav:1.0.0",
            "capsule_id": small, "target_devices": [device]}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let dep = r["id"].as_u64().unwrap();
    let r = c
        .post(format!("{deps}/{dep}/activate"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(format!("{deps}/{dep}/device-status"))
        .bearer_auth(&token)
        .json(&json!({"device_id": device, "status": "succeeded"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // A capsule large enough that its validation is still running at the kill.
    let noise = crate::common::noise(&mut 0x9e37_79b9_7f4a_7c15u64, 48 << 20);
    let big = publish("big", archive(".tar", &noise)).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);
    {
        let store = crate::common::open_store(dir.path());
        let owed = store.pending_validations().unwrap();
        assert_eq!(owed.len(), 1, "the 202 recorded the owed validation");
        assert_eq!(owed[0].1, big);
    }

    let p = serve(dir.path(), &[]);
    let base = p.base.clone();
    let r = c
        .get(format!("{base}{DEV}/sessions/{sid}/files/run/trace.bin"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 100_000);
    let v: serde_json::Value = c
        .get(format!(
            "{base}/api/v1/projects/default/default/deployments/{dep}"
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["deployment_status"], "active", "{v}");
    assert_eq!(v["device_results"], json!({"succeeded": 1, "failed": 0}));
    assert!(
        crate::common::eventually(60, || async {
            status_of(base.clone(), big).await == "passed"
        })
        .await,
        "the owed validation finished after the restart"
    );
}

each_backend!(kill_9_while_an_alert_fires_and_its_notification_is_owed);
/// `kill -9` while an alert fires and its notification is owed (the target answered 503):
/// the restarted server keeps the alert firing without firing it again, sends the owed
/// notification once its retry is due, and resolves the same alert on the next heartbeat.
async fn kill_9_while_an_alert_fires_and_its_notification_is_owed() {
    use crate::peers::{Reply, Sink};
    let sink = Sink::start().await;
    sink.script([Reply::Status(503, vec![])]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[devices]\noffline_after_seconds = 1\n\
         [alerts]\nallow_private_targets = true\ntick_ms = 50\nretry_base_ms = 5000\nmax_attempts = 5\n\
         [tiers.enterprise]\nrequests_per_minute = 100000\n",
    )
    .unwrap();
    let mut p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let post = |base: String, path: String, cred: String, body: serde_json::Value| {
        post_json(c.clone(), format!("{base}{path}"), cred, body)
    };
    let (st, hook) = post(
        p.base.clone(),
        format!("{DEV}/integrations"),
        key.clone(),
        json!({"type": "webhook", "name": "w", "config": {"url": sink.url("/a"), "signing_secret": "s"}}),
    )
    .await;
    assert_eq!(st, 201, "{hook}");
    let (st, _) = post(
        p.base.clone(),
        format!("{DEV}/alert-rules"),
        key.clone(),
        json!({"name": "down", "severity": "critical", "integration_ids": [hook["id"]],
               "condition": {"type": "device_status", "status": "offline", "duration_seconds": 0}}),
    )
    .await;
    assert_eq!(st, 201);
    let (_, dev) = post(
        p.base.clone(),
        format!("{DEV}/devices"),
        key.clone(),
        json!({"name": "r1"}),
    )
    .await;
    let (d, token) = (
        dev["id"].as_u64().unwrap(),
        dev["device_token"].as_str().unwrap().to_string(),
    );
    let beat = |base: String| {
        post(
            base,
            format!("{DEV}/devices/{d}/heartbeat"),
            token.clone(),
            json!({}),
        )
    };
    assert_eq!(beat(p.base.clone()).await.0, 202);
    let alerts = |base: String| {
        let (c, key) = (c.clone(), key.clone());
        async move {
            c.get(format!("{base}{DEV}/alerts"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    // Fired, and its first attempt refused (503): owed, retry due 5 s later.
    let base = p.base.clone();
    assert!(
        crate::common::eventually(10, || async {
            alerts(base.clone()).await["items"][0]["notifications"][0]["last_error"] == "HTTP 503"
        })
        .await
    );
    let first = alerts(base.clone()).await["items"][0].clone();
    assert_eq!(first["notifications"][0]["pending"], true);
    // The attempt is visible as soon as it is written; give its group commit a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    assert_eq!(sink.count(), 1);

    let p = serve(dir.path(), &[]);
    let base = p.base.clone();
    assert!(
        crate::common::eventually(20, || async {
            alerts(base.clone()).await["items"][0]["notifications"][0]["success"] == true
        })
        .await,
        "the owed notification was sent after the restart"
    );
    let l = alerts(base.clone()).await;
    assert_eq!(l["total"], 1, "not fired again: {l}");
    assert_eq!(l["items"][0]["id"], first["id"]);
    assert_eq!(l["items"][0]["state"], "firing");
    assert_eq!(l["items"][0]["notifications"][0]["attempts"], 2);
    let got = sink.wait_for(2).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
    // Back online: the same alert resolves.
    assert_eq!(beat(base.clone()).await.0, 202);
    assert!(
        crate::common::eventually(10, || async {
            alerts(base.clone()).await["items"][0]["state"] == "resolved"
        })
        .await
    );
    assert_eq!(alerts(base.clone()).await["total"], 1);
}
