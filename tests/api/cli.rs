//! The binary itself: first-start credentials, `admin bootstrap`, a locked data directory, and
//! a kill -9 right after acknowledged writes followed by a restart on the same data.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::common::DEV;

const BIN: &str = env!("CARGO_BIN_EXE_fleetops");

pub(crate) struct Proc {
    pub child: Child,
    pub base: String,
    pub stdout: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `fleetops serve` on port 0 and reads stdout up to the listening line.
pub(crate) fn serve(dir: &std::path::Path, extra_env: &[(&str, &str)]) -> Proc {
    let stderr = match std::env::var_os("FLEETOPS_TEST_STDERR") {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap(),
        ),
        None => Stdio::null(),
    };
    serve_with_stderr(dir, extra_env, stderr)
}

/// As [`serve`], its standard error (the tracing log) going to `stderr`.
fn serve_with_stderr(dir: &std::path::Path, extra_env: &[(&str, &str)], stderr: Stdio) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .current_dir(dir)
        .env("FLEETOPS_LISTEN", "127.0.0.1:0")
        .env("FLEETOPS_DATA_DIR", dir.join("data"))
        .envs(crate::common::backend_env(dir))
        .env("FLEETOPS_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(stderr);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut stdout = Vec::new();
    let mut base = String::new();
    for _ in 0..50 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let line = line.trim_end().to_string();
        if let Some(addr) = line.strip_prefix("fleetops: listening on ") {
            base = addr.to_string();
            stdout.push(line);
            break;
        }
        stdout.push(line);
    }
    assert!(!base.is_empty(), "no listening line in {stdout:?}");
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in reader.lines() {});
    Proc {
        child,
        base,
        stdout,
    }
}

pub(crate) fn field<'a>(lines: &'a [String], label: &str) -> Option<&'a str> {
    lines
        .iter()
        .find_map(|l| l.trim_start().strip_prefix(label).map(str::trim))
}

