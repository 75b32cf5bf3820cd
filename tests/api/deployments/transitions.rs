//! A package's transitions: rollout results, references and lists, concurrent activations,
//! roles, tenancy and the order of checks, and a result published by its writer after the
//! caller left.

use serde_json::json;

use super::*;
use crate::capsules::CAPS;
use crate::configurations::{CONFS, capsule, conf, configure};

each_backend!(transitions_rollout_results_references_and_lists);
/// Only draft -> active -> deprecated; rollout results once active, per device; what a
/// package refers to stays; sessions name it; lists by status.
async fn transitions_rollout_results_references_and_lists() {
    let Fleet {
        s,
        nav,
        good_conf,
        d1,
        tok1,
        d2,
        body,
        ..
    } = fleet().await;
    let r = s.post(DEPS, s.key(), body.clone()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let dep = r.body["id"].as_u64().unwrap();
    // Rollout results before activation: 409.
    let ds = format!("{DEPS}/{dep}/device-status");
    s.post(
        &ds,
        s.key(),
        json!({"device_id": d1, "status": "succeeded"}),
    )
    .await
    .assert_error(409);

    // Transitions: only draft -> active -> deprecated.
    let act = format!("{DEPS}/{dep}/activate");
    let dpr = format!("{DEPS}/{dep}/deprecate");
    s.post(&dpr, s.key(), json!({})).await.assert_error(409);
    let r = s.post(&act, s.key(), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["deployment_status"], "active");
    assert!(r.body["deployed_at"].as_str().unwrap().ends_with('Z'));
    s.post(&act, s.key(), json!({})).await.assert_error(409);
    s.patch(&format!("{DEPS}/{dep}"), s.key(), json!({"name": "n"}))
        .await
        .assert_error(409);
    s.delete(&format!("{DEPS}/{dep}"), s.key())
        .await
        .assert_error(409);

    // Rollout results: the device's own token or a member; counted per device.
    let mut events = s
        .running
        .as_ref()
        .unwrap()
        .runtime
        .pipeline
        .subscribe_rollouts();
    let r = s
        .raw(
            s.http
                .post(s.url(&ds))
                .bearer_auth(&tok1)
                .json(&json!({"device_id": d1, "status": "succeeded", "message": "ok"})),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["status"], "succeeded");
    let e = events.recv().await.unwrap();
    assert_eq!((e.deployment_id, e.device_id), (dep, d1));
    assert_eq!((e.status.as_str(), e.previous), ("succeeded", None));
    let r = s
        .raw(
            s.http
                .post(s.url(&ds))
                .bearer_auth(&tok1)
                .json(&json!({"device_id": d2, "status": "failed"})),
        )
        .await;
    r.assert_error(403);
    let r = s
        .post(&ds, s.key(), json!({"device_id": d2, "status": "failed"}))
        .await;
    assert_eq!(r.status, 202);
    s.post(&ds, s.key(), json!({"device_id": d2, "status": "done"}))
        .await
        .assert_error(422);
    s.post(
        &ds,
        s.key(),
        json!({"device_id": 999_999, "status": "failed"}),
    )
    .await
    .assert_error(422);
    let d = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(d.status, 200);
    assert_eq!(
        d.body["device_results"],
        json!({"succeeded": 1, "failed": 1})
    );
    let e = events.recv().await.unwrap();
    assert_eq!(e.device_id, d2);
    let r = s
        .post(
            &ds,
            s.key(),
            json!({"device_id": d2, "status": "succeeded"}),
        )
        .await;
    assert_eq!(r.status, 202);
    let e = events.recv().await.unwrap();
    assert_eq!(
        (e.status.as_str(), e.previous.map(|p| p.as_str())),
        ("succeeded", Some("failed"))
    );
    let d = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(
        d.body["device_results"],
        json!({"succeeded": 2, "failed": 0})
    );

    // What the deployment refers to cannot be deleted.
    s.delete(&format!("{CAPS}/{nav}"), s.key())
        .await
        .assert_error(409);
    s.delete(&format!("{CONFS}/{good_conf}"), s.key())
        .await
        .assert_error(409);

    // Sessions can name the package.
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            s.key(),
            json!({"device_id": d1, "package_id": dep}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["package"], json!({"id": dep, "name": "nav rollout"}));
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": d1, "package_id": 999_999}),
    )
    .await
    .assert_error(422);

    // Deprecate, and nothing after.
    let r = s.post(&dpr, s.key(), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["deployment_status"], "deprecated");
    assert!(r.body["deprecated_at"].as_str().unwrap().ends_with('Z'));
    assert!(r.body["deployed_at"].is_string());
    s.post(&dpr, s.key(), json!({})).await.assert_error(409);
    s.post(&act, s.key(), json!({})).await.assert_error(409);

    // Lists: paginated, filtered by status.
    for i in 0..3 {
        let mut b = body.clone();
        b["name"] = json!(format!("d{i}"));
        assert_eq!(s.post(DEPS, s.key(), b).await.status, 201);
    }
    let l = s.get(&format!("{DEPS}?page_size=2"), s.key()).await;
    assert_eq!(l.body["total"], 4);
    assert_eq!(l.body["items"].as_array().unwrap().len(), 2);
    assert_eq!(l.body["items"][0]["name"], "d2");
    let l = s
        .get(&format!("{DEPS}?deployment_status=draft"), s.key())
        .await;
    assert_eq!(l.body["total"], 3);
    let l = s
        .get(&format!("{DEPS}?deployment_status=deprecated"), s.key())
        .await;
    assert_eq!(l.body["total"], 1);
    assert_eq!(l.body["items"][0]["id"], dep);
    s.get(&format!("{DEPS}?deployment_status=gone"), s.key())
        .await
        .assert_error(422);
}

