//! What blocks a package: the plan lists its targets and every blocker, create refuses what the
//! plan reports, and drafts are created, patched and deleted.

use serde_json::{Value, json};

use super::*;

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