/// A JSON POST to a running binary: the status and the body (Null when not JSON).
async fn post_json(
    c: reqwest::Client,
    url: String,
    cred: String,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c
        .post(url)
        .bearer_auth(cred)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (
        status,
        r.json::<serde_json::Value>().await.unwrap_or_default(),
    )
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

each_backend!(first_start_prints_credentials_once_and_they_work);
async fn first_start_prints_credentials_once_and_they_work() {
    let dir = tempfile::tempdir().unwrap();
    let p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:")
        .expect("API key printed")
        .to_string();
    assert!(key.starts_with("fops_"));
    let password = field(&p.stdout, "admin password:")
        .expect("generated password printed")
        .to_string();
    assert!(field(&p.stdout, "project secret:").unwrap().len() >= 32);
    assert_eq!(field(&p.stdout, "admin email:"), Some("admin@localhost"));
    assert_eq!(field(&p.stdout, "organization:"), Some("default"));
    assert_eq!(field(&p.stdout, "project:"), Some("default"));

    let c = client();
    let r = c
        .get(format!("{}/api/v1/users/me", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(format!("{}/api/v1/auth/login", p.base))
        .json(&json!({"email": "admin@localhost", "password": password}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // No webhook secret configured: one was generated, printed once, and it verifies.
    let secret = field(&p.stdout, "webhook secret:")
        .expect("generated webhook secret printed")
        .to_string();
    assert!(secret.len() >= 32, "{secret}");
    let deliver = |secret: String, base: String| {
        let c = c.clone();
        async move {
            let body = br#"{"zen": "Design for failure."}"#.to_vec();
            c.post(format!("{base}/api/v1/scm/webhooks"))
                .header("X-GitHub-Event", "ping")
                .header("X-GitHub-Delivery", uuid::Uuid::new_v4().to_string())
                .header("X-Hub-Signature-256", crate::webhooks::sign(&secret, &body))
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(deliver(secret.clone(), p.base.clone()).await, 202);
    assert_eq!(deliver("guess".into(), p.base.clone()).await, 401);
    // The status view never shows it.
    let token: serde_json::Value = r.json().await.unwrap();
    let r = c
        .get(format!("{}/api/v1/scm/status", p.base))
        .bearer_auth(token["access_token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.text().await.unwrap().contains(&secret));
    drop(p);

    // The second start on the same data creates and prints nothing new.
    let p = serve(dir.path(), &[]);
    assert!(field(&p.stdout, "API key:").is_none(), "{:?}", p.stdout);
    assert!(
        field(&p.stdout, "webhook secret:").is_none(),
        "{:?}",
        p.stdout
    );
    assert_eq!(deliver(secret.clone(), p.base.clone()).await, 202);
    let r = c
        .get(format!("{}/api/v1/users/me", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

each_backend!(configured_admin_password_is_not_printed);
async fn configured_admin_password_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let p = serve(
        dir.path(),
        &[
            ("FLEETOPS_ADMIN_PASSWORD", "given-pass"),
            ("FLEETOPS_ADMIN_EMAIL", "ops@robots.io"),
        ],
    );
    assert!(field(&p.stdout, "admin password:").is_none());
    assert_eq!(field(&p.stdout, "admin email:"), Some("ops@robots.io"));
    let r = client()
        .post(format!("{}/api/v1/auth/login", p.base))
        .json(&json!({"email": "ops@robots.io", "password": "given-pass"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

each_backend!(admin_bootstrap_prints_one_json_object_and_refuses_a_locked_dir);
async fn admin_bootstrap_prints_one_json_object_and_refuses_a_locked_dir() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "admin",
            "bootstrap",
            "--email",
            "root@acme.io",
            "--password",
            "pw",
            "--org",
            "acme",
            "--project",
            "arms",
            "--tier",
            "team",
        ])
        .env("FLEETOPS_DATA_DIR", dir.path().join("data"))
        .envs(crate::common::backend_env(dir.path()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys.len(), 6, "{v}");
    assert_eq!(v["email"], "root@acme.io");
    assert_eq!(v["org"], "acme");
    assert_eq!(v["project"], "arms");
    assert!(v["user_id"].as_u64().is_some());
    assert!(v["project_secret"].as_str().unwrap().len() >= 32);
    let key = v["api_key"].as_str().unwrap().to_string();
    assert!(key.starts_with("fops_"));

    // A server on that data dir accepts the key and creates no default admin.
    let p = serve(dir.path(), &[]);
    assert!(field(&p.stdout, "API key:").is_none());
    let c = client();
    let r = c
        .get(format!(
            "{}/api/v1/organizations/acme/projects/arms/devices",
            p.base
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-limit"], "1000", "team tier");

    // While it runs, bootstrap refuses the locked data dir and changes nothing.
    let out = Command::new(BIN)
        .args([
            "admin",
            "bootstrap",
            "--email",
            "b@acme.io",
            "--password",
            "pw",
            "--org",
            "other",
            "--project",
            "p",
        ])
        .env("FLEETOPS_DATA_DIR", dir.path().join("data"))
        .envs(crate::common::backend_env(dir.path()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another fleetops process"), "{err}");
    let r = c
        .get(format!("{}/api/v1/organizations", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["items"].as_array().unwrap().len(), 1);
    drop(p);

    // A duplicate bootstrap is refused with a message.
    let out = Command::new(BIN)
        .args([
            "admin",
            "bootstrap",
            "--email",
            "root@acme.io",
            "--password",
            "pw",
            "--org",
            "acme2",
            "--project",
            "p",
        ])
        .env("FLEETOPS_DATA_DIR", dir.path().join("data"))
        .envs(crate::common::backend_env(dir.path()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
}

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

each_backend!(config_flag_before_or_after_the_subcommand);
async fn config_flag_before_or_after_the_subcommand() {
    for before in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            format!(
                "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog = \"warn\"\n[tiers.enterprise]\nrequests_per_minute = 7\n",
                dir.path().join("d").display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(BIN);
        if before {
            cmd.arg("--config").arg(&cfg).arg("serve");
        } else {
            cmd.arg("serve").arg("--config").arg(&cfg);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        let mut base = String::new();
        for _ in 0..20 {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 {
                break;
            }
            if let Some(a) = line.trim().strip_prefix("fleetops: listening on ") {
                base = a.to_string();
                break;
            }
            lines.push(line.trim().to_string());
        }
        let key = field(&lines, "API key:").unwrap().to_string();
        let r = client()
            .get(format!("{base}/api/v1/users/me"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()["x-ratelimit-limit"],
            "7",
            "the file's tier applies"
        );
        assert!(dir.path().join("d").exists());
        let _ = child.kill();
        let _ = child.wait();
    }
    // A missing config file is a clear error, not a silent default.
    let out = Command::new(BIN)
        .args(["--config", "/nonexistent/c.toml", "serve"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/c.toml"));
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

each_backend!(sigterm_finishes_in_flight_work_closes_websockets_1001_and_exits_0);
/// SIGTERM: the request in flight (its body still arriving) is finished and answered, an open
/// WebSocket closes with 1001, the process exits 0; deliveries accepted just before are worked
/// exactly once across the restart.
async fn sigterm_finishes_in_flight_work_closes_websockets_1001_and_exits_0() {
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;

    use crate::webhooks::{SECRET, pr, sign};
    let dir = tempfile::tempdir().unwrap();
    let env = [("FLEETOPS_SCM_WEBHOOK_SECRET", SECRET)];
    let mut p = serve(dir.path(), &env);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let r = c
        .post(format!("{base}{DEV}/repositories"))
        .bearer_auth(&key)
        .json(&json!({"full_name": "Codertocat/Hello-World"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let (token, sid) = device_and_session(&c, &base, &key).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs?token={key}",
        base.replace("http://", "ws://")
    ))
    .await
    .unwrap();
    let n = 50u64;
    for i in 0..n {
        let body = serde_json::to_vec(&pr("opened", i + 1, &format!("{i:040}"), false)).unwrap();
        let r = c
            .post(format!("{base}/api/v1/scm/webhooks"))
            .header("X-Host-Event", "pull_request")
            .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
            .header("X-Hub-Signature-256", sign(SECRET, &body))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    // A log batch whose head and half its body are in when SIGTERM comes.
    let batch = serde_json::to_vec(&json!([{"level": "info", "message": "in flight"}])).unwrap();
    let (first, rest) = batch.split_at(batch.len() / 2);
    let mut slow = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    slow.write_all(
        format!(
            "POST {DEV}/sessions/{sid}/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            batch.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    slow.write_all(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = std::time::Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    slow.write_all(rest).await.unwrap();
    let mut answer = vec![0u8; 1024];
    let got = tokio::time::timeout(Duration::from_secs(10), slow.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..got]).to_string();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let close = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = ws.next().await {
            if let Ok(Message::Close(frame)) = m {
                return frame.map(|f| u16::from(f.code));
            }
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(close, Some(1001));
    let status = loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "{status:?}");
    drop(p);

    let p = serve(dir.path(), &env);
    let total = |q: String| {
        let (c, key) = (c.clone(), key.clone());
        async move {
            let v: serde_json::Value = c
                .get(q)
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
    let base = p.base.clone();
    assert!(
        crate::common::eventually(30, || async {
            total(format!(
                "{base}/api/v1/scm/deliveries?outcome=dispatched&page_size=1"
            ))
            .await
                == n
        })
        .await
    );
    assert_eq!(
        total(format!("{base}{DEV}/test-runs?page_size=1")).await,
        n,
        "a delivery worked twice"
    );
    assert_eq!(
        total(format!(
            "{base}{DEV}/sessions/{sid}/logs?search=in%20flight&limit=1"
        ))
        .await,
        1
    );
}

each_backend!(json_log_format_writes_one_object_a_line);
/// `log_format = "json"`: every line of the tracing log is one JSON object with a timestamp,
/// a level and fields; secrets printed on first start never reach it.
async fn json_log_format_writes_one_object_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut p = serve_with_stderr(
        dir.path(),
        &[("FLEETOPS_LOG_FORMAT", "json"), ("FLEETOPS_LOG", "info")],
        Stdio::from(file),
    );
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let r = client()
        .get(format!("{}/healthz", p.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let killed = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(p.child.wait().unwrap().code(), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(lines.len() >= 2, "{text}");
    for l in &lines {
        assert!(l["timestamp"].is_string(), "{l}");
        assert!(l["level"].is_string(), "{l}");
        assert!(l["fields"].is_object(), "{l}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "listening" && l["fields"]["addr"].is_string()),
        "{text}"
    );
    assert!(!text.contains(&key), "the API key reached the log");
}

fn admin(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("admin")
        .args(args)
        .current_dir(dir)
        .env("FLEETOPS_DATA_DIR", dir.join("data"))
        .envs(crate::common::backend_env(dir))
        .env("FLEETOPS_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

each_backend!(backup_while_serving_then_restore_serves_the_copy);
/// `admin backup` while the server serves and log batches keep arriving (the server makes a
/// consistent copy), then `admin restore` into an empty data directory: the restored server
/// has every record and file acknowledged before the backup, its lists match its records,
/// and it serves. Offline, the same command copies directly; a destination that is not empty
/// and a restore over a data directory in use are refused.
async fn backup_while_serving_then_restore_serves_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (token, sid) = device_and_session(&c, &base, &key).await;
    let r = c
        .put(format!("{base}{DEV}/sessions/{sid}/files/a/trace.bin"))
        .bearer_auth(&token)
        .body(vec![7u8; 50_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let logs = format!("{base}{DEV}/sessions/{sid}/logs");
    let batch: Vec<_> = (0..100)
        .map(|i| json!({"level": "info", "message": format!("line {i}")}))
        .collect();
    for _ in 0..5 {
        let r = c
            .post(&logs)
            .bearer_auth(&token)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    // Batches keep coming while the backup is taken.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (c, logs, token, batch, stop) = (
            c.clone(),
            logs.clone(),
            token.clone(),
            batch.clone(),
            stop.clone(),
        );
        async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .post(&logs)
                    .bearer_auth(&token)
                    .json(&batch)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                n += 1;
            }
            n
        }
    });
    let backup = dir.path().join("backup");
    let (ok, out, err) = tokio::task::spawn_blocking({
        let (d, backup, base, key) = (
            dir.path().to_path_buf(),
            backup.clone(),
            base.clone(),
            key.clone(),
        );
        move || {
            admin(
                &d,
                &["backup", "--to", backup.to_str().unwrap(), "--url", &base],
                &[("FLEETOPS_TOKEN", &key)],
            )
        }
    })
    .await
    .unwrap();
    if crate::backend::on_postgres() {
        // The records are the database's to back up: refused with the reason, nothing made.
        assert!(
            !ok && err.contains("keeps its records in PostgreSQL"),
            "{out}{err}"
        );
        assert!(!backup.exists());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(writer.await.unwrap() > 0);
        return;
    }
    assert!(ok, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(report["keys"].as_u64().unwrap() > 0, "{report}");
    // Local blobs (sealed log segments among them) are in the copy.
    assert_eq!(report["not_included"], json!([]), "{report}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.await.unwrap() > 0);
    // Without a token, against a running server: refused with a reason.
    let (ok, _, err) = admin(
        dir.path(),
        &["backup", "--to", dir.path().join("b2").to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("--token"), "{err}");
    // Not a superuser's key: 403 from the server.
    let member = c
        .post(format!("{base}/api/v1/admin/backup"))
        .bearer_auth(&token)
        .json(&json!({"to": dir.path().join("b3")}))
        .send()
        .await
        .unwrap();
    assert_eq!(member.status(), 403);
    // A destination inside the data directory: 422.
    let inside = c
        .post(format!("{base}/api/v1/admin/backup"))
        .bearer_auth(&key)
        .json(&json!({"to": dir.path().join("data/b")}))
        .send()
        .await
        .unwrap();
    assert_eq!(inside.status(), 422);
    drop(p);

    // Restore into a second directory and serve it.
    let other = tempfile::tempdir().unwrap();
    let (ok, out, err) = admin(
        other.path(),
        &["restore", "--from", backup.to_str().unwrap()],
        &[],
    );
    assert!(ok, "{out}{err}");
    {
        let store = crate::common::open_store(other.path());
        assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    }
    let p = serve(other.path(), &[]);
    let base = p.base.clone();
    let r = c
        .get(format!("{base}{DEV}/sessions/{sid}/files/a/trace.bin"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 50_000);
    let v: serde_json::Value = c
        .get(format!("{base}{DEV}/sessions/{sid}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lines = v["metrics"]["log_count"].as_u64().unwrap();
    assert!(lines >= 500 && lines.is_multiple_of(100), "{v}");
    // A restore over a data directory in use is refused.
    let (ok, _, err) = admin(
        other.path(),
        &["restore", "--from", backup.to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("not empty"), "{err}");
    drop(p);
    // Offline: the command copies directly; a destination that is not empty is refused.
    let (ok, out, err) = admin(
        other.path(),
        &[
            "backup",
            "--to",
            other.path().join("offline").to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{out}{err}");
    let (ok, _, err) = admin(
        other.path(),
        &["backup", "--to", backup.to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("not empty"), "{err}");
    // A data directory that holds no store is not backed up (nor created).
    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = admin(
        empty.path(),
        &["backup", "--to", empty.path().join("b").to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("holds no fleetops store"), "{err}");
    assert!(!empty.path().join("data").exists());
}

/// A device `r1` and an active session of it, through a running binary: the device token and
/// the session id.
pub(crate) async fn device_and_session(
    c: &reqwest::Client,
    base: &str,
    key: &str,
) -> (String, u64) {
    let d: serde_json::Value = c
        .post(format!("{base}{DEV}/devices"))
        .bearer_auth(key)
        .json(&json!({"name": "r1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = d["device_token"].as_str().unwrap().to_string();
    let v: serde_json::Value = c
        .post(format!("{base}{DEV}/sessions"))
        .bearer_auth(&token)
        .json(&json!({"device_id": d["id"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (token, v["id"].as_u64().unwrap())
}

each_backend!(kill_9_mid_purge_then_the_restart_finishes_the_purge);
/// `kill -9` while a deleted organization's data is being purged (slowed down to small steps):
/// the restart resumes the purge, which finishes with nothing of its projects left, the lists
/// consistent, and the default organization's data intact.
async fn kill_9_mid_purge_then_the_restart_finishes_the_purge() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[supervision]\npurge_records_per_step = 5\npurge_pause_ms = 20\n",
    )
    .unwrap();
    let mut p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (kept_token, kept_sid) = device_and_session(&c, &base, &key).await;
    let post = |path: String, cred: String, body: serde_json::Value| {
        post_json(c.clone(), format!("{base}{path}"), cred, body)
    };
    let (st, _) = post(
        format!("{DEV}/sessions/{kept_sid}/logs"),
        kept_token.clone(),
        json!([{"level": "info", "message": "kept"}]),
    )
    .await;
    assert_eq!(st, 202);
    let (st, _) = post(
        "/api/v1/organizations".into(),
        key.clone(),
        json!({"slug": "gone"}),
    )
    .await;
    assert_eq!(st, 201);
    let org = "/api/v1/organizations/gone";
    let (st, proj) = post(format!("{org}/projects"), key.clone(), json!({"slug": "p"})).await;
    assert_eq!(st, 201);
    let pid = proj["id"].as_u64().unwrap();
    let project = format!("{org}/projects/p");
    let (st, d) = post(
        format!("{project}/devices"),
        key.clone(),
        json!({"name": "r"}),
    )
    .await;
    assert_eq!(st, 201);
    let token = d["device_token"].as_str().unwrap().to_string();
    let mut sids = Vec::new();
    for _ in 0..10 {
        let (st, v) = post(
            format!("{project}/sessions"),
            token.clone(),
            json!({"device_id": d["id"]}),
        )
        .await;
        assert_eq!(st, 201);
        let sid = v["id"].as_u64().unwrap();
        for i in 0..5 {
            let (st, _) = post(
                format!("{project}/sessions/{sid}/logs"),
                token.clone(),
                json!([{"level": "info", "message": format!("line {i}")}]),
            )
            .await;
            assert_eq!(st, 202);
        }
        sids.push(sid);
    }
    let r = c
        .delete(format!("{base}{org}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let metric = |base: String| {
        let c = c.clone();
        async move {
            let text = c
                .get(format!("{base}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("fleetops_orgs_being_deleted "))
                .map(|v| v.trim().to_string())
                .unwrap()
        }
    };
    assert_eq!(metric(base.clone()).await, "1", "the purge is under way");
    tokio::time::sleep(Duration::from_millis(150)).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);
    {
        let store = crate::common::open_store(dir.path());
        assert_eq!(
            store.orgs_being_deleted().unwrap().len(),
            1,
            "killed mid-purge"
        );
        assert!(!store.project_residue(pid).unwrap().is_empty());
    }

    let p = serve(dir.path(), &[]);
    let base = p.base.clone();
    let mut finished = false;
    for _ in 0..200 {
        if metric(base.clone()).await == "0" {
            finished = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(finished, "the restart did not finish the purge");
    let r = c
        .get(format!("{base}{DEV}/sessions/{kept_sid}/logs"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["items"][0]["message"], "kept", "{v}");
    drop(p);
    let store = crate::common::open_store(dir.path());
    assert_eq!(store.project_residue(pid).unwrap(), Vec::<&str>::new());
    for sid in sids {
        assert!(store.session_by_id(sid).unwrap().is_none());
        assert_eq!(store.log_chunk_heads(sid).unwrap(), vec![]);
    }
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
}

/// One line of JSON from a successful `admin` run.
fn admin_json(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let (ok, stdout, stderr) = admin(dir, args, env);
    assert!(ok, "{args:?}: {stderr}");
    assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

each_backend!(admin_org_offline_lists_changes_and_deletes_an_organization);
/// `admin org` with the server stopped: list, show, rename and set-tier change the data
/// directory; a tier the configuration does not define, an unknown organization and a delete
/// without `--yes` are refused; a delete returns once everything of the organization is purged.
async fn admin_org_offline_lists_changes_and_deletes_an_organization() {
    let dir = tempfile::tempdir().unwrap();
    let v = admin_json(
        dir.path(),
        &[
            "bootstrap",
            "--email",
            "root@acme.io",
            "--password",
            "pw",
            "--org",
            "acme",
            "--project",
            "arms",
        ],
        &[],
    );
    assert_eq!(v["org"], "acme");
    admin_json(
        dir.path(),
        &[
            "bootstrap",
            "--email",
            "root@kept.io",
            "--password",
            "pw",
            "--org",
            "kept",
            "--project",
            "p",
        ],
        &[],
    );
    let list = admin_json(dir.path(), &["org", "list"], &[]);
    let slugs: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["slug"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(slugs, ["kept", "acme"], "{list}");
    assert_eq!(list["being_purged"], 0);

    let v = admin_json(dir.path(), &["org", "rename", "acme", "Acme Robotics"], &[]);
    assert_eq!(
        (&v["slug"], &v["name"]),
        (&json!("acme"), &json!("Acme Robotics"))
    );
    let v = admin_json(dir.path(), &["org", "set-tier", "acme", "enterprise"], &[]);
    assert_eq!(v["tier"], "enterprise");
    let v = admin_json(dir.path(), &["org", "show", "acme"], &[]);
    assert_eq!(
        (&v["name"], &v["tier"]),
        (&json!("Acme Robotics"), &json!("enterprise"))
    );

    let (ok, _, err) = admin(dir.path(), &["org", "set-tier", "acme", "platinum"], &[]);
    assert!(!ok);
    assert!(err.contains("tier: must be one of"), "{err}");
    let (ok, _, err) = admin(dir.path(), &["org", "show", "nobody"], &[]);
    assert!(!ok);
    assert!(err.contains("no organization nobody"), "{err}");
    let (ok, _, err) = admin(dir.path(), &["org", "delete", "acme"], &[]);
    assert!(!ok);
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(
        admin_json(dir.path(), &["org", "show", "acme"], &[])["slug"],
        "acme"
    );

    let pid = {
        let store = crate::common::open_store(dir.path());
        let org = store.org_by_slug("acme").unwrap().unwrap();
        store.project_by_slug(org.id, "arms").unwrap().unwrap().id
    };
    let v = admin_json(dir.path(), &["org", "delete", "acme", "--yes"], &[]);
    assert_eq!(v, json!({"deleted": "acme", "purging": false}));
    let list = admin_json(dir.path(), &["org", "list"], &[]);
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["being_purged"], 0);
    let store = crate::common::open_store(dir.path());
    assert_eq!(store.project_residue(pid).unwrap(), Vec::<&str>::new());
    assert_eq!(store.orgs_being_deleted().unwrap(), Vec::<u64>::new());
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
}

each_backend!(admin_org_goes_through_the_running_server);
/// `admin org` while the server runs: through its API with a superuser's key (a delete
/// returns with the purge under way in the server); without a key, or with a key that is
/// not a superuser's, it is refused.
async fn admin_org_goes_through_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let r = c
        .post(format!("{}/api/v1/organizations", p.base))
        .bearer_auth(&key)
        .json(&json!({"slug": "acme"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let url = p.base.clone();
    let remote = |args: &[&str]| {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(["--url".into(), url.clone()]);
        v
    };
    let run = |args: Vec<String>, token: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        admin(dir.path(), &args, &[("FLEETOPS_TOKEN", token)])
    };

    let (ok, out, err) = run(remote(&["org", "list"]), &key);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let slugs: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["slug"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(slugs, ["acme", "default"], "{list}");
    let (ok, out, err) = run(remote(&["org", "set-tier", "acme", "team"]), &key);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["tier"], "team");
    let r: serde_json::Value = c
        .get(format!("{}/api/v1/organizations/acme", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["tier"], "team");

    // No key: told what to give; a key of a user who is not a superuser: the server's 403.
    let (ok, _, err) = admin(dir.path(), &["org", "list"], &[]);
    assert!(!ok);
    assert!(err.contains("--token"), "{err}");
    let r: serde_json::Value = c
        .post(format!("{}/api/v1/users", p.base))
        .bearer_auth(&key)
        .json(&json!({"email": "plain@acme.io", "password": "plain-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["id"].as_u64().is_some(), "{r}");
    let login: serde_json::Value = c
        .post(format!("{}/api/v1/auth/login", p.base))
        .json(&json!({"email": "plain@acme.io", "password": "plain-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let plain = login["access_token"].as_str().unwrap().to_string();
    let (ok, _, err) = run(remote(&["org", "list"]), &plain);
    assert!(!ok);
    assert!(err.contains("403"), "{err}");

    let (ok, out, err) = run(remote(&["org", "delete", "acme", "--yes"]), &key);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v, json!({"deleted": "acme", "purging": true}));
    let r = c
        .get(format!("{}/api/v1/organizations/acme", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
