//! Two fleetops servers, each with a data directory of its own, on one PostgreSQL database:
//! everything both try to take at the same moment is taken once, decided by the database
//! (each server's own check passes; the write's claim or condition does not): names and
//! slugs, a webhook delivery's id, a test run's idempotency key, a runner's claim.

use serde_json::{Value, json};

use crate::common::*;
use crate::webhooks::{INST, REPO, SECRET, link, payload, push, sign};

/// The first of two servers sharing its database: it opens it shared too (a server that
/// takes its database alone refuses the second, and the second refuses to join it).
async fn first_with(f: impl FnOnce(&mut fleetops::config::Config)) -> Srv {
    start_with(move |c| {
        f(c);
        c.database.shared = true;
    })
    .await
}

/// A second server on the database of `first` (a start that finds the records in place, so
/// no first-start credentials): its base URL and its running handle.
async fn second(first: &Srv) -> (String, fleetops::startup::Running, tempfile::TempDir) {
    second_with(first, |_| {}).await
}

async fn second_with(
    first: &Srv,
    f: impl FnOnce(&mut fleetops::config::Config) + Send + 'static,
) -> (String, fleetops::startup::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = postgres::database_for(first._dir.path());
    let cfg = test_config(&dir, move |c| {
        f(c);
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

/// `GET {base}{path}` with the first server's key (either server reads the same records).
async fn get_json(s: &Srv, base: &str, path: &str) -> Value {
    let r = s
        .http
        .get(format!("{base}{path}"))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

postgres_only!(
    two_servers_racing_on_one_database_take_each_slug_once,
    threads = 4
);
async fn two_servers_racing_on_one_database_take_each_slug_once() {
    let a = first_with(|_| {}).await;
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
        let r = get_json(&a, &base, "/api/v1/organizations/default/projects").await;
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

postgres_only!(a_second_server_on_the_same_database_is_refused_at_start);
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

/// Two webhook servers on one database, `REPO` linked to the default project and held by
/// installation `INST`: the first, and the second's base URL and handle.
async fn two_webhook_servers() -> (Srv, String, fleetops::startup::Running, tempfile::TempDir) {
    let a = first_with(|c| c.scm.webhook_secret = SECRET.into()).await;
    link(&a, REPO).await;
    let (b, running_b, dir_b) = second_with(&a, |c| c.scm.webhook_secret = SECRET.into()).await;
    let (id, r) =
        crate::webhooks::deliver(&a, "installation", &payload("installation.created")).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(settled(&a, &id).await["outcome"], "processed");
    (a, b, running_b, dir_b)
}

/// A signed delivery of `body` with id `id` to the server at `base`: status and body.
async fn deliver_to(
    http: &reqwest::Client,
    base: &str,
    event: &str,
    id: &str,
    body: &Value,
) -> (u16, Value) {
    let bytes = serde_json::to_vec(body).unwrap();
    let r = http
        .post(format!("{base}/api/v1/scm/webhooks"))
        .header("content-type", "application/json")
        .header("X-Host-Event", event)
        .header("X-Host-Delivery", id)
        .header("X-Hub-Signature-256", sign(SECRET, &bytes))
        .body(bytes)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The delivery once a worker (either server's) has settled it: two servers and the
/// database share the machine's cores with the other tests, so this waits up to 30 s.
async fn settled(s: &Srv, id: &str) -> Value {
    for _ in 0..300 {
        let r = s
            .get(&format!("/api/v1/scm/deliveries/{id}"), s.key())
            .await;
        if r.status == 200 && r.body["outcome"] != "queued" {
            return r.body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("delivery {id} never settled");
}

/// The project's test runs of commit `sha`, as any server lists them.
async fn runs_of(s: &Srv, base: &str, sha: &str) -> Vec<Value> {
    let r = get_json(
        s,
        base,
        &format!("{DEV}/test-runs?commit_sha={sha}&page_size=100"),
    )
    .await;
    r["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("{r}"))
}

postgres_only!(
    one_delivery_id_posted_to_two_servers_at_once_is_accepted_once,
    threads = 4
);
async fn one_delivery_id_posted_to_two_servers_at_once_is_accepted_once() {
    let (a, b, running_b, _dir_b) = two_webhook_servers().await;
    let sha = "1".repeat(40);
    let body = push("refs/heads/main", &sha);
    let id = uuid::Uuid::new_v4().to_string();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.clone()
        };
        let (http, id, body) = (a.http.clone(), id.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            deliver_to(&http, &base, "push", &id, &body).await
        }));
    }
    let mut accepted = Vec::new();
    let mut duplicates = 0;
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
    // Worked once, whichever server's worker took it: one run.
    let settled = settled(&a, &id).await;
    assert_eq!(settled["outcome"], "dispatched", "{settled}");
    assert!(
        eventually(10, || async { runs_of(&a, &b, &sha).await.len() == 1 }).await,
        "{:?}",
        runs_of(&a, &b, &sha).await
    );
    running_b.stop().await;
}

postgres_only!(
    deliveries_of_one_commit_sent_to_two_servers_make_one_run,
    threads = 4
);
async fn deliveries_of_one_commit_sent_to_two_servers_make_one_run() {
    let (a, b, running_b, _dir_b) = two_webhook_servers().await;
    // Forty commits, each pushed in two deliveries (ids of their own, one idempotency key),
    // one to each server, all at once: both servers' workers decide at the same moments.
    let shas: Vec<String> = (0..40u64).map(|n| format!("{:040}", n + 500)).collect();
    let mut tasks = Vec::new();
    for sha in &shas {
        for base in [a.base.clone(), b.clone()] {
            let (http, body) = (a.http.clone(), push("refs/heads/main", sha));
            tasks.push(tokio::spawn(async move {
                let id = uuid::Uuid::new_v4().to_string();
                let (status, r) = deliver_to(&http, &base, "push", &id, &body).await;
                assert_eq!(status, 202, "{r}");
                id
            }));
        }
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    for pair in ids.chunks(2) {
        let mut outcomes = Vec::new();
        for id in pair {
            let d = settled(&a, id).await;
            outcomes.push((
                d["outcome"].clone(),
                d["reason"].clone(),
                d["test_run_id"].clone(),
            ));
        }
        outcomes.sort_by_key(|o| o.0.to_string());
        assert_eq!(
            (&outcomes[0].0, &outcomes[1].0, &outcomes[1].1),
            (
                &json!("dispatched"),
                &json!("skipped"),
                &json!("duplicate_job")
            ),
            "{outcomes:?}"
        );
        assert_eq!(outcomes[0].2, outcomes[1].2, "both name the one run");
    }
    for sha in &shas {
        let runs = runs_of(&a, &b, sha).await;
        assert_eq!(runs.len(), 1, "{sha}: {runs:?}");
        assert_eq!(runs[0]["idempotency_key"], format!("{REPO}@{sha}@main"));
    }
    running_b.stop().await;
}

postgres_only!(
    runners_polling_two_servers_never_get_the_same_run,
    threads = 4
);
async fn runners_polling_two_servers_never_get_the_same_run() {
    let (a, b, running_b, _dir_b) = two_webhook_servers().await;
    // Thirty queued runs, one per commit.
    for n in 0..30u64 {
        let mut body = push("refs/heads/main", &format!("{:040}", n + 100));
        body["installation"]["id"] = json!(INST);
        let (id, r) = crate::webhooks::deliver(&a, "push", &body).await;
        assert_eq!(r.status, 202, "{}", r.body);
        assert_eq!(settled(&a, &id).await["outcome"], "dispatched");
    }
    // Forty runners, half polling each server, all at once.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.clone()
        };
        let (http, key) = (a.http.clone(), a.key().to_string());
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(format!("{base}{DEV}/test-runs/claim"))
                .bearer_auth(key)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, body["id"].as_u64())
        }));
    }
    let mut claimed = Vec::new();
    let mut empty = 0;
    for t in tasks {
        match t.await.unwrap() {
            (200, Some(id)) => claimed.push(id),
            (204, None) => empty += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    claimed.sort();
    let all = claimed.clone();
    let before = claimed.len();
    claimed.dedup();
    assert_eq!(
        claimed.len(),
        before,
        "a run was handed to two runners: {all:?}"
    );
    assert_eq!((claimed.len(), empty), (30, 10));
    // Each claimed run is running once, on either server.
    for id in claimed {
        let r = a.get(&format!("{DEV}/test-runs/{id}"), a.key()).await;
        assert_eq!(r.body["status"], "running", "{}", r.body);
        assert_eq!(r.body["attempt"], 1, "{}", r.body);
    }
    running_b.stop().await;
}

postgres_only!(
    reservations_on_two_servers_never_exceed_the_organizations_quota,
    threads = 4
);
async fn reservations_on_two_servers_never_exceed_the_organizations_quota() {
    let limit = |c: &mut fleetops::config::Config| {
        c.tiers.get_mut("free").unwrap().storage_bytes = Some(24_000);
    };
    let a = first_with(limit).await;
    let mut secrets = Vec::new();
    for i in 0..4 {
        let r = a
            .post(
                "/api/v1/organizations/default/projects",
                a.key(),
                json!({"slug": format!("q{i}")}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        secrets.push(r.body["project_secret"].as_str().unwrap().to_string());
    }
    let (b, running_b, _dir_b) = second_with(&a, limit).await;
    // Thirty-two reservations of 1,500 bytes, across four projects and both servers, at
    // once: sixteen fit.
    let mut tasks = Vec::new();
    for n in 0..32 {
        let base = if n % 2 == 0 {
            a.base.clone()
        } else {
            b.clone()
        };
        let (http, secret) = (a.http.clone(), secrets[n % 4].clone());
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(format!(
                    "{base}/api/v1/projects/default/q{}/capsules/upload-url",
                    n % 4
                ))
                .header("X-Project-Secret", secret)
                .json(
                    &json!({"name": "q", "version": format!("1.0.{n}"), "capsule_type": "OS",
                    "file_format": ".tar", "file_size_bytes": 1_500}),
                )
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [[201; 16], [413; 16]].concat(), "{statuses:?}");
    let mut held = 0;
    for i in 0..4 {
        let r = a
            .get(&format!("/api/v1/projects/default/q{i}/capsules"), a.key())
            .await;
        held += r.body.as_array().map_or(0, |a| a.len()) * 1_500;
    }
    assert_eq!(held, 24_000);
    running_b.stop().await;
}
