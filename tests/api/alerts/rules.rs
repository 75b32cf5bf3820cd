//! Alert rules: conditions and references validated, and writes for admins only.

use serde_json::{Value, json};

use super::*;

each_backend!(alert_rules_validate_conditions_and_references);
async fn alert_rules_validate_conditions_and_references() {
    let s = start().await;
    let w = create(
        &s,
        json!({"type": "webhook", "name": "w", "config": {"url": "https://example.com/h", "signing_secret": "s"}}),
    )
    .await;
    let g = s
        .post(
            &format!("{DEV}/device-groups"),
            s.key(),
            json!({"name": "arms", "device_ids": []}),
        )
        .await;
    assert_eq!(g.status, 201, "{}", g.body);
    let (wid, gid) = (w["id"].as_u64().unwrap(), g.body["id"].as_u64().unwrap());
    let conditions = [
        json!({"type": "device_status", "status": "offline", "duration_seconds": 60}),
        json!({"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 0.9, "duration_seconds": 30}),
        json!({"type": "log_pattern", "pattern": "overheat(ed)?", "level": "error", "module": "arm", "count": 3, "window_seconds": 120}),
        json!({"type": "deployment_status", "status": "failed"}),
    ];
    let mut ids = Vec::new();
    for c in &conditions {
        let r = s
            .post(
                RULES,
                s.key(),
                json!({"name": "r", "condition": c, "severity": "critical",
                       "integration_ids": [wid], "device_group_ids": [gid], "enabled": true}),
            )
            .await;
        assert_eq!(r.status, 201, "{c}: {}", r.body);
        assert_eq!(r.body["condition"]["type"], c["type"]);
        assert_eq!(r.body["integration_ids"], json!([wid]));
        ids.push(r.body["id"].as_u64().unwrap());
    }
    // Defaults filled in.
    let r = s
        .post(
            RULES,
            s.key(),
            json!({"name": "d", "condition": {"type": "log_pattern", "pattern": "panic"}, "severity": "warning", "integration_ids": []}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["condition"]["count"], 1);
    assert_eq!(r.body["condition"]["window_seconds"], 60);
    assert_eq!(r.body["device_group_ids"], json!([]));
    assert_eq!(r.body["enabled"], true);

    let base = json!({"name": "x", "severity": "warning", "integration_ids": [],
                      "condition": {"type": "device_status", "status": "offline", "duration_seconds": 5}});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    for bad in [
        with("integration_ids", json!([999])),
        with("device_group_ids", json!([999])),
        with("severity", json!("urgent")),
        with(
            "condition",
            json!({"type": "log_pattern", "pattern": "(unclosed"}),
        ),
        with(
            "condition",
            json!({"type": "log_pattern", "pattern": "a{1000}{1000}{1000}"}),
        ),
        with(
            "condition",
            json!({"type": "log_pattern", "pattern": "x", "level": "loud"}),
        ),
        with(
            "condition",
            json!({"type": "metric_threshold", "metric": "cpu", "operator": "approx", "threshold": 1, "duration_seconds": 1}),
        ),
        with(
            "condition",
            json!({"type": "device_status", "status": "asleep", "duration_seconds": 1}),
        ),
        with("condition", json!({"type": "weather"})),
        with(
            "condition",
            json!({"type": "deployment_status", "status": "maybe"}),
        ),
    ] {
        s.post(RULES, s.key(), bad.clone()).await.assert_error(422);
    }

    // PATCH any subset; GET one; the list.
    let r = s
        .patch(
            &format!("{RULES}/{}", ids[1]),
            s.key(),
            json!({"enabled": false, "severity": "info"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["enabled"].clone(), r.body["severity"].clone()),
        (json!(false), json!("info"))
    );
    assert_eq!(r.body["condition"]["metric"], "cpu");
    s.patch(
        &format!("{RULES}/{}", ids[1]),
        s.key(),
        json!({"integration_ids": [12345]}),
    )
    .await
    .assert_error(422);
    s.patch(&format!("{RULES}/999"), s.key(), json!({"enabled": false}))
        .await
        .assert_error(404);
    assert_eq!(
        s.get(RULES, s.key()).await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        5
    );

    // A group a rule names cannot be deleted; an integration can, and leaves every rule.
    s.delete(&format!("{DEV}/device-groups/{gid}"), s.key())
        .await
        .assert_error(409);
    let r = s.delete(&format!("{INTEGRATIONS}/{wid}"), s.key()).await;
    assert_eq!(r.status, 204);
    for id in &ids {
        let r = s.get(&format!("{RULES}/{id}"), s.key()).await;
        assert_eq!(r.body["integration_ids"], json!([]), "{}", r.body);
    }
    for id in &ids {
        assert_eq!(
            s.delete(&format!("{RULES}/{id}"), s.key()).await.status,
            204
        );
    }
    assert_eq!(
        s.delete(&format!("{DEV}/device-groups/{gid}"), s.key())
            .await
            .status,
        204
    );
}

each_backend!(alerting_writes_need_an_admin);
async fn alerting_writes_need_an_admin() {
    let s = start().await;
    // Viewers and members read; only admins (and owners) write.
    for role in ["viewer", "member"] {
        let jwt = s.member_key(role).await;
        assert_eq!(s.get(INTEGRATIONS, &jwt).await.status, 200);
        assert_eq!(s.get(RULES, &jwt).await.status, 200);
        assert_eq!(
            s.get(
                "/api/v1/organizations/default/projects/default/alerts",
                &jwt
            )
            .await
            .status,
            200
        );
        s.post(
            INTEGRATIONS,
            &jwt,
            json!({"type": "chat", "name": "c", "config": {"webhook_url": "https://example.com/x"}}),
        )
        .await
        .assert_error(403);
        s.post(
            RULES,
            &jwt,
            json!({"name": "r", "severity": "info", "integration_ids": [],
                   "condition": {"type": "deployment_status", "status": "failed"}}),
        )
        .await
        .assert_error(403);
    }
    let admin = s.member_key("admin").await;
    let r = s
        .post(
            RULES,
            &admin,
            json!({"name": "r", "severity": "info", "integration_ids": [],
                   "condition": {"type": "deployment_status", "status": "failed"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    // A rule sent back as GET shows it, with one field changed, is a valid PATCH.
    let mut back = r.body.clone();
    back["name"] = json!("renamed");
    let p = s
        .patch(&format!("{RULES}/{}", r.body["id"]), &admin, back)
        .await;
    assert_eq!(
        (p.status.as_u16(), p.body["name"].clone()),
        (200, json!("renamed"))
    );
}
