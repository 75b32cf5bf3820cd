//! Health, metrics and the OpenAPI document.

use reqwest::Method;

use crate::common::*;

each_backend!(healthz_metrics_openapi);
async fn healthz_metrics_openapi() {
    let s = start().await;
    let r = s.send(Method::GET, "/healthz", None, None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, serde_json::json!({"status": "ok"}));

    s.get(&format!("{DEV}/devices"), s.key()).await;
    let text = s
        .http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("fleetops_http_requests_total{"), "{text}");
    assert!(
        text.contains("route=\"/api/v1/organizations/{org}/projects/{project}/devices\""),
        "{text}"
    );
    assert!(text.contains("fleetops_actor_restarts"), "{text}");
    // Handler polls are timed; the earlier requests' polls are in the count.
    let polls: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("fleetops_http_task_poll_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(polls >= 2.0, "{text}");
    // Cumulative buckets: the last (`+Inf`) equals the count.
    let inf: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("fleetops_http_task_poll_seconds_bucket{le=\"+Inf\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0);
    assert_eq!(inf, polls, "{text}");
    assert!(
        text.contains("fleetops_http_task_poll_seconds_bucket{le=\"0.001\"}"),
        "{text}"
    );

    let r = s
        .send(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["openapi"], "3.1.0");
    let paths = r.body["paths"].as_object().unwrap();
    for (p, m) in [
        ("/api/v1/auth/login", "post"),
        ("/api/v1/auth/api-keys/{key_id}", "delete"),
        (
            "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}",
            "get",
        ),
        (
            "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}/heartbeat",
            "post",
        ),
        ("/api/v1/organizations/{org}/devices", "get"),
        ("/healthz", "get"),
    ] {
        assert!(
            paths.get(p).and_then(|x| x.get(m)).is_some(),
            "{m} {p} missing"
        );
    }

    // Unique operation ids; OpenAPI templates only (no matchit `{*path}`), each one declared.
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in paths {
        assert!(!path.contains("{*"), "{path}");
        let names: Vec<&str> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .collect();
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap();
            assert!(ids.insert(id.to_string()), "operationId {id} twice");
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            for n in &names {
                assert!(
                    params
                        .iter()
                        .any(|p| p["name"] == *n && p["in"] == "path" && p["required"] == true),
                    "{method} {path}: path parameter {n} not declared"
                );
            }
            assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()));
        }
    }
    assert!(ids.contains("PutFile") && ids.contains("PutFileDownload"));

    // Statuses the routes really answer.
    let pp = "/api/v1/organizations/{org}/projects/{project}";
    for (path, method, codes) in [
        (
            format!("{pp}/test-runs/claim"),
            "post",
            &["200", "204", "401", "403", "404", "429"][..],
        ),
        (
            "/api/v1/scm/webhooks".into(),
            "post",
            &["202", "400", "401", "413", "503"],
        ),
        (
            format!("{pp}/devices/{{device_id}}"),
            "get",
            &["200", "401", "403", "404", "429"],
        ),
        (
            "/api/v1/auth/login".into(),
            "post",
            &["200", "400", "401", "422", "429"],
        ),
        (
            "/api/v1/ws/organizations/{org}/projects/{project}/sessions/{session_id}/logs".into(),
            "get",
            &["101", "400", "401", "403", "404", "426"],
        ),
        (
            "/api/v1/uploads/{token}".into(),
            "put",
            &["200", "401", "403", "404", "413"],
        ),
        (
            "/api/v1/downloads/{token}".into(),
            "get",
            &["200", "401", "403", "404"],
        ),
        (
            format!("{pp}/sessions/{{session_id}}/files/{{path}}"),
            "put",
            &["201", "400", "404", "409", "413"],
        ),
    ] {
        let responses = &paths[&path][method]["responses"];
        for c in codes {
            assert!(
                responses.get(*c).is_some(),
                "{method} {path}: {c} missing from {responses}"
            );
        }
    }
    let metrics = &paths["/metrics"]["get"]["responses"]["200"]["content"];
    assert!(
        metrics.get("text/plain; version=0.0.4").is_some(),
        "{metrics}"
    );
    assert!(
        metrics
            .get("application/openmetrics-text; version=1.0.0; charset=utf-8")
            .is_some(),
        "{metrics}"
    );
}