each_backend!(concurrent_activations_of_one_draft_succeed_once);
async fn concurrent_activations_of_one_draft_succeed_once() {
    let s = start().await;
    let nav = capsule(&s, "nav", "1.0.0").await;
    let r = s
        .post(
            DEPS,
            s.key(),
            json!({"name": "n", "composition_tag": "t", "capsule_id": nav, "target_devices": []}),
        )
        .await;
    let dep = r.body["id"].as_u64().unwrap();
    let url = format!("{DEPS}/{dep}/activate");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (http, u, k) = (s.http.clone(), s.url(&url), s.key().to_string());
        tasks.push(tokio::spawn(async move {
            http.post(u)
                .bearer_auth(k)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    codes.sort();
    assert_eq!(codes, vec![200, 409, 409, 409, 409, 409, 409, 409]);
}

each_backend!(roles_tenancy_and_order_of_checks);
/// Roles and tenancy on the pipeline's routes: a viewer reads and plans but changes nothing;
/// another project's records are 404; a missing record is 404 before its body is read.
async fn roles_tenancy_and_order_of_checks() {
    let s = start().await;
    let nav = capsule(&s, "nav", "1.0.0").await;
    let (cfg, r) = configure(&s, conf("c", nav, ".json", None), b"{}").await;
    assert_eq!(r.body["validation_status"], "passed");
    let body = json!({"name": "n", "composition_tag": "t", "capsule_id": nav,
                      "configuration_id": cfg, "target_devices": []});
    let dep = s.post(DEPS, s.key(), body.clone()).await.body["id"]
        .as_u64()
        .unwrap();

    let viewer = s.user("viewer@x.io").await;
    let r = s
        .post(
            "/api/v1/organizations/default/members",
            s.key(),
            json!({"email": "viewer@x.io", "role": "viewer"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(s.get(DEPS, &viewer).await.status, 200);
    assert_eq!(
        s.get(&format!("{CONFS}/{cfg}/explain"), &viewer)
            .await
            .status,
        200
    );
    assert_eq!(
        s.post(&format!("{DEPS}/plan"), &viewer, body.clone())
            .await
            .status,
        200
    );
    s.post(DEPS, &viewer, body.clone()).await.assert_error(403);
    s.patch(&format!("{DEPS}/{dep}"), &viewer, json!({"name": "x"}))
        .await
        .assert_error(403);
    s.post(&format!("{DEPS}/{dep}/activate"), &viewer, json!({}))
        .await
        .assert_error(403);
    s.delete(&format!("{DEPS}/{dep}"), &viewer)
        .await
        .assert_error(403);
    s.delete(&format!("{CONFS}/{cfg}"), &viewer)
        .await
        .assert_error(403);
    s.delete(&format!("{CAPS}/{nav}"), &viewer)
        .await
        .assert_error(403);

    // Another project of the same organization sees none of them.
    let r = s
        .post(
            "/api/v1/organizations/default/projects",
            s.key(),
            json!({"slug": "other"}),
        )
        .await;
    assert_eq!(r.status, 201);
    let other = "/api/v1/projects/default/other";
    for path in [
        format!("{other}/capsules/{nav}"),
        format!("{other}/configurations/{cfg}"),
        format!("{other}/configurations/{cfg}/explain"),
        format!("{other}/deployments/{dep}"),
    ] {
        s.get(&path, s.key()).await.assert_error(404);
    }
    s.delete(&format!("{other}/configurations/{cfg}"), s.key())
        .await
        .assert_error(404);
    // ... and cannot deploy this project's capsule.
    let r = s
        .post(&format!("{other}/deployments"), s.key(), body.clone())
        .await;
    assert!(r.assert_error(422).contains("capsule_id"));

    // 404 before the body is looked at.
    let r = s
        .raw(
            s.http
                .patch(s.url(&format!("{DEPS}/999999")))
                .bearer_auth(s.key())
                .header("content-type", "application/json")
                .body("{not json"),
        )
        .await;
    r.assert_error(404);
    // A non-draft with bad input: 422 before 409.
    s.post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    s.patch(&format!("{DEPS}/{dep}"), s.key(), json!({"name": ""}))
        .await
        .assert_error(422);
    s.patch(&format!("{DEPS}/{dep}"), s.key(), json!({"name": "ok"}))
        .await
        .assert_error(409);
}

each_backend!(
    a_rollout_result_is_published_by_its_writer_even_when_the_caller_left,
    threads = 2
);
/// A rollout result leaves the project's actor, not the request: a device whose connection
/// drops after its report was applied, while it waits for the group commit, still has its
/// result stored and published once; a refused report publishes nothing.
async fn a_rollout_result_is_published_by_its_writer_even_when_the_caller_left() {
    // A slow group commit: a caller waits for it well after its write was applied.
    let s = start_with(|c| c.storage.commit_delay_us = 500_000).await;
    let nav = capsule(&s, "nav", "1.0.0").await;
    let (d1, _) = device(&s, "r1", json!({})).await;
    let r = s
        .post(
            DEPS,
            s.key(),
            json!({"name": "n", "composition_tag": "t", "capsule_id": nav, "target_devices": [d1]}),
        )
        .await;
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let mut events = rt.pipeline.subscribe_rollouts();
    let results = format!("{DEPS}/{dep}/device-status");

    // Refused (unknown device): no event.
    s.post(
        &results,
        s.key(),
        json!({"device_id": 999_999, "status": "failed"}),
    )
    .await
    .assert_error(422);

    let (http, url, key) = (s.http.clone(), s.url(&results), s.key().to_string());
    let caller = tokio::spawn(async move {
        http.post(url)
            .bearer_auth(key)
            .json(&json!({"device_id": d1, "status": "failed", "message": "gone"}))
            .send()
            .await
    });
    // Applied (visible to reads), not yet answered: the device hangs up.
    let store = rt.store().clone();
    assert!(
        eventually(10, || {
            let store = store.clone();
            async move { store.device_result(dep, d1).unwrap().is_some() }
        })
        .await
    );
    caller.abort();
    let _ = caller.await;
    let e = tokio::time::timeout(std::time::Duration::from_secs(10), events.recv())
        .await
        .expect("the written result is published")
        .unwrap();
    assert_eq!((e.deployment_id, e.device_id), (dep, d1));
    assert_eq!(
        (e.status.as_str(), e.previous.map(|p| p.as_str())),
        ("failed", None)
    );
    let d = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(
        d.body["device_results"],
        json!({"succeeded": 0, "failed": 1})
    );
    // Exactly once, and nothing for the refused report.
    assert!(matches!(
        events.try_recv(),
        Err(tokio::sync::broadcast::error::TryRecvError::Empty)
    ));
}
