//! Deployment packages through the real server: what blocks one (409 naming which, 422 for
//! bad input), targets by id, group and labels, plan, every allowed and forbidden transition,
//! drafts edited and deleted, rollout results (and the event the alert evaluator hears),
//! references that keep capsules and configurations, and sessions linked to a package.

use serde_json::{Value, json};

use crate::capsules::{CAPS, archive, publish};
use crate::common::*;
use crate::configurations::{CONFS, capsule, conf, configure};

pub(crate) const DEPS: &str = "/api/v1/projects/default/default/deployments";

pub(crate) async fn device(s: &Srv, name: &str, labels: Value) -> (u64, String) {
    let r = s
        .post(
            &format!("{DEV}/devices"),
            s.key(),
            json!({"name": name, "labels": labels}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    )
}

/// A project with capsules (nav 1.2.0 and 2.0.0, arm 1.0.0, a broken one), two
/// configurations of nav (one passed, one failed), devices r1-r4 (r2 in group g) and a valid
/// package body targeting r1, the group and `site=a`.
pub(crate) struct Fleet {
    pub(crate) s: Srv,
    pub(crate) nav: u64,
    pub(crate) nav2: u64,
    pub(crate) arm: u64,
    pub(crate) broken: u64,
    pub(crate) good_conf: u64,
    pub(crate) bad_conf: u64,
    pub(crate) d1: u64,
    pub(crate) tok1: String,
    pub(crate) d2: u64,
    pub(crate) d3: u64,
    pub(crate) g: u64,
    pub(crate) body: Value,
}

pub(crate) async fn fleet() -> Fleet {
    let s = start().await;
    let nav = capsule(&s, "nav", "1.2.0").await;
    let nav2 = capsule(&s, "nav", "2.0.0").await;
    let arm = capsule(&s, "arm", "1.0.0").await;
    let mut bad = archive(".tar.gz", b"x");
    bad.truncate(10);
    let r = publish(&s, "broken", "1.0.0", ".tar.gz", &bad, json!([])).await;
    assert_eq!(r.body["validation_status"], "failed");
    let broken = r.body["id"].as_u64().unwrap();
    let (good_conf, r) = configure(&s, conf("nav-prod", nav, ".json", None), b"{\"a\": 1}").await;
    assert_eq!(r.body["validation_status"], "passed");
    let (bad_conf, r) = configure(&s, conf("nav-bad", nav, ".json", None), b"{").await;
    assert_eq!(r.body["validation_status"], "failed");

    let (d1, tok1) = device(&s, "r1", json!({"site": "a"})).await;
    let (d2, _) = device(&s, "r2", json!({"site": "b"})).await;
    let (d3, _) = device(&s, "r3", json!({"site": "a", "hw": "v2"})).await;
    let (_d4, _) = device(&s, "r4", json!({"site": "c"})).await;
    let g = s
        .post(
            &format!("{DEV}/device-groups"),
            s.key(),
            json!({"name": "g", "device_ids": [d2]}),
        )
        .await;
    let g = g.body["id"].as_u64().unwrap();

    let body = json!({"name": "nav rollout", "composition_tag": "nav-1.2.0", "capsule_id": nav,
        "configuration_id": good_conf, "description": "first",
        "target_devices": [d1, {"group_id": g}, {"labels": {"site": "a"}}]});
    Fleet {
        s,
        nav,
        nav2,
        arm,
        broken,
        good_conf,
        bad_conf,
        d1,
        tok1,
        d2,
        d3,
        g,
        body,
    }
}

each_backend!(plan_lists_the_targets_and_every_blocker);
/// Plan: the devices a body targets, or every reason it is blocked; nothing is created.
async fn plan_lists_the_targets_and_every_blocker() {
    let Fleet {
        s,
        broken,
        bad_conf,
        d1,
        d2,
        d3,
        body,
        ..
    } = fleet().await;
    // Plan: the devices and no blockers; nothing is created.
    let p = s.post(&format!("{DEPS}/plan"), s.key(), body.clone()).await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["blocked"], false);
    assert_eq!(p.body["blockers"], json!([]));
    assert_eq!(p.body["device_count"], 3);
    let mut ids: Vec<u64> = p.body["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_u64().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, vec![d1, d2, d3]);
    assert_eq!(s.get(DEPS, s.key()).await.body["total"], 0);

    // Plan lists every reason at once.
    let blocked = json!({"name": "x", "composition_tag": "bad tag!", "capsule_id": broken,
        "configuration_id": bad_conf, "target_devices": [999_999, {"group_id": 999_999},
        {"labels": {}}, "r1"]});
    let p = s.post(&format!("{DEPS}/plan"), s.key(), blocked).await;
    assert_eq!(p.status, 200);
    assert_eq!(p.body["blocked"], true);
    let fields: Vec<(String, u64)> = p.body["blockers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["field"].as_str().unwrap().to_string(),
                b["status"].as_u64().unwrap(),
            )
        })
        .collect();
    for want in [
        ("composition_tag", 422),
        ("capsule_id", 409),
        ("configuration_id", 409),
        ("target_devices[0]", 422),
        ("target_devices[1]", 422),
        ("target_devices[2]", 422),
        ("target_devices[3]", 422),
    ] {
        assert!(
            fields.contains(&(want.0.to_string(), want.1)),
            "{want:?} not in {fields:?}"
        );
    }
}

