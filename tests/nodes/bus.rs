//! The bus is the nodes' own: a client that reaches the NATS server reads nothing the nodes
//! send and makes no node act on what it publishes; a NATS server that asks for credentials
//! is logged in to; and a server without the bus never runs beside nodes on their database.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::harness::{Engines, Nats, Node, call, client};
use crate::live::{DEV, Ws, next_json, post_lines, session, tail};

/// What a plain NATS client subscribed to everything has seen: (subject, payload).
type Seen = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A plain NATS client (no fleetops key) that records every message on the server.
async fn eavesdrop(url: &str) -> (async_nats::Client, Seen) {
    let raw = async_nats::connect(url).await.unwrap();
    let mut sub = raw.subscribe(">").await.unwrap();
    raw.flush().await.unwrap();
    let seen: Seen = Arc::default();
    let s = seen.clone();
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            s.lock()
                .unwrap()
                .push((m.subject.to_string(), m.payload.to_vec()));
        }
    });
    (raw, seen)
}

/// Waits up to 10 s for a recorded message on `subject`.
async fn seen_on(seen: &Seen, subject: &str) -> Vec<Vec<u8>> {
    for _ in 0..200 {
        let on: Vec<Vec<u8>> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _)| s == subject)
            .map(|(_, p)| p.clone())
            .collect();
        if !on.is_empty() {
            return on;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("nothing seen on {subject}");
}

