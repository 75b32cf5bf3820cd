//! The webhook intake and the test-run queue on two nodes: one delivery id accepted once
//! whichever node each copy reaches, and runners polling both nodes never handed one run.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{Engines, Node, WEBHOOK_SECRET, call, client};

const DEV: &str = "/api/v1/organizations/default/projects/default";
const REPO: &str = "Codertocat/Hello-World";
const INST: u64 = 957387;

fn payload(name: &str) -> Value {
    let path = format!("{}/tests/payloads/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn push(sha: &str) -> Value {
    let mut p = payload("push");
    p["ref"] = json!("refs/heads/main");
    p["after"] = json!(sha);
    p["deleted"] = json!(false);
    p["installation"]["id"] = json!(INST);
    p
}

async fn deliver(
    c: &reqwest::Client,
    base: &str,
    event: &str,
    id: &str,
    body: &Value,
) -> (u16, Value) {
    let bytes = serde_json::to_vec(body).unwrap();
    let r = c
        .post(format!("{base}/api/v1/scm/webhooks"))
        .header("content-type", "application/json")
        .header("X-Host-Event", event)
        .header("X-Host-Delivery", id)
        .header(
            "X-Hub-Signature-256",
            fleetops_testkit::sign(WEBHOOK_SECRET, &bytes),
        )
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The delivery once worked (its outcome no longer `queued`), as `n` shows it.
async fn settled(c: &reqwest::Client, n: &Node, key: &str, id: &str) -> Value {
    for _ in 0..300 {
        let (s, d) = call(
            c,
            Method::GET,
            n.url(&format!("/api/v1/scm/deliveries/{id}")),
            key,
            None,
        )
        .await;
        if s == 200 && d["outcome"] != "queued" {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("delivery {id} never settled");
}

/// Links the repository to the default project on `a` and delivers its installation through
/// `via`, waiting until it is worked.
async fn link(c: &reqwest::Client, a: &Node, via: &Node, key: &str) {
    let (s, r) = call(
        c,
        Method::POST,
        a.url(&format!("{DEV}/repositories")),
        key,
        Some(json!({"full_name": REPO})),
    )
    .await;
    assert_eq!(s, 201, "{r}");
    let id = uuid::Uuid::new_v4().to_string();
    let (s, r) = deliver(
        c,
        &via.base,
        "installation",
        &id,
        &payload("installation.created"),
    )
    .await;
    assert_eq!(s, 202, "{r}");
    assert_eq!(settled(c, a, key, &id).await["outcome"], "processed");
}

/// Two nodes, the repository linked to the default project and its installation known.
async fn linked(engines: &Engines) -> (Node, Node, String) {
    let a = engines.node("a");
    let b = engines.node("b");
    let key = a.printed("API key:");
    link(&client(), &a, &b, &key).await;
    (a, b, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_delivery_id_posted_100_times_over_both_nodes_is_queued_once_and_makes_one_run() {
    let engines = Engines::start().await;
    let (a, b, key) = linked(&engines).await;
    let c = client();
    let sha = "1".repeat(40);
    let body = push(&sha);
    let id = uuid::Uuid::new_v4().to_string();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let node = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let (c, id, body) = (c.clone(), id.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            deliver(&c, &node, "push", &id, &body).await
        }));
    }
    let (mut accepted, mut duplicates) = (Vec::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            (202, body) => accepted.push(body),
            (401, body) => {
                assert_eq!(body["detail"], "Duplicate delivery", "{body}");
                duplicates += 1;
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(
        accepted,
        vec![json!({"status": "queued", "delivery_id": id})]
    );
    assert_eq!(duplicates, 99);
    assert_eq!(settled(&c, &b, &key, &id).await["outcome"], "dispatched");
    for n in [&a, &b] {
        let (s, runs) = call(
            &c,
            Method::GET,
            n.url(&format!("{DEV}/test-runs?commit_sha={sha}")),
            &key,
            None,
        )
        .await;
        assert_eq!(s, 200, "{runs}");
        assert_eq!(runs["items"].as_array().unwrap().len(), 1, "{runs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_polling_both_nodes_are_never_handed_the_same_run() {
    let engines = Engines::start().await;
    let (a, b, key) = linked(&engines).await;
    let c = client();
    for n in 0..30u64 {
        let id = uuid::Uuid::new_v4().to_string();
        let via = if n % 2 == 0 { &a } else { &b };
        let (s, r) = deliver(
            &c,
            &via.base,
            "push",
            &id,
            &push(&format!("{:040}", n + 100)),
        )
        .await;
        assert_eq!(s, 202, "{r}");
        assert_eq!(settled(&c, &a, &key, &id).await["outcome"], "dispatched");
    }
    let mut tasks = Vec::new();
    for i in 0..40 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let (c, key) = (c.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            call(
                &c,
                Method::POST,
                format!("{base}{DEV}/test-runs/claim"),
                &key,
                Some(json!({})),
            )
            .await
        }));
    }
    let (mut claimed, mut empty) = (Vec::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            (200, body) => claimed.push(body["id"].as_u64().unwrap()),
            (204, _) => empty += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let all = claimed.clone();
    claimed.sort();
    claimed.dedup();
    assert_eq!(
        claimed.len(),
        all.len(),
        "a run was handed out twice: {all:?}"
    );
    assert_eq!((claimed.len(), empty), (30, 10));
    for id in claimed {
        let (_, r) = call(
            &c,
            Method::GET,
            b.url(&format!("{DEV}/test-runs/{id}")),
            &key,
            None,
        )
        .await;
        assert_eq!(
            (r["status"].as_str(), r["attempt"].as_u64()),
            (Some("running"), Some(1)),
            "{r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_worked_by_the_other_node_once_the_workers_node_is_killed() {
    let engines = Engines::start().await;
    // A alone first: its worker takes the queue's lease.
    let a = engines.node("a");
    let c = client();
    let key = a.printed("API key:");
    link(&c, &a, &a, &key).await;
    let b = engines.node("b");
    a.kill();
    let killed = std::time::Instant::now();
    let sha = "2".repeat(40);
    let id = uuid::Uuid::new_v4().to_string();
    let (s, r) = deliver(&c, &b.base, "push", &id, &push(&sha)).await;
    assert_eq!(s, 202, "{r}");
    let d = settled(&c, &b, &key, &id).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let took = killed.elapsed();
    assert!(
        took < Duration::from_millis(crate::harness::LEASE_TTL_MS) + Duration::from_secs(3),
        "worked {took:?} after the kill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_by_its_operator_hands_the_webhook_queue_over_at_once() {
    // Leases of a minute: only a lease given back is taken within seconds.
    let engines = Engines::start().await.with_leases_of(60_000);
    let a = engines.node("a");
    let c = client();
    let key = a.printed("API key:");
    link(&c, &a, &a, &key).await;
    let b = engines.node("b");
    a.stop();
    let stopped = std::time::Instant::now();
    let id = uuid::Uuid::new_v4().to_string();
    let (s, r) = deliver(&c, &b.base, "push", &id, &push(&"3".repeat(40))).await;
    assert_eq!(s, 202, "{r}");
    let d = settled(&c, &b, &key, &id).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let took = stopped.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "worked {took:?} after the stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_secret_rotated_on_one_node_verifies_deliveries_on_the_other_at_once() {
    let engines = Engines::start().await;
    let (a, b, key) = linked(&engines).await;
    let c = client();
    let (s, r) = call(
        &c,
        Method::POST,
        a.url("/api/v1/scm/webhook-secret/rotate"),
        &key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let fresh = r["webhook_secret"].as_str().unwrap().to_string();
    let body = serde_json::to_vec(&push(&"3".repeat(40))).unwrap();
    let r = c
        .post(b.url("/api/v1/scm/webhooks"))
        .header("content-type", "application/json")
        .header("X-Host-Event", "push")
        .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
        .header("X-Hub-Signature-256", fleetops_testkit::sign(&fresh, &body))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    // The previous secret still verifies on both during its grace period.
    let id = uuid::Uuid::new_v4().to_string();
    let (s, r) = deliver(&c, &b.base, "push", &id, &push(&"4".repeat(40))).await;
    assert_eq!(s, 202, "{r}");
}
