//! Two fleetops servers, each with a data directory of its own, on one PostgreSQL database:
//! every name both try to take at the same moment is taken once, decided by the database
//! (each server's own check passes; the write's claim on the name's key does not).

use serde_json::{Value, json};

use crate::common::*;

/// A second server on the database of `first` (a start that finds the records in place, so
/// no first-start credentials): its base URL and its running handle.
async fn second(first: &Srv) -> (String, fleetops::startup::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database_for(first._dir.path());
    let cfg = test_config(&dir, move |c| {
        c.database.url = url;
        // Both servers on one database: refused unless told (the store's own decisions are
        // what this tests; a server's per-process state is not shared).
        c.database.shared = true;
    });
    let running = fleetops::startup::start(cfg).await.unwrap();
    assert!(
        running.initial.is_none(),
        "the second server found the records"
    );
    (format!("http://{}", running.addr), running, dir)
}

async fn post(http: &reqwest::Client, url: String, key: &str, body: Value) -> u16 {
    http.post(url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_racing_on_one_database_take_each_slug_once() {
    let a = start().await;
    let (b, running_b, _dir_b) = second(&a).await;
    let key = a.key().to_string();
    let mut tasks = Vec::new();
    for i in 0..40 {
        for base in [a.base.clone(), b.clone()] {
            let (http, key) = (a.http.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let org = post(
                    &http,
                    format!("{base}/api/v1/organizations"),
                    &key,
                    json!({"slug": format!("race-{i}"), "name": "race"}),
                )
                .await;
                let project = post(
                    &http,
                    format!("{base}/api/v1/organizations/default/projects"),
                    &key,
                    json!({"slug": format!("p-{i}")}),
                )
                .await;
                (i, org, project)
            }));
        }
    }
    let mut got = std::collections::BTreeMap::<u32, Vec<(u16, u16)>>::new();
    for t in tasks {
        let (i, org, project) = t.await.unwrap();
        got.entry(i).or_default().push((org, project));
    }
    for (i, answers) in &got {
        let mut orgs: Vec<u16> = answers.iter().map(|a| a.0).collect();
        let mut projects: Vec<u16> = answers.iter().map(|a| a.1).collect();
        orgs.sort();
        projects.sort();
        assert_eq!(orgs, [201, 409], "organization race-{i}");
        assert_eq!(projects, [201, 409], "project p-{i}");
    }
    // Each server reads the one record of each.
    for base in [a.base.clone(), b.clone()] {
        let r: Value = a
            .http
            .get(format!("{base}/api/v1/organizations/default/projects"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let slugs: Vec<&str> = r["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["slug"].as_str())
            .filter(|s| s.starts_with("p-"))
            .collect();
        assert_eq!(slugs.len(), 40, "{r}");
    }
    running_b.stop().await;
}

#[tokio::test]
async fn a_second_server_on_the_same_database_is_refused_at_start() {
    let a = start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database_for(a._dir.path());
    let cfg = test_config(&dir, move |c| c.database.url = url);
    let e = match fleetops::startup::start(cfg).await {
        Ok(r) => {
            r.stop().await;
            panic!("a second server started on the database");
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("held by another fleetops server"), "{e}");
    // The first one serves on.
    let r = a.get("/api/v1/organizations", a.key()).await;
    assert_eq!(r.status, 200);
}
