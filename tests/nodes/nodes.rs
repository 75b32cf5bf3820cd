//! What two nodes on one set of engines agree on: credentials, readiness.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::harness::{Engines, call, client};

/// Signs in as the first administrator on `base`: an access token.
async fn sign_in(c: &reqwest::Client, base: &str, email: &str, password: &str) -> String {
    let (s, b) = call(
        c,
        Method::POST,
        format!("{base}/api/v1/auth/login"),
        "",
        Some(json!({"email": email, "password": password})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    b["access_token"].as_str().unwrap().to_string()
}

/// A new API key of the first administrator, made on `n`: the access token it was made with,
/// and the key as made.
async fn new_key(c: &reqwest::Client, n: &crate::harness::Node) -> (String, serde_json::Value) {
    let token = sign_in(
        c,
        &n.base,
        &n.printed("admin email:"),
        &n.printed("admin password:"),
    )
    .await;
    let (s, made) = call(
        c,
        Method::POST,
        n.url("/api/v1/auth/api-keys"),
        &token,
        Some(json!({"name": "robot"})),
    )
    .await;
    assert_eq!(s, 201, "{made}");
    (token, made)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_made_on_one_node_works_on_the_other_and_its_revocation_is_refused_there_within_a_second()
 {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let (token, made) = new_key(&c, &a).await;
    let key = made["key"].as_str().unwrap().to_string();
    // Each node enforces half of the tier's 1,000,000 requests a minute ([bus] nodes = 2).
    for n in [&a, &b] {
        let r = c
            .get(n.url("/api/v1/users/me"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit"], "500000");
    }
    // B has read (and cached) the key before it is revoked on A.
    for _ in 0..3 {
        let (s, me) = call(&c, Method::GET, b.url("/api/v1/users/me"), &key, None).await;
        assert_eq!(s, 200, "{me}");
    }
    let (s, _) = call(
        &c,
        Method::DELETE,
        a.url(&format!("/api/v1/auth/api-keys/{}", made["id"])),
        &token,
        None,
    )
    .await;
    assert_eq!(s, 204);
    let revoked = Instant::now();
    loop {
        let (s, _) = call(&c, Method::GET, b.url("/api/v1/users/me"), &key, None).await;
        if s == 401 {
            break;
        }
        assert_eq!(s, 200);
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "B still took the revoked key after {:?}",
            revoked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_the_other_node_within_a_second_while_the_bus_is_down() {
    let mut engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let (token, made) = new_key(&c, &a).await;
    let robot = made["key"].as_str().unwrap().to_string();
    assert_eq!(
        call(&c, Method::GET, b.url("/api/v1/users/me"), &robot, None)
            .await
            .0,
        200
    );
    engines.nats.stop();
    let (s, _) = call(
        &c,
        Method::DELETE,
        a.url(&format!("/api/v1/auth/api-keys/{}", made["id"])),
        &token,
        None,
    )
    .await;
    assert_eq!(s, 204);
    let revoked = Instant::now();
    while call(&c, Method::GET, b.url("/api/v1/users/me"), &robot, None)
        .await
        .0
        == 200
    {
        assert!(revoked.elapsed() < Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        call(&c, Method::GET, b.url("/api/v1/users/me"), &robot, None)
            .await
            .0,
        401
    );
    // The first key still works on both.
    assert_eq!(
        call(&c, Method::GET, b.url("/api/v1/users/me"), &key, None)
            .await
            .0,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_stays_ready_but_degraded_while_the_bus_is_down_and_healthz_stays_alive() {
    let mut engines = Engines::start().await;
    let a = engines.node("a");
    let c = client();
    let (s, r) = call(&c, Method::GET, a.url("/readyz"), "", None).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r,
        json!({"status": "ready", "database": "ok", "object_store": "ok", "bus": "ok"})
    );
    engines.nats.stop();
    let until = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let (s, r) = call(&c, Method::GET, a.url("/readyz"), "", None).await;
        assert_eq!(s, 200, "{r}");
        if r["status"] != "ready" || Instant::now() > until {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        r,
        json!({"status": "degraded", "database": "ok", "object_store": "ok",
            "bus": "unreachable", "detail": "Not reachable: bus"})
    );
    assert_eq!(
        call(&c, Method::GET, a.url("/healthz"), "", None).await.0,
        200
    );
    engines.nats.restart();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, r) = call(&c, Method::GET, a.url("/readyz"), "", None).await;
        if r["status"] == "ready" {
            break;
        }
        assert!(
            Instant::now() < until,
            "the bus came back but /readyz did not: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_reach_its_object_store_is_not_ready() {
    let engines = Engines::start().await;
    // A server that takes connections and never answers (held until the test ends, so no
    // other test gets its port).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let a = engines.node_with_s3("a", &endpoint);
    let c = client();
    let r = c.get(a.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["database"], "ok");
    assert_eq!(body["bus"], "ok");
    assert!(
        body["object_store"]
            .as_str()
            .unwrap()
            .starts_with("unreachable"),
        "{body}"
    );
    assert_eq!(body["detail"], "Not reachable: object_store");
    assert_eq!(body["status_code"], 503);
    assert_eq!(
        call(&c, Method::GET, a.url("/healthz"), "", None).await.0,
        200
    );
    drop(silent);
}

/// A capsule confirm with project secret `secret` on `n`: 404 (no such capsule) once the
/// secret is accepted, 401 when it is not.
async fn confirm_with(c: &reqwest::Client, n: &crate::harness::Node, secret: &str) -> u16 {
    c.post(n.url("/api/v1/projects/default/default/capsules/999999/confirm"))
        .header("X-Project-Secret", secret)
        .json(&json!({"checksum_sha256": "0".repeat(64)}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_secret_rotated_on_one_node_is_refused_on_the_other_within_a_second() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let old = a.printed("project secret:");
    assert_eq!(confirm_with(&c, &b, &old).await, 404);
    let (s, r) = call(
        &c,
        Method::POST,
        a.url("/api/v1/organizations/default/projects/default/rotate-secret"),
        &key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let new = r["project_secret"].as_str().unwrap().to_string();
    let rotated = Instant::now();
    while confirm_with(&c, &b, &old).await == 404 {
        assert!(
            rotated.elapsed() < Duration::from_secs(1),
            "the old secret still works on B"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(confirm_with(&c, &b, &old).await, 401);
    assert_eq!(confirm_with(&c, &b, &new).await, 404);
}
