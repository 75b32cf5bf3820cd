//! Nodes log in to a NATS server that asks for credentials (user and password, a token, an
//! nkey seed, a `.creds` file in operator mode) or for TLS (the server's CA, a client certificate); a node without what it
//! asks is refused at start, saying so without printing its secret.

use reqwest::Method;
use serde_json::json;

use crate::harness::{Engines, Nats, call, client};
use crate::live::{next_json, post_lines, session, tail};

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
    // A .creds file that cannot be read is named.
    let creds = engines
        .try_node_with("e", bus_with("creds_file = \"/nonexistent/node.creds\""))
        .err()
        .expect("refused");
    assert!(
        creds.contains("[bus] creds_file /nonexistent/node.creds"),
        "{creds}"
    );
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

/// A NATS JWT (`ed25519-nkey`) of `claims` (`nats` of the given kind), issued by `issuer`.
fn nats_jwt(issuer: &nkeys::KeyPair, sub: &str, nats: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": now,
        "iss": issuer.public_key(),
        "name": sub,
        "sub": sub,
        "nats": nats,
    });
    let body = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let sig = issuer.sign(body.as_bytes()).unwrap();
    format!("{body}.{}", b64(&sig))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_log_in_with_a_creds_file_to_a_nats_server_in_operator_mode() {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let op_jwt = nats_jwt(
        &operator,
        &operator.public_key(),
        json!({"type": "operator", "version": 2}),
    );
    let acc_jwt = nats_jwt(
        &operator,
        &account.public_key(),
        json!({"type": "account", "version": 2, "limits": {"subs": -1, "data": -1,
            "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1,
            "leaf": -1}}),
    );
    let user_jwt = nats_jwt(
        &account,
        &user.public_key(),
        json!({"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1,
            "payload": -1}),
    );
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "operator: \"{op_jwt}\"\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{acc_jwt}\"\n}}\n",
            account.public_key()
        ),
    )
    .unwrap();
    let creds = dir.path().join("node.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
    let engines = Engines::start_on(Nats::start_with(&["-c", conf.to_str().unwrap()])).await;
    let login = format!("creds_file = \"{}\"", creds.display());
    let a = engines.node_with("a", bus_with(&login));
    let b = engines.node_with("b", bus_with(&login));
    let c = client();
    let api = a.printed("API key:");
    let (sid, token) = session(&c, &a, &api).await;
    let mut ws = tail(&b, sid, &api).await;
    post_lines(&c, &a, sid, &token, &["with a creds file".to_string()]).await;
    assert_eq!(next_json(&mut ws).await["message"], "with a creds file");
    let refused = engines
        .try_node_with("c", |c| c)
        .err()
        .expect("a node without the creds file started");
    assert!(refused.contains("[bus] url"), "{refused}");
}
