//! Enrollment and heartbeats.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use serde_json::json;

use crate::harness::{Agent, DEV, Server};

#[tokio::test]
async fn an_agent_enrolls_with_a_token_and_keeps_its_device_token_readable_only_by_its_user() {
    let server = Server::start();
    let token = server
        .enrollment_token(
            json!({"name": "line", "labels": {"fleet": "amr"}, "allowed_label_keys": ["site"]}),
        )
        .await;
    let agent = Agent::new(&server, &token, "[labels]\nsite = \"lyon\"\n");
    let out = agent.command(&["enroll"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = agent.state().join("device.json");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(agent.state())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let id = agent.identity();
    assert!(id["device_token"].as_str().unwrap().starts_with("fopsd_"));
    let d = server
        .get(&format!("{DEV}/devices/{}", id["device_id"]))
        .await;
    assert_eq!(d["name"], "amr-1");
    assert_eq!(d["labels"], json!({"fleet": "amr", "site": "lyon"}));
    // Enrolled once: a second `enroll` keeps the identity it has.
    assert!(agent.command(&["enroll"]).status().unwrap().success());
    assert_eq!(agent.identity(), id);
    assert_eq!(server.get(&format!("{DEV}/devices")).await["total"], 1);
}

#[tokio::test]
async fn an_agent_asking_for_a_label_its_token_fixes_otherwise_is_not_enrolled() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "staging", "labels": {"fleet": "staging"}}))
        .await;
    let agent = Agent::new(&server, &token, "[labels]\nfleet = \"prod\"\n");
    let out = agent.command(&["enroll"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("422") && err.contains("fleet") && err.contains("staging"),
        "{err}"
    );
    assert!(!agent.state().join("device.json").exists());
    assert_eq!(server.get(&format!("{DEV}/devices")).await["total"], 0);
}

