//! A project's records written on two nodes at once: each project has one writer at a time
//! across the nodes, so a decision made on one node from what it read is never undone by the
//! other's.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::harness::{Engines, Node, call, client};

const DEV: &str = "/api/v1/organizations/default/projects/default";

/// `n` devices made on `node`: (id, device token) each.
async fn devices(c: &reqwest::Client, node: &Node, key: &str, n: usize) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for i in 0..n {
        let (s, d) = call(
            c,
            Method::POST,
            node.url(&format!("{DEV}/devices")),
            key,
            Some(json!({"name": format!("r{i}")})),
        )
        .await;
        assert_eq!(s, 201, "{d}");
        out.push((
            d["id"].as_u64().unwrap(),
            d["device_token"].as_str().unwrap().to_string(),
        ));
    }
    out
}

/// The ids of the project's devices as `node` lists them.
async fn listed(c: &reqwest::Client, node: &Node, key: &str) -> Vec<u64> {
    let (s, b) = call(
        c,
        Method::GET,
        node.url(&format!("{DEV}/devices?limit=100")),
        key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_deleted_on_one_node_while_the_other_takes_its_heartbeats_stays_deleted() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let fleet = devices(&c, &a, &key, 24).await;
    let mut beating = Vec::new();
    for (id, token) in &fleet {
        // Heartbeats on B, as fast as they are answered, until the device is gone.
        let (c, url, token) = (
            c.clone(),
            b.url(&format!("{DEV}/devices/{id}/heartbeat")),
            token.clone(),
        );
        beating.push(tokio::spawn(async move {
            let mut accepted = 0;
            loop {
                let (s, body) = call(&c, Method::POST, url.clone(), &token, Some(json!({}))).await;
                match s {
                    202 => accepted += 1,
                    401 | 404 => return accepted,
                    other => panic!("heartbeat answered {other}: {body}"),
                }
            }
        }));
    }
    // Deleted on A while B takes their heartbeats.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (id, _) in &fleet {
        let (s, body) = call(
            &c,
            Method::DELETE,
            a.url(&format!("{DEV}/devices/{id}")),
            &key,
            None,
        )
        .await;
        assert_eq!(s, 204, "{body}");
    }
    let mut accepted = 0;
    for h in beating {
        accepted += h.await.unwrap();
    }
    assert!(accepted > 0, "B took heartbeats before the deletions");
    for n in [&a, &b] {
        assert_eq!(listed(&c, n, &key).await, Vec::<u64>::new());
        for (id, _) in &fleet {
            let (s, body) = call(
                &c,
                Method::GET,
                n.url(&format!("{DEV}/devices/{id}")),
                &key,
                None,
            )
            .await;
            assert_eq!(s, 404, "device {id} came back on {}: {body}", n.base);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_deleted_on_one_node_while_the_other_adds_it_to_a_group_leaves_no_member_behind() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    let fleet = devices(&c, &a, &key, 64).await;
    // A group of its own for each device: on B it joins its group while A deletes it.
    let mut groups = Vec::new();
    for i in 0..fleet.len() {
        let (s, g) = call(
            &c,
            Method::POST,
            a.url(&format!("{DEV}/device-groups")),
            &key,
            Some(json!({"name": format!("g{i}"), "device_ids": []})),
        )
        .await;
        assert_eq!(s, 201, "{g}");
        groups.push(g["id"].as_u64().unwrap());
    }
    let mut pairs = Vec::new();
    for ((id, _), g) in fleet.iter().zip(&groups) {
        let join = call(
            &c,
            Method::PATCH,
            b.url(&format!("{DEV}/device-groups/{g}")),
            &key,
            Some(json!({"device_ids": [id]})),
        );
        let delete = call(
            &c,
            Method::DELETE,
            a.url(&format!("{DEV}/devices/{id}")),
            &key,
            None,
        );
        pairs.push(async move { tokio::join!(join, delete) });
    }
    for ((joined, body), (deleted, _)) in futures::future::join_all(pairs).await {
        // Joined before the deletion, or refused after it.
        assert!(joined == 200 || joined == 422, "{joined}: {body}");
        assert_eq!(deleted, 204);
    }
    for n in [&a, &b] {
        for g in &groups {
            let (s, body) = call(
                &c,
                Method::GET,
                n.url(&format!("{DEV}/device-groups/{g}")),
                &key,
                None,
            )
            .await;
            assert_eq!(s, 200, "{body}");
            assert_eq!(body["device_ids"], json!([]), "group {g} on {}", n.base);
        }
    }
}

/// `n` copies of one request, spread over `nodes` in turn and sent at once: their statuses.
async fn at_once(
    c: &reqwest::Client,
    nodes: [&Node; 2],
    n: usize,
    path: &str,
    key: &str,
    body: serde_json::Value,
) -> Vec<u16> {
    let posts = (0..n).map(|i| {
        let url = nodes[i % 2].url(path);
        let (c, body) = (c.clone(), body.clone());
        async move { call(&c, Method::POST, url, key, Some(body)).await.0 }
    });
    futures::future::join_all(posts).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_linked_on_both_nodes_at_once_is_linked_once() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    for round in 0..8 {
        let statuses = at_once(
            &c,
            [&a, &b],
            10,
            &format!("{DEV}/repositories"),
            &key,
            json!({"full_name": format!("acme/nav-{round}")}),
        )
        .await;
        let created = statuses.iter().filter(|s| **s == 201).count();
        let refused = statuses.iter().filter(|s| **s == 409).count();
        assert_eq!((created, refused), (1, 9), "{statuses:?}");
    }
    let (s, b) = call(
        &c,
        Method::GET,
        a.url(&format!("{DEV}/repositories?limit=100")),
        &key,
        None,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["items"].as_array().unwrap().len(), 8, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_on_both_nodes_at_once_is_added_once() {
    let engines = Engines::start().await;
    let a = engines.node("a");
    let b = engines.node("b");
    let c = client();
    let key = a.printed("API key:");
    for i in 0..8 {
        let email = format!("m{i}@example.com");
        let (s, u) = call(
            &c,
            Method::POST,
            a.url("/api/v1/users"),
            &key,
            Some(json!({"email": email, "password": "correct horse battery"})),
        )
        .await;
        assert_eq!(s, 201, "{u}");
        let statuses = at_once(
            &c,
            [&a, &b],
            10,
            "/api/v1/organizations/default/members",
            &key,
            json!({"email": email, "role": "member"}),
        )
        .await;
        let created = statuses.iter().filter(|s| **s == 201).count();
        let refused = statuses.iter().filter(|s| **s == 409).count();
        assert_eq!((created, refused), (1, 9), "{statuses:?}");
    }
    // Each of the eight is a member, once, as either node reads it.
    for i in 0..8 {
        for n in [&a, &b] {
            let (s, t) = call(
                &c,
                Method::POST,
                n.url("/api/v1/auth/login"),
                "",
                Some(json!({"email": format!("m{i}@example.com"), "password": "correct horse battery"})),
            )
            .await;
            assert_eq!(s, 200, "{t}");
            let token = t["access_token"].as_str().unwrap();
            let (s, me) = call(&c, Method::GET, n.url("/api/v1/users/me"), token, None).await;
            assert_eq!(s, 200, "{me}");
            assert_eq!(
                me["organizations"],
                json!([{"slug": "default", "role": "member"}]),
                "{me}"
            );
        }
    }
}