each_backend!(create_refuses_what_plan_reports);
/// Create refuses what plan reports (409 naming which, 422 for bad input); image references
/// and bare tags are composition tags.
async fn create_refuses_what_plan_reports() {
    let Fleet {
        s,
        nav2,
        arm,
        broken,
        bad_conf,
        body,
        ..
    } = fleet().await;
    // Create refuses what plan reports: 409 naming which, 422 for bad input.
    let with = |k: &str, v: Value| {
        let mut b = body.clone();
        b[k] = v;
        b
    };
    let r = s
        .post(DEPS, s.key(), with("capsule_id", json!(broken)))
        .await;
    assert!(r.assert_error(409).contains("Capsule"), "{}", r.body);
    let r = s
        .post(DEPS, s.key(), with("configuration_id", json!(bad_conf)))
        .await;
    assert!(r.assert_error(409).contains("Configuration"), "{}", r.body);
    let r = s.post(DEPS, s.key(), with("capsule_id", json!(nav2))).await;
    assert!(r.assert_error(409).contains("not compatible"), "{}", r.body);
    let r = s.post(DEPS, s.key(), with("capsule_id", json!(arm))).await;
    assert!(
        r.assert_error(409).contains("is for capsule nav"),
        "{}",
        r.body
    );
    let r = s
        .post(DEPS, s.key(), with("capsule_id", json!(999_999)))
        .await;
    assert!(r.assert_error(422).contains("capsule_id"));
    let r = s
        .post(
            DEPS,
            s.key(),
            with("target_devices", json!([{"site": "a"}])),
        )
        .await;
    assert!(r.assert_error(422).contains("target_devices[0]"));
    s.post(DEPS, s.key(), with("name", json!("")))
        .await
        .assert_error(422);
    // `composition_tag`: image references and bare tags pass plan; anything else is 422.
    let digest = "0123456789abcdef".repeat(4);
    for tag in [
        "registry.example/robot:1.2.0".to_string(),
        format!("ghcr.io/acme/arm-controller@sha256:{digest}"),
        "localhost:5000/nav:2024.06".into(),
        "1.2.0".into(),
    ] {
        let p = s
            .post(
                &format!("{DEPS}/plan"),
                s.key(),
                with("composition_tag", json!(tag)),
            )
            .await;
        assert_eq!(p.body["blockers"], json!([]), "{tag}: {}", p.body);
    }
    for tag in ["Robot:1", "ghcr.io/acme/arm@sha256:abc", "nav:1.0 ", ""] {
        let r = s
            .post(DEPS, s.key(), with("composition_tag", json!(tag)))
            .await;
        assert!(
            r.assert_error(422).contains("composition_tag"),
            "{tag}: {}",
            r.body
        );
    }
    let mut missing = body.clone();
    missing.as_object_mut().unwrap().remove("capsule_id");
    s.post(DEPS, s.key(), missing).await.assert_error(422);
    assert_eq!(s.get(DEPS, s.key()).await.body["total"], 0);
}

each_backend!(drafts_are_created_patched_and_deleted);
/// A package is created as a draft, with or without a configuration; drafts are patched
/// (checked again) and deleted.
async fn drafts_are_created_patched_and_deleted() {
    let Fleet {
        s,
        nav,
        broken,
        good_conf,
        d1,
        d2,
        g,
        body,
        ..
    } = fleet().await;
    // Created as a draft.
    let r = s.post(DEPS, s.key(), body.clone()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["deployment_status"], "draft");
    assert_eq!(r.body["deployed_at"], Value::Null);
    assert_eq!(r.body["deprecated_at"], Value::Null);
    assert_eq!(r.body["capsule_id"], nav);
    assert_eq!(r.body["configuration_id"], good_conf);
    assert_eq!(r.body["composition_tag"], "nav-1.2.0");
    assert_eq!(
        r.body["target_devices"],
        json!([d1, {"group_id": g}, {"labels": {"site": "a"}}])
    );
    // Without a configuration too.
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("configuration_id");
    plain["name"] = json!("plain");
    let r = s.post(DEPS, s.key(), plain).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let plain = r.body["id"].as_u64().unwrap();
    assert_eq!(r.body["configuration_id"], Value::Null);

    // Drafts can be patched (checked again) and deleted.
    let r = s
        .patch(
            &format!("{DEPS}/{plain}"),
            s.key(),
            json!({"name": "plain-2", "description": null, "target_devices": [d2]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["name"], "plain-2");
    assert_eq!(r.body["description"], Value::Null);
    assert_eq!(r.body["target_devices"], json!([d2]));
    s.patch(
        &format!("{DEPS}/{plain}"),
        s.key(),
        json!({"capsule_id": broken}),
    )
    .await
    .assert_error(409);
    assert_eq!(
        s.delete(&format!("{DEPS}/{plain}"), s.key()).await.status,
        204
    );
    s.get(&format!("{DEPS}/{plain}"), s.key())
        .await
        .assert_error(404);
}

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
