//! schemathesis (PyPI) against the served OpenAPI document, with every check: a seed data set
//! is created first through the API, so operations find their records; the run must find no
//! failure. `SCHEMATHESIS_EXAMPLES` sets the examples per operation (default 20),
//! `SCHEMATHESIS_SEED` the seed (default 1, so a run can be repeated); `SCHEMATHESIS_VERBOSE`
//! prints the whole report and `SCHEMATHESIS_HAR=/path/prefix` keeps every exchange.

use std::process::Command;

use serde_json::{Value, json};

use crate::capsules::{CAPS, archive, publish, secret_post};
use crate::common::*;
use crate::configurations::{conf, configure};
use crate::sessions::{device, session};
use crate::webhooks::{SECRET, deliver, pr, settled};

/// Every id the document's path parameters name, created through the API.
async fn seed(s: &Srv, jwt: &str, n: &str) -> Vec<(&'static str, Value)> {
    let key = s.key();
    let (dev, tok) = device(s, &format!("seed-robot-{n}")).await;
    let g = s
        .post(
            &format!("{DEV}/device-groups"),
            key,
            json!({"name": format!("seed-group-{n}"), "device_ids": [dev]}),
        )
        .await;
    assert_eq!(g.status, 201, "{}", g.body);
    let sid = session(s, dev, &tok).await;
    // The live tail gets a session no other operation ends (`CompleteSession` ends `sid`,
    // and on an ended session the upgrade is followed at once by `session_ended` and the
    // close, which schemathesis's HTTP client reports as a broken connection).
    let live = session(s, dev, &tok).await;
    let logs = json!([
        {"timestamp": "2026-03-01T10:00:05.000Z", "level": "warn", "module": "drive", "message": "motor hot"},
        {"timestamp": "2026-03-01T10:00:06.000Z", "level": "info", "module": "nav", "message": "route planned"},
    ]);
    let r = s
        .post(&format!("{DEV}/sessions/{sid}/logs"), &tok, logs)
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let put = s
        .http
        .put(s.url(&format!("{DEV}/sessions/{sid}/files/dir/file.txt")))
        .bearer_auth(key)
        .body("artifact")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/tags"),
            key,
            json!({"tag": "seed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    let bytes = archive(".tar", b"x");
    let c = publish(s, &format!("nav-{n}"), "1.0.0", ".tar", &bytes, json!([])).await;
    assert_eq!(c.status, 200, "{}", c.body);
    let capsule = c.body["id"].as_u64().unwrap();
    let (config, r) = configure(
        s,
        conf(&format!("base-{n}"), capsule, ".json", None),
        br#"{"motor": {"speed": 10}}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let detail = s.get(&format!("{CAPS}/{capsule}"), key).await;
    let url = detail.body["download_url"].as_str().unwrap().to_string();
    let download = url.rsplit('/').next().unwrap().to_string();
    // An upload link that stays unused.
    let u = secret_post(
        s,
        &format!("{CAPS}/upload-url"),
        &s.admin.project_secret,
        json!({"name": format!("spare-{n}"), "version": "1.0.0", "capsule_type": "SW", "file_format": ".tar",
               "file_size_bytes": 10}),
    )
    .await;
    assert_eq!(u.status, 201, "{}", u.body);
    let upload = u.body["upload_url"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let d = s
        .post(
            "/api/v1/projects/default/default/deployments",
            key,
            json!({"name": format!("seed rollout {n}"), "composition_tag": "nav-1.0.0", "capsule_id": capsule,
                   "configuration_id": config, "target_devices": [dev],
                   "rollout": {"phases": [{"name": "all", "devices": {"percent": 100}}]}}),
        )
        .await;
    assert_eq!(d.status, 201, "{}", d.body);

    let repo = s
        .post(
            &format!("{DEV}/repositories"),
            key,
            json!({"full_name": format!("octo-org/robot-firmware-{n}")}),
        )
        .await;
    assert_eq!(repo.status, 201, "{}", repo.body);
    let mut p = pr("opened", 7, &"a".repeat(40), false);
    p["number"] = json!(if n == "a" { 7 } else { 8 });
    p["repository"]["full_name"] = json!(format!("octo-org/robot-firmware-{n}"));
    let (delivery, r) = deliver(s, "pull_request", &p).await;
    assert_eq!(r.status, 202, "{}", r.body);
    settled(s, &delivery).await;
    let runs = s
        .get(
            &format!("{DEV}/test-runs?repository=octo-org/robot-firmware-{n}"),
            key,
        )
        .await;
    let run = runs.body["items"][0]["id"].clone();
    assert!(run.is_u64(), "{}", runs.body);

    let i = s
        .post(
            &format!("{DEV}/integrations"),
            key,
            json!({"type": "webhook", "name": format!("seed-hook-{n}"),
                   "config": {"url": "https://hooks.example.com/fleetops", "method": "POST",
                              "signing_secret": "whsec_c2VlZHNlZWRzZWVkc2VlZA=="}}),
        )
        .await;
    assert_eq!(i.status, 201, "{}", i.body);
    let rule = s
        .post(
            &format!("{DEV}/alert-rules"),
            key,
            json!({"name": format!("seed-rule-{n}"), "severity": "warning",
                   "condition": {"type": "device_status", "status": "offline", "duration_seconds": 600}}),
        )
        .await;
    assert_eq!(rule.status, 201, "{}", rule.body);
    let k = s
        .post(
            "/api/v1/auth/api-keys",
            jwt,
            json!({"name": format!("seed-key-{n}")}),
        )
        .await;
    assert_eq!(k.status, 201, "{}", k.body);

    vec![
        ("org", json!("default")),
        ("project", json!("default")),
        ("device_id", json!(dev)),
        ("group_id", g.body["id"].clone()),
        ("session_id", json!(sid)),
        ("live_session_id", json!(live)),
        ("tag", json!("seed")),
        ("path", json!("dir/file.txt")),
        ("capsule_id", json!(capsule)),
        ("config_id", json!(config)),
        ("deployment_id", d.body["id"].clone()),
        ("repo_id", repo.body["id"].clone()),
        ("run_id", run),
        ("delivery_id", json!(delivery)),
        ("integration_id", i.body["id"].clone()),
        ("rule_id", rule.body["id"].clone()),
        ("alert_id", json!(1)),
        ("key_id", k.body["id"].clone()),
        ("token", json!(download)),
        ("upload_token", json!(upload)),
        ("device_token", json!(tok)),
    ]
}

fn toml_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// The committed configuration, then the credentials and `params` (all operations) and
/// `deletes` (DELETE operations, on records of their own so the others keep theirs).
fn config(
    s: &Srv,
    jwt: &str,
    params: &[(&str, Value)],
    deletes: Option<&[(&str, Value)]>,
) -> String {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/schemathesis.toml"
    ))
    .unwrap();
    let table = |ps: &[(&str, Value)]| {
        ps.iter()
            .filter(|(n, _)| !matches!(*n, "upload_token" | "device_token" | "live_session_id"))
            .map(|(n, v)| format!("\"path.{n}\" = {}", toml_value(v)))
            .collect::<Vec<_>>()
    };
    let mut cfg = base;
    if let Some(upload) = params.iter().find(|(n, _)| *n == "upload_token") {
        cfg.push_str(&format!(
            "\n[[operations]]\ninclude-operation-id = \"Upload\"\n\
             parameters = {{ \"path.token\" = {} }}\n",
            toml_value(&upload.1)
        ));
    }
    if let Some(live) = params.iter().find(|(n, _)| *n == "live_session_id") {
        cfg.push_str(&format!(
            "\n[[operations]]\ninclude-operation-id = \"LiveLogs\"\n\
             parameters = {{ \"path.session_id\" = {} }}\n",
            toml_value(&live.1)
        ));
    }
    // Bodies that name records get the seeded ones, so those operations reach their logic.
    if deletes.is_some() {
        let id = |n: &str| {
            params
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
                .unwrap()
        };
        let (dev, group, dep) = (id("device_id"), id("group_id"), id("deployment_id"));
        let (capsule, config, hook) = (id("capsule_id"), id("config_id"), id("integration_id"));
        for (ops, body) in [
            (
                "CreateSession",
                format!("\"body.device_id\" = {dev}, \"body.package_id\" = {dep}"),
            ),
            ("DeviceStatus", format!("\"body.device_id\" = {dev}")),
            (
                "^(CreateGroup|PatchGroup)$",
                format!("\"body.device_ids\" = [{dev}]"),
            ),
            (
                "ConfigUploadUrl",
                format!("\"body.capsule_id\" = {capsule}, \"body.parent_config_id\" = {config}"),
            ),
            (
                "^(CreateDeployment|PatchDeployment)$",
                format!(
                    "\"body.capsule_id\" = {capsule}, \"body.configuration_id\" = {config}, \
                     \"body.target_devices\" = [{dev}]"
                ),
            ),
            (
                "^(CreateAlertRule|PatchAlertRule|BacktestRule)$",
                format!(
                    "\"body.integration_ids\" = [{hook}], \"body.device_group_ids\" = [{group}]"
                ),
            ),
        ] {
            let key = if ops.starts_with('^') {
                "include-operation-id-regex"
            } else {
                "include-operation-id"
            };
            cfg.push_str(&format!(
                "\n[[operations]]\n{key} = {ops:?}\nparameters = {{ {body} }}\n"
            ));
        }
    }
    if let Some(d) = deletes {
        // The organization and project every operation uses stay; `DeleteOrg` deletes one
        // of its own (tests/schemathesis.toml).
        let own: Vec<(&str, Value)> = d
            .iter()
            .filter(|(n, _)| *n != "org" && *n != "project")
            .cloned()
            .collect();
        cfg.push_str(&format!(
            "\n[[operations]]\ninclude-method = \"DELETE\"\nparameters = {{ {} }}\n",
            table(&own).join(", ")
        ));
    }
    cfg.push_str(&format!(
        "\n[auth.openapi.bearer]\nbearer = {jwt:?}\n\n\
         [auth.openapi.apiKey]\napi_key = {:?}\n\n\
         [auth.openapi.projectSecret]\napi_key = {:?}\n\n\
         [auth.openapi.deviceToken]\nbearer = {:?}\n\n[parameters]\n{}\n",
        s.key(),
        s.admin.project_secret,
        params
            .iter()
            .find(|(n, _)| *n == "device_token")
            .and_then(|(_, v)| v.as_str())
            .unwrap_or_default(),
        table(params).join("\n")
    ));
    cfg
}

/// Runs schemathesis with `cfg` and `phases`; panics with its report unless it passes.
async fn run(s: &Srv, cfg: String, phases: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("schemathesis.toml");
    std::fs::write(&cfg_path, &cfg).unwrap();
    let examples = std::env::var("SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "20".into());
    let seed = std::env::var("SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into());
    let url = s.url("/api/v1/openapi.json");
    let report = dir.path().join("junit.xml");
    let phases = phases.to_string();
    let phases_shown = phases.clone();
    let scratch = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(fleetops_testkit::python::tool("schemathesis"))
            // Its cache of past cases stays in the scratch directory.
            .current_dir(&scratch)
            .env(
                "SCHEMATHESIS_HOOKS",
                concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis_hooks.py"),
            )
            .arg("--config-file")
            .arg(&cfg_path)
            .arg("--no-color")
            .args(["run", &url, "--checks", "all", "--phases", &phases])
            .args([
                "--max-examples",
                &examples,
                "--seed",
                &seed,
                "--workers",
                "2",
            ])
            .args(["--request-timeout", "30", "--report-junit-path"])
            .arg(&report)
            .args(match std::env::var("SCHEMATHESIS_HAR") {
                Ok(p) => vec!["--report-har-path".to_string(), format!("{p}.{phases}.har")],
                Err(_) => vec![],
            })
            .output()
    })
    .await
    .unwrap()
    .expect("schemathesis is installed by README's test command (pip)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis failed:\n{stdout}\n{stderr}"
    );
    // The summary, for the log of a passing run (all of it with SCHEMATHESIS_VERBOSE).
    if std::env::var_os("SCHEMATHESIS_VERBOSE").is_some() {
        eprintln!("{stdout}");
    } else if let Some(i) = stdout.find("SUMMARY") {
        eprintln!("schemathesis {phases_shown}: {}", &stdout[i..]);
    }
    stdout
}

each_backend!(schemathesis_finds_no_failure, threads = 2);
async fn schemathesis_finds_no_failure() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.http.login_per_minute = 1_000_000;
    })
    .await;
    let jwt = s.login(&s.admin.email, ADMIN_PASSWORD).await;
    let spare = s
        .post(
            "/api/v1/organizations/default/projects",
            s.key(),
            json!({"slug": "spare"}),
        )
        .await;
    assert_eq!(spare.status, 201, "{}", spare.body);
    let kept = seed(&s, &jwt, "a").await;
    let deleted = seed(&s, &jwt, "b").await;
    // An organization for the organization delete (made after the seeds' deliveries, so the
    // installation was first seen by a single-organization service and bound to it).
    let doomed = s
        .post("/api/v1/organizations", s.key(), json!({"slug": "doomed"}))
        .await;
    assert_eq!(doomed.status, 201, "{}", doomed.body);

    // Every operation, on the seeded records.
    let out = run(
        &s,
        config(&s, &jwt, &kept, Some(&deleted)),
        "examples,coverage,fuzzing",
    )
    .await;
    assert!(out.contains("Tested: 120"), "{out}");
    // Stateful: sequences that follow the document's links from each create.
    let fixed: Vec<(&str, Value)> = kept
        .iter()
        .filter(|(n, _)| matches!(*n, "org" | "project" | "tag" | "path" | "token"))
        .cloned()
        .collect();
    let out = run(&s, config(&s, &jwt, &fixed, None), "stateful").await;
    // The links were followed: every create and the operations on what it made.
    let tested: u32 = out
        .split("Tested: ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(tested >= 15, "{out}");
}