each_backend!(openapi_document_is_valid);
/// The served document passes `openapi-spec-validator` (of `tests/requirements.txt`, which
/// `scripts/test` installs; the test fails without it).
async fn openapi_document_is_valid() {
    let have = std::process::Command::new(fleetops_testkit::python::python())
        .args(["-c", "import openapi_spec_validator"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        have,
        "python with openapi-spec-validator is needed (scripts/test installs it)"
    );
    let s = start().await;
    let text = s
        .http
        .get(s.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &text).unwrap();
    let out = std::process::Command::new(fleetops_testkit::python::python())
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator refused the document:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

each_backend!(metrics_token_when_configured);
async fn metrics_token_when_configured() {
    let s = start_with(|c| c.http.metrics_token = "scrape-me".into()).await;
    let r = s.send(Method::GET, "/metrics", None, None).await;
    r.assert_error(401);
    let r = s
        .raw(s.http.get(s.url("/metrics")).bearer_auth("scrape-me"))
        .await;
    assert_eq!(r.status, 200);
}

each_backend!(metrics_prometheus_text_unless_openmetrics_is_asked_for);
async fn metrics_prometheus_text_unless_openmetrics_is_asked_for() {
    let s = start().await;
    s.get(&format!("{DEV}/devices"), s.key()).await;
    let r = s.http.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains("# TYPE fleetops_http_requests_total counter\n"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");

    // What Prometheus itself sends.
    let r = s
        .http
        .get(s.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains("# TYPE fleetops_http_requests counter\n"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}

each_backend!(metrics_count_ingested_lines_flushes_and_the_webhook_backlog);
/// The ingest rate, the group-commit fsyncs and the webhook backlog are on /metrics.
async fn metrics_count_ingested_lines_flushes_and_the_webhook_backlog() {
    let s = start().await;
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    assert_eq!(s.metric("fleetops_log_lines_ingested").await, 0.0);
    let flushes = s.metric("fleetops_storage_flush_seconds_count").await;
    assert!(
        flushes >= 1.0,
        "creating a device and a session waited for fsyncs"
    );
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            &tok,
            serde_json::json!([
                {"level": "info", "message": "a"},
                {"level": "info", "message": "b"},
                {"level": "error", "message": "c"}
            ]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(s.metric("fleetops_log_lines_ingested").await, 3.0);
    assert!(s.metric("fleetops_storage_flush_seconds_count").await > flushes);
    assert_eq!(s.metric("fleetops_webhook_deliveries_queued").await, 0.0);
    let text = s.metrics_text().await;
    assert!(
        text.contains("# TYPE fleetops_storage_flush_seconds histogram"),
        "{text}"
    );
}

each_backend!(backup_endpoint_refuses_missing_credentials_and_bad_bodies);
/// `POST /api/v1/admin/backup`: 401 without a credential, 400 for a body that is not JSON,
/// 422 for one without `to` (the superuser's 201, 403 and the destination's 422 are tested
/// through the binary in `cli.rs`).
async fn backup_endpoint_refuses_missing_credentials_and_bad_bodies() {
    let s = start().await;
    let url = "/api/v1/admin/backup";
    s.raw(
        s.http
            .post(s.url(url))
            .json(&serde_json::json!({"to": "/tmp/x"})),
    )
    .await
    .assert_error(401);
    s.raw(
        s.http
            .post(s.url(url))
            .bearer_auth(s.key())
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await
    .assert_error(400);
    s.post(url, s.key(), serde_json::json!({}))
        .await
        .assert_error(422);
}

each_backend!(a_generated_python_client_runs_a_short_flow);
/// The served document generates a client with openapi-python-client (the generator most
/// Python users reach for; installed by README's test command), and that client signs in,
/// registers a device, sends a heartbeat and a log batch, queries it and creates an
/// integration: no boolean schemas, and the integration union has a discriminator on `type`.
async fn a_generated_python_client_runs_a_short_flow() {
    let s = start().await;
    let work = tempfile::tempdir().unwrap();
    let doc = s
        .http
        .get(s.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    std::fs::write(work.path().join("openapi.json"), &doc).unwrap();
    let out = tokio::process::Command::new(fleetops_testkit::python::tool("openapi-python-client"))
        .args([
            "generate",
            "--path",
            "openapi.json",
            "--output-path",
            "client",
        ])
        .current_dir(work.path())
        .output()
        .await
        .expect("openapi-python-client is installed by README's test command (pip)");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    for refused in ["Unable to process schema", "Failure to process schema"] {
        assert!(!log.contains(refused), "{log}");
    }
    let flow = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/peers/openapi_client_flow.py"
    );
    let out = tokio::process::Command::new(fleetops_testkit::python::python())
        .arg(flow)
        .env("PYTHONPATH", work.path().join("client"))
        .env("FLEETOPS", &s.base)
        .env("EMAIL", &s.admin.email)
        .env("PASSWORD", ADMIN_PASSWORD)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "signed in: bearer",
        "heartbeat: online",
        "accepted: 1",
        "query: 1 ERROR left motor overheat",
        "integration: 1 webhook",
        "integrations: 1",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
}