/// One unlabelled sample of `n`'s `/metrics`.
async fn metric(c: &reqwest::Client, n: &Node, name: &str) -> f64 {
    let text = c
        .get(n.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

async fn complete(c: &reqwest::Client, n: &Node, sid: u64, token: &str) {
    let (s, b) = call(
        c,
        Method::POST,
        n.url(&format!("{DEV}/sessions/{sid}/complete")),
        token,
        Some(json!({"status": "completed"})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
}

/// Frames `ws` receives within `wait` (pings skipped).
async fn frames_within(ws: &mut Ws, wait: Duration) -> Vec<String> {
    let mut out = Vec::new();
    let until = tokio::time::Instant::now() + wait;
    while let Ok(Some(m)) = tokio::time::timeout_at(until, ws.next()).await {
        match m.unwrap() {
            Message::Text(t) => out.push(t.to_string()),
            Message::Ping(_) | Message::Pong(_) => {}
            other => out.push(format!("{other:?}")),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_nats_client_reads_no_log_line_the_nodes_send_each_other() {
    let engines = Engines::start().await;
    let (_raw, seen) = eavesdrop(&engines.nats.url()).await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    let marker = format!("confidential-{}", uuid::Uuid::new_v4().simple());
    let lines: Vec<String> = (0..20).map(|i| format!("{marker} {i}")).collect();
    post_lines(&c, &a, sid, &token, &lines).await;
    for l in &lines {
        assert_eq!(&next_json(&mut ws).await["message"], l.as_str());
    }
    // The batch did travel on the bus, and nothing on it shows the lines.
    let live = seen_on(&seen, &format!("fleetops.live.{sid}")).await;
    assert!(!live.is_empty());
    let all = seen.lock().unwrap().clone();
    for (subject, payload) in &all {
        assert!(
            !payload
                .windows(marker.len())
                .any(|w| w == marker.as_bytes()),
            "a log line in clear on {subject}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_captured_and_moved_bus_messages_change_nothing_a_subscriber_on_another_node_sees() {
    let engines = Engines::start().await;
    let (raw, seen) = eavesdrop(&engines.nats.url()).await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    // A session that gets lines and ends, every message about it captured.
    let (done, done_token) = session(&c, &a, &key).await;
    let mut ws_done = tail(&b, done, &key).await;
    post_lines(&c, &a, done, &done_token, &["captured line".to_string()]).await;
    assert_eq!(next_json(&mut ws_done).await["message"], "captured line");
    complete(&c, &a, done, &done_token).await;
    assert_eq!(next_json(&mut ws_done).await["type"], "session_ended");
    let done_subject = format!("fleetops.live.{done}");
    let captured = seen_on(&seen, &done_subject).await;
    assert!(
        captured.len() >= 2,
        "a batch and an end: {}",
        captured.len()
    );
    // Another active session, with a live subscriber on B and no line yet.
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    let subject = format!("fleetops.live.{sid}");
    let rejected_before = metric(&c, &b, "fleetops_bus_rejected").await;
    // Every subject seen, and the victim's: the captured messages moved onto it, garbage,
    // and messages as a node sent them before the bus was sealed (a sender id, then an end
    // or a log signal).
    let mut subjects: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(s, _)| s.clone())
        .collect();
    subjects.push(subject.clone());
    subjects.sort();
    subjects.dedup();
    let mut forged: Vec<Vec<u8>> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, p)| p.clone())
        .collect();
    forged.push(b"garbage".to_vec());
    forged.push(vec![0; 200]);
    let mut end = uuid::Uuid::new_v4().as_bytes().to_vec();
    end.push(2);
    end.extend_from_slice(b"failed");
    forged.push(end);
    let mut sent = 0u64;
    for s in &subjects {
        if *s == done_subject {
            continue;
        }
        for p in &forged {
            raw.publish(s.clone(), p.clone().into()).await.unwrap();
            sent += 1;
        }
    }
    raw.flush().await.unwrap();
    // B's subscriber saw nothing: not ended, no line.
    let frames = frames_within(&mut ws, Duration::from_secs(2)).await;
    assert!(frames.is_empty(), "the subscriber saw {frames:?}");
    // It is still the session's: a real line arrives, and the session is active.
    post_lines(&c, &a, sid, &token, &["real line".to_string()]).await;
    let f = next_json(&mut ws).await;
    assert_eq!(f["type"], "log", "{f}");
    assert_eq!(f["message"], "real line");
    let (s, body) = call(
        &c,
        Method::GET,
        b.url(&format!("{DEV}/sessions/{sid}")),
        &key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["status"], "active", "{body}");
    // And B counted them.
    let mut counted = 0.0;
    for _ in 0..100 {
        counted = metric(&c, &b, "fleetops_bus_rejected").await - rejected_before;
        if counted >= forged.len() as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        counted >= forged.len() as f64,
        "B rejected {counted} of the {sent} forged messages"
    );
}

/// `[bus]` of the nodes' configuration with `lines` added.
fn bus_with(lines: &str) -> impl FnOnce(String) -> String {
    let lines = lines.to_string();
    move |c| c.replacen("[bus]\n", &format!("[bus]\n{lines}\n"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_log_in_to_a_nats_server_that_asks_for_credentials_and_one_without_them_is_refused() {
    let engines = Engines::start_on(Nats::start_with(&[
        "--user",
        "fleet",
        "--pass",
        "s3cret-pass",
    ]))
    .await;
    let login = "user = \"fleet\"\npassword = \"s3cret-pass\"";
    let a = engines.node_with("a", bus_with(login));
    let b = engines.node_with("b", bus_with(login));
    let c = client();
    let key = a.printed("API key:");
    let (s, r) = call(&c, Method::GET, b.url("/readyz"), "", None).await;
    assert_eq!((s, &r["bus"]), (200, &json!("ok")), "{r}");
    // The bus carries lines between them.
    let (sid, token) = session(&c, &a, &key).await;
    let mut ws = tail(&b, sid, &key).await;
    post_lines(&c, &a, sid, &token, &["over the logged-in bus".to_string()]).await;
    assert_eq!(
        next_json(&mut ws).await["message"],
        "over the logged-in bus"
    );
    // Without the credentials, or with a wrong password, a node does not start, and says why
    // without printing the password it was given.
    let refused = engines.try_node_with("c", |c| c).err().expect("refused");
    assert!(refused.contains("[bus] url"), "{refused}");
    assert!(
        refused.to_lowercase().contains("authoriz"),
        "not a credentials error: {refused}"
    );
    let wrong = engines
        .try_node_with("d", bus_with("user = \"fleet\"\npassword = \"wrong-pass\""))
        .err()
        .expect("refused");
    assert!(wrong.to_lowercase().contains("authoriz"), "{wrong}");
    assert!(
        !wrong.contains("wrong-pass"),
        "the password printed: {wrong}"
    );
}

/// The configuration of a server without a bus (one server, `FLEETOPS_BUS_URL` missing).
fn without_bus(c: String) -> String {
    let start = c.find("url = \"nats://").expect("a bus url");
    let end = start + c[start..].find('\n').unwrap();
    let c = format!("{}url = \"\"{}", &c[..start], &c[end..]);
    c.replacen("nodes = 2", "nodes = 1", 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_bus_is_refused_on_the_database_the_nodes_share() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let refused = engines
        .try_node_with("lone", without_bus)
        .err()
        .expect("a server without [bus] url started beside the nodes");
    assert!(refused.contains("shared by fleetops nodes"), "{refused}");
    assert!(refused.contains("[bus] url"), "{refused}");
    // The node still serves.
    let (s, _) = call(&client(), Method::GET, a.url("/readyz"), "", None).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_refused_on_a_database_a_lone_server_holds() {
    let engines = Engines::start().await;
    let lone = engines.node_with("lone", without_bus);
    let refused = engines
        .try_node_with("a", |c| c)
        .err()
        .expect("a node started beside a lone server");
    assert!(
        refused.contains("held by a fleetops server without [bus] url"),
        "{refused}"
    );
    // Once the lone server is gone, nodes start.
    lone.stop();
    let a = engines.node("a2");
    let (s, _) = call(&client(), Method::GET, a.url("/readyz"), "", None).await;
    assert_eq!(s, 200);
}

/// A CA and a certificate it signed for 127.0.0.1, made with openssl in `dir`: the CA's PEM,
/// the leaf's and its key's.
fn certificates(dir: &std::path::Path) -> (String, String, String) {
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
    let p = |f: &str| dir.join(f).display().to_string();
    (p("ca.pem"), p("leaf.pem"), p("leaf.key"))
}

/// A client certificate the CA of [`certificates`] in `dir` signed: its PEM and its key's.
fn client_certificate(dir: &std::path::Path) -> (String, String) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=fleetops node",
    ]);
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.pem",
        "-days",
        "2",
        "-extfile",
        "client.ext",
    ]);
    let p = |f: &str| dir.join(f).display().to_string();
    (p("client.pem"), p("client.key"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_reach_a_nats_server_over_tls_with_a_token_and_one_that_does_not_trust_it_is_refused()
{
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(certs.path());
    let engines = Engines::start_on(Nats::start_with(&[
        "--tls",
        "--tlscert",
        &cert,
        "--tlskey",
        &key,
        "--auth",
        "t0ken-secret",
    ]))
    .await;
    let bus = format!("token = \"t0ken-secret\"\ntls_ca_file = \"{ca}\"\ntls_required = true");
    let a = engines.node_with("a", bus_with(&bus));
    let b = engines.node_with("b", bus_with(&bus));
    let c = client();
    let api = a.printed("API key:");
    let (sid, token) = session(&c, &a, &api).await;
    let mut ws = tail(&b, sid, &api).await;
    post_lines(&c, &a, sid, &token, &["over TLS".to_string()]).await;
    assert_eq!(next_json(&mut ws).await["message"], "over TLS");
    let (s, r) = call(&c, Method::GET, b.url("/readyz"), "", None).await;
    assert_eq!((s, &r["bus"]), (200, &json!("ok")), "{r}");
    // Without the CA the server's certificate is not trusted: no start, and no token shown.
    let refused = engines
        .try_node_with(
            "c",
            bus_with("token = \"t0ken-secret\"\ntls_required = true"),
        )
        .err()
        .expect("a node that does not trust the server started");
    assert!(refused.contains("[bus] url"), "{refused}");
    assert!(!refused.contains("t0ken-secret"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_log_in_to_a_nats_server_with_an_nkey_seed() {
    let user = nkeys::KeyPair::new_user();
    let conf = tempfile::tempdir().unwrap();
    let file = conf.path().join("nats.conf");
    std::fs::write(
        &file,
        format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let engines = Engines::start_on(Nats::start_with(&["-c", file.to_str().unwrap()])).await;
    let seed = format!("nkey_seed = \"{}\"", user.seed().unwrap());
    let a = engines.node_with("a", bus_with(&seed));
    let b = engines.node_with("b", bus_with(&seed));
    let c = client();
    let api = a.printed("API key:");
    let (sid, token) = session(&c, &a, &api).await;
    let mut ws = tail(&b, sid, &api).await;
    post_lines(&c, &a, sid, &token, &["signed in with an nkey".to_string()]).await;
    assert_eq!(
        next_json(&mut ws).await["message"],
        "signed in with an nkey"
    );
    let other = format!(
        "nkey_seed = \"{}\"",
        nkeys::KeyPair::new_user().seed().unwrap()
    );
    let refused = engines
        .try_node_with("c", bus_with(&other))
        .err()
        .expect("a node with an unknown nkey started");
    assert!(refused.to_lowercase().contains("authoriz"), "{refused}");
}

/// The project's alerts as `n` lists them.
async fn alerts(c: &reqwest::Client, n: &Node, key: &str) -> Vec<serde_json::Value> {
    let (s, v) = call(c, Method::GET, n.url(&format!("{DEV}/alerts")), key, None).await;
    assert_eq!(s, 200, "{v}");
    v["items"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_replayed_to_the_evaluators_fire_no_alert() {
    let engines = Engines::start().await;
    let (raw, seen) = eavesdrop(&engines.nats.url()).await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    // Three matching lines within a minute fire; each node gets one, so two arrive.
    let (s, r) = call(
        &c,
        Method::POST,
        a.url(&format!("{DEV}/alert-rules")),
        &key,
        Some(json!({"name": "overheat", "severity": "critical",
            "condition": {"type": "log_pattern", "pattern": "overheat", "level": "error",
                "count": 3, "window_seconds": 60}})),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let (sid, token) = session(&c, &a, &key).await;
    // Both nodes' evaluators are running (a rule reaches the other node at once).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (n, line) in [(&a, "overheat 1"), (&b, "overheat 2")] {
        let (s, body) = call(
            &c,
            Method::POST,
            n.url(&format!("{DEV}/sessions/{sid}/logs")),
            &token,
            Some(json!([{"level": "error", "module": "arm", "message": line}])),
        )
        .await;
        assert_eq!(s, 202, "{body}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signals: Vec<(String, Vec<u8>)> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, _)| s.starts_with("fleetops.signals."))
        .cloned()
        .collect();
    assert!(signals.len() >= 2, "{} signals seen", signals.len());
    // Each node's signals published again on their own subject: the judging evaluator,
    // whichever node it is on, is sent the other node's lines again and again.
    for _ in 0..5 {
        for (s, p) in &signals {
            raw.publish(s.clone(), p.clone().into()).await.unwrap();
        }
    }
    raw.flush().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in [&a, &b] {
        let fired = alerts(&c, n, &key).await;
        assert!(fired.is_empty(), "replayed signals fired {fired:?}");
    }
    let rejected = metric(&c, &a, "fleetops_bus_rejected").await
        + metric(&c, &b, "fleetops_bus_rejected").await;
    assert!(rejected >= 5.0, "{rejected} rejected");
    // A third real line fires it: the rule was live all along.
    let (s, body) = call(
        &c,
        Method::POST,
        b.url(&format!("{DEV}/sessions/{sid}/logs")),
        &token,
        Some(json!([{"level": "error", "module": "arm", "message": "overheat 3"}])),
    )
    .await;
    assert_eq!(s, 202, "{body}");
    let t = std::time::Instant::now();
    while alerts(&c, &b, &key).await.is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the third line fired nothing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_show_a_client_certificate_to_a_nats_server_that_verifies_clients() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(certs.path());
    let (client_cert, client_key) = client_certificate(certs.path());
    let engines = Engines::start_on(Nats::start_with(&[
        "--tlsverify",
        "--tlscert",
        &cert,
        "--tlskey",
        &key,
        "--tlscacert",
        &ca,
    ]))
    .await;
    let trust = format!("tls_ca_file = \"{ca}\"\ntls_required = true");
    let bus =
        format!("{trust}\ntls_cert_file = \"{client_cert}\"\ntls_key_file = \"{client_key}\"");
    let a = engines.node_with("a", bus_with(&bus));
    let b = engines.node_with("b", bus_with(&bus));
    let c = client();
    let api = a.printed("API key:");
    let (sid, token) = session(&c, &a, &api).await;
    let mut ws = tail(&b, sid, &api).await;
    post_lines(
        &c,
        &a,
        sid,
        &token,
        &["with a client certificate".to_string()],
    )
    .await;
    assert_eq!(
        next_json(&mut ws).await["message"],
        "with a client certificate"
    );
    // Trusting the server but showing no certificate: refused.
    let refused = engines
        .try_node_with("c", bus_with(&trust))
        .err()
        .expect("a node without a client certificate started");
    assert!(refused.contains("[bus] url"), "{refused}");
}