#[tokio::test]
async fn an_agent_whose_enrollment_answer_was_lost_gets_the_same_device_on_its_next_try() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "one", "single_use": true}))
        .await;
    let agent = Agent::new(&server, &token, "");
    // As an agent leaves it when the service enrolled it and the answer never arrived.
    let attempt = "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b";
    std::fs::create_dir_all(agent.state()).unwrap();
    std::fs::write(agent.state().join("enrollment-id"), attempt).unwrap();
    let lost = reqwest::Client::new()
        .post(format!("{}/api/v1/device/enroll", server.base))
        .bearer_auth(&token)
        .json(&json!({"name": "amr-1", "enrollment_id": attempt}))
        .send()
        .await
        .unwrap();
    assert_eq!(lost.status(), 201);
    let lost: serde_json::Value = lost.json().await.unwrap();
    let out = agent.command(&["enroll"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id = agent.identity();
    assert_eq!(id["device_id"], lost["id"]);
    assert_ne!(id["device_token"], lost["device_token"]);
    assert_eq!(server.get(&format!("{DEV}/devices")).await["total"], 1);
    assert!(!agent.state().join("enrollment-id").exists());
}

#[tokio::test]
async fn a_refused_enrollment_token_stops_the_agent_with_a_clear_error() {
    let server = Server::start();
    let agent = Agent::new(&server, "fopse_not-a-token", "");
    let out = agent.command(&["enroll"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("enrollment token was refused"), "{err}");
    assert!(!agent.state().join("device.json").exists());
}

#[tokio::test]
async fn the_daemon_sends_heartbeats_with_built_in_and_configured_metrics() {
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let dir = tempfile::tempdir().unwrap();
    let battery = dir.path().join("battery");
    std::fs::write(&battery, "87\n").unwrap();
    let agent = Agent::new(
        &server,
        &token,
        &format!(
            "[heartbeat]\ninterval_seconds = 1\n[heartbeat.files]\nbattery = \"{}\"\n[heartbeat.commands]\nanswer = \"echo 42\"\n",
            battery.display()
        ),
    );
    let _daemon = agent.spawn(&["daemon"]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen;
    let online = loop {
        let list = server.get(&format!("{DEV}/devices")).await;
        seen = list["items"][0].clone();
        let ok = seen["status"] == "online"
            && seen["metrics"]["battery"] == 87.0
            && seen["metrics"]["answer"] == 42.0
            && ["load", "memory", "disk", "uptime"]
                .iter()
                .all(|m| seen["metrics"][m].is_number());
        if ok || std::time::Instant::now() > until {
            break ok;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(online, "{seen}");
}

/// A CA and a certificate it signed for 127.0.0.1, made with openssl in `dir`: the CA's PEM,
/// the leaf's and its key's.
fn certificates(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl is installed by README's test command");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=fleetops test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    run(&ca);
    let mut leaf = vec!["req"];
    leaf.extend(ec);
    leaf.extend([
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&leaf);
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    )
}

/// A TLS front for the server on `to` (as an operator's proxy is): its port.
async fn tls_front(cert: &std::path::Path, key: &std::path::Path, to: u16) -> u16 {
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(s).await
                    && let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_speaks_tls_to_a_service_whose_ca_it_is_given_and_refuses_one_it_is_not() {
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let certs = tempfile::tempdir().unwrap();
    let (ca, leaf, key) = certificates(certs.path());
    let port = tls_front(&leaf, &key, server.port).await;
    let base = format!("https://127.0.0.1:{port}");
    // Without the CA, the service's certificate is not trusted: nothing is sent.
    let stranger = Agent::at(&base, &token, "");
    let said = certs.path().join("stranger.stderr");
    let mut trying = crate::harness::Guard(
        stranger
            .command(&["enroll"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&said).unwrap())
            .spawn()
            .unwrap(),
    );
    // It refuses the certificate, says so, and tries again (it has not given up).
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&said).unwrap_or_default();
        if text.to_lowercase().contains("certificate") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "no certificate error: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        trying.0.try_wait().unwrap().is_none(),
        "the stranger gave up or got through"
    );
    assert_eq!(server.get(&format!("{DEV}/devices")).await["total"], 0);
    assert!(!stranger.state().join("device.json").exists());
    drop(trying);
    let trusting = Agent::at(&base, &token, &format!("ca_file = \"{}\"\n", ca.display()));
    let out = tokio::task::spawn_blocking(move || {
        let out = trusting.command(&["enroll"]).output().unwrap();
        (out, trusting)
    })
    .await
    .unwrap();
    assert!(
        out.0.status.success(),
        "{}",
        String::from_utf8_lossy(&out.0.stderr)
    );
    let id = out.1.identity();
    assert_eq!(id["server"], base);
    let d = server
        .get(&format!("{DEV}/devices/{}", id["device_id"]))
        .await;
    assert_eq!(d["name"], "amr-1");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_state_dir_exits_with_a_clear_error_and_leaves_the_spool_alone()
{
    let server = Server::start();
    let token = server.enrollment_token(json!({"name": "line"})).await;
    let logs = tempfile::tempdir().unwrap();
    let agent = Agent::new(
        &server,
        &token,
        &format!(
            "[heartbeat]\ninterval_seconds = 1\n[logs]\nfiles = [\"{}/*.log\"]\n",
            logs.path().display()
        ),
    );
    let mut first = agent.spawn(&["daemon"]);
    let spool = agent.state().join("spool").join("daemon");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !agent.state().join("device.json").exists() {
        assert!(
            std::time::Instant::now() < until,
            "the first daemon never enrolled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // As the first daemon leaves it while it writes a batch.
    let in_flight = spool.join(".00000000000000000007.ndjson.0123456789abcdef.tmp");
    std::fs::write(&in_flight, "{\"message\":\"half\"").unwrap();
    let out = agent.command(&["daemon"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another fleetops-agent daemon uses the state_dir"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&in_flight).unwrap(),
        "{\"message\":\"half\""
    );
    assert!(
        first.0.try_wait().unwrap().is_none(),
        "the first daemon ended"
    );
}
