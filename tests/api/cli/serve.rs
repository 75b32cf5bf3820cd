//! The binary started as operators start it: its first start and the credentials it prints, the
//! configuration flag, its JSON log lines, and SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::common::DEV;

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
