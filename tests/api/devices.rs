//! Devices and groups CRUD, pagination and filters, heartbeats (online → offline), device
//! tokens, and the organization-wide list.

use reqwest::Method;
use serde_json::json;

use crate::common::*;

each_backend!(device_crud_pagination_and_filters);
async fn device_crud_pagination_and_filters() {
    let s = start().await;
    let k = s.key();
    let r = s
        .post(
            &format!("{DEV}/devices"),
            k,
            json!({"name": "arm-1", "labels": {"site": "lyon"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let d1 = r.body.clone();
    assert_eq!(d1["name"], "arm-1");
    assert_eq!(d1["status"], "offline");
    assert_eq!(d1["labels"], json!({"site": "lyon"}));
    assert_eq!(d1["group_ids"], json!([]));
    assert_eq!(d1["last_seen_at"], json!(null));
    assert!(d1["device_token"].as_str().unwrap().starts_with("fopsd_"));
    let created = d1["created_at"].as_str().unwrap();
    assert_eq!(created.len(), "2026-01-02T03:04:05.678Z".len(), "{created}");
    assert!(created.ends_with('Z'));
    let id1 = d1["id"].as_u64().unwrap();

    for i in 2..=5 {
        let r = s
            .post(
                &format!("{DEV}/devices"),
                k,
                json!({"name": format!("arm-{i}")}),
            )
            .await;
        assert_eq!(r.status, 201);
    }
    // Newest first, paginated.
    let r = s.get(&format!("{DEV}/devices?page=1&page_size=2"), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 5);
    assert_eq!(r.body["page"], 1);
    assert_eq!(r.body["page_size"], 2);
    assert_eq!(r.body["has_more"], true);
    let names: Vec<_> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["arm-5", "arm-4"]);
    assert!(
        r.body["items"][0].get("device_token").is_none(),
        "token only at creation"
    );
    let r = s.get(&format!("{DEV}/devices?page=3&page_size=2"), k).await;
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["has_more"], false);
    let r = s.get(&format!("{DEV}/devices?page=9"), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["items"], json!([]));
    s.get(&format!("{DEV}/devices?page=0"), k)
        .await
        .assert_error(422);
    s.get(&format!("{DEV}/devices?page_size=501"), k)
        .await
        .assert_error(422);
    s.get(&format!("{DEV}/devices?status=sleeping"), k)
        .await
        .assert_error(422);
    let r = s.get(&format!("{DEV}/devices?name=arm-3"), k).await;
    assert_eq!(r.body["total"], 1);
    assert_eq!(r.body["items"][0]["name"], "arm-3");
    assert_eq!(
        s.get(&format!("{DEV}/devices?status=offline"), k)
            .await
            .body["total"],
        5
    );
    assert_eq!(
        s.get(&format!("{DEV}/devices?status=online"), k).await.body["total"],
        0
    );

    // Get, patch, delete.
    let r = s.get(&format!("{DEV}/devices/{id1}"), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["name"], "arm-1");
    let r = s
        .patch(
            &format!("{DEV}/devices/{id1}"),
            k,
            json!({"name": "arm-one", "labels": {"site": "nice"}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["name"], "arm-one");
    assert_eq!(r.body["labels"], json!({"site": "nice"}));
    assert_eq!(
        s.get(&format!("{DEV}/devices/{id1}"), k).await.body["name"],
        "arm-one"
    );
    s.patch(&format!("{DEV}/devices/{id1}"), k, json!({"name": ""}))
        .await
        .assert_error(422);
    assert_eq!(
        s.delete(&format!("{DEV}/devices/{id1}"), k).await.status,
        204
    );
    assert_eq!(
        s.get(&format!("{DEV}/devices/{id1}"), k)
            .await
            .assert_error(404),
        "Device not found"
    );
    s.delete(&format!("{DEV}/devices/{id1}"), k)
        .await
        .assert_error(404);
    s.patch(&format!("{DEV}/devices/{id1}"), k, json!({"name": "x"}))
        .await
        .assert_error(404);
    s.get(&format!("{DEV}/devices/abc"), k)
        .await
        .assert_error(404);
}

each_backend!(another_projects_device_is_404);
async fn another_projects_device_is_404() {
    let s = start().await;
    let k = s.key();
    let r = s
        .post(
            "/api/v1/organizations/default/projects",
            k,
            json!({"slug": "other"}),
        )
        .await;
    assert_eq!(r.status, 201);
    let id = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "a"}))
        .await
        .body["id"]
        .as_u64()
        .unwrap();
    s.get(
        &format!("/api/v1/organizations/default/projects/other/devices/{id}"),
        k,
    )
    .await
    .assert_error(404);
    s.delete(
        &format!("/api/v1/organizations/default/projects/other/devices/{id}"),
        k,
    )
    .await
    .assert_error(404);
    assert_eq!(s.get(&format!("{DEV}/devices/{id}"), k).await.status, 200);
}

each_backend!(groups_crud_and_membership);
async fn groups_crud_and_membership() {
    let s = start().await;
    let k = s.key();
    let a = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "a"}))
        .await
        .body["id"]
        .as_u64()
        .unwrap();
    let b = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "b"}))
        .await
        .body["id"]
        .as_u64()
        .unwrap();
    let r = s
        .post(
            &format!("{DEV}/device-groups"),
            k,
            json!({"name": "line-1", "device_ids": [b, a, a]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let mut ids = vec![a, b];
    ids.sort();
    assert_eq!(r.body["device_ids"], json!(ids));
    assert_eq!(r.body["name"], "line-1");
    let g = r.body["id"].as_u64().unwrap();
    assert_eq!(
        s.get(&format!("{DEV}/devices/{a}"), k).await.body["group_ids"],
        json!([g])
    );
    s.post(
        &format!("{DEV}/device-groups"),
        k,
        json!({"name": "bad", "device_ids": [999_999]}),
    )
    .await
    .assert_error(422);
    s.post(
        &format!("{DEV}/device-groups"),
        k,
        json!({"device_ids": []}),
    )
    .await
    .assert_error(422);

    let r = s.get(&format!("{DEV}/device-groups"), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    let r = s
        .patch(
            &format!("{DEV}/device-groups/{g}"),
            k,
            json!({"device_ids": [b]}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["device_ids"], json!([b]));
    assert_eq!(
        s.get(&format!("{DEV}/devices/{a}"), k).await.body["group_ids"],
        json!([])
    );
    // Deleting a device takes it out of its groups.
    assert_eq!(s.delete(&format!("{DEV}/devices/{b}"), k).await.status, 204);
    assert_eq!(
        s.get(&format!("{DEV}/device-groups/{g}"), k).await.body["device_ids"],
        json!([])
    );
    assert_eq!(
        s.delete(&format!("{DEV}/device-groups/{g}"), k)
            .await
            .status,
        204
    );
    assert_eq!(
        s.get(&format!("{DEV}/device-groups/{g}"), k)
            .await
            .assert_error(404),
        "Device group not found"
    );
}

each_backend!(heartbeat_online_then_offline_and_device_tokens);
async fn heartbeat_online_then_offline_and_device_tokens() {
    let s = start_with(|c| c.devices.offline_after_seconds = 60).await;
    let k = s.key();
    let r = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "rover"}))
        .await;
    let id = r.body["id"].as_u64().unwrap();
    let token = r.body["device_token"].as_str().unwrap().to_string();
    let other = s
        .post(&format!("{DEV}/devices"), k, json!({"name": "other"}))
        .await
        .body["id"]
        .as_u64()
        .unwrap();

    let r = s
        .post(
            &format!("{DEV}/devices/{id}/heartbeat"),
            &token,
            json!({"metrics": {"cpu": 0.5, "battery": 88}}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"status": "online"}));
    assert!(r.header("x-ratelimit-limit").is_some());
    let d = s.get(&format!("{DEV}/devices/{id}"), k).await.body;
    assert_eq!(d["status"], "online");
    assert_eq!(d["metrics"], json!({"battery": 88.0, "cpu": 0.5}));
    assert!(d["last_seen_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        s.get(&format!("{DEV}/devices?status=online"), k).await.body["total"],
        1
    );

    // A minute later on the runtime's clock, it is offline.
    let clock = s.running.as_ref().unwrap().runtime.clock.clone();
    clock.advance(std::time::Duration::from_secs(61));
    let d = s.get(&format!("{DEV}/devices/{id}"), k).await.body;
    assert_eq!(d["status"], "offline");

    // A heartbeat with no body is fine; a member's key works too.
    let r = s
        .send(
            Method::POST,
            &format!("{DEV}/devices/{id}/heartbeat"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        s.post(&format!("{DEV}/devices/{id}/heartbeat"), k, json!({}))
            .await
            .status,
        202
    );
    // A device token reaches only its own ingestion routes.
    s.post(
        &format!("{DEV}/devices/{other}/heartbeat"),
        &token,
        json!({}),
    )
    .await
    .assert_error(403);
    s.get(&format!("{DEV}/devices/{id}"), &token)
        .await
        .assert_error(403);
    s.get("/api/v1/users/me", &token).await.assert_error(403);
    s.post(
        &format!("{DEV}/devices/{id}/heartbeat"),
        &token,
        json!({"metrics": {"cpu": "hot"}}),
    )
    .await
    .assert_error(422);
    s.post(&format!("{DEV}/devices/999999/heartbeat"), k, json!({}))
        .await
        .assert_error(404);
    // Deleting the device revokes its token.
    assert_eq!(
        s.delete(&format!("{DEV}/devices/{id}"), k).await.status,
        204
    );
    s.post(&format!("{DEV}/devices/{id}/heartbeat"), &token, json!({}))
        .await
        .assert_error(401);
}

each_backend!(organization_wide_device_list);
async fn organization_wide_device_list() {
    let s = start().await;
    let k = s.key();
    s.post(
        "/api/v1/organizations/default/projects",
        k,
        json!({"slug": "second"}),
    )
    .await;
    s.post(&format!("{DEV}/devices"), k, json!({"name": "one"}))
        .await;
    s.post(
        "/api/v1/organizations/default/projects/second/devices",
        k,
        json!({"name": "two"}),
    )
    .await;
    let r = s.get("/api/v1/organizations/default/devices", k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 2);
    assert_eq!(r.body["items"][0]["name"], "two");
    assert_eq!(r.body["items"][0]["project"], "second");
    assert_eq!(r.body["items"][1]["project"], "default");
    assert_eq!(
        s.get("/api/v1/organizations/default/devices?page_size=1", k)
            .await
            .body["has_more"],
        true
    );
}

each_backend!(status_and_name_filters_page_with_exact_totals);
/// Filtered pages come from the list indexes: status (from last-seen time) alone, with a
/// name, across projects and past page 1, each with the exact total; the indexes agree with
/// the records afterwards.
async fn status_and_name_filters_page_with_exact_totals() {
    let s = start().await;
    let k = s.key();
    s.post(
        "/api/v1/organizations/default/projects",
        k,
        json!({"slug": "second"}),
    )
    .await;
    let mut made = Vec::new();
    for i in 0..24u64 {
        let project = if i % 3 == 0 { "second" } else { "default" };
        let r = s
            .post(
                &format!("/api/v1/organizations/default/projects/{project}/devices"),
                k,
                json!({"name": format!("bot-{}", i % 2)}),
            )
            .await;
        assert_eq!(r.status, 201);
        made.push((
            project,
            r.body["id"].as_u64().unwrap(),
            r.body["device_token"].as_str().unwrap().to_string(),
            i,
        ));
    }
    let clock = s.running.as_ref().unwrap().runtime.clock.clone();
    // Every fifth device beat 61 s ago (offline by now); every fourth beats now.
    let beat = |every: u64| {
        let made = &made;
        let s = &s;
        async move {
            for (project, id, token, i) in made.iter().filter(|m| m.3 % every == 0) {
                let r = s
                    .post(
                        &format!(
                            "/api/v1/organizations/default/projects/{project}/devices/{id}/heartbeat"
                        ),
                        token,
                        json!({}),
                    )
                    .await;
                assert_eq!(r.status, 202, "device {i}");
            }
        }
    };
    beat(5).await;
    clock.advance(std::time::Duration::from_secs(61));
    beat(4).await;
    let online = |i: u64| i.is_multiple_of(4);
    let ids = |body: &serde_json::Value| -> Vec<u64> {
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_u64().unwrap())
            .collect()
    };
    let want = |project: Option<&str>, on: bool, bot: Option<u64>| -> Vec<u64> {
        made.iter()
            .rev()
            .filter(|(p, _, _, _)| project.is_none_or(|x| x == *p))
            .filter(|(_, _, _, i)| online(*i) == on)
            .filter(|(_, _, _, i)| bot.is_none_or(|b| i % 2 == b))
            .map(|(_, id, _, _)| *id)
            .collect()
    };
    for on in [true, false] {
        let st = if on { "online" } else { "offline" };
        let w = want(Some("default"), on, None);
        let r = s
            .get(&format!("{DEV}/devices?status={st}&page_size=3&page=2"), k)
            .await;
        assert_eq!(r.body["total"], w.len(), "{st}: {}", r.body);
        assert_eq!(
            ids(&r.body),
            w.iter().skip(3).take(3).copied().collect::<Vec<_>>(),
            "{st}"
        );
        let w = want(Some("default"), on, Some(1));
        let r = s
            .get(&format!("{DEV}/devices?status={st}&name=bot-1"), k)
            .await;
        assert_eq!(r.body["total"], w.len(), "{st} bot-1");
        assert_eq!(ids(&r.body), w, "{st} bot-1");
        let w = want(None, on, None);
        let r = s
            .get(
                &format!("/api/v1/organizations/default/devices?status={st}&page_size=4&page=2"),
                k,
            )
            .await;
        assert_eq!(r.body["total"], w.len(), "org {st}");
        assert_eq!(
            ids(&r.body),
            w.iter().skip(4).take(4).copied().collect::<Vec<_>>(),
            "org {st}"
        );
        for d in r.body["items"].as_array().unwrap() {
            assert_eq!(d["status"], st);
        }
    }
    // A rename moves the device between name lists; a delete leaves every list.
    let (_, first, _, _) = &made[1];
    s.patch(
        &format!("{DEV}/devices/{first}"),
        k,
        json!({"name": "bot-0"}),
    )
    .await;
    assert_eq!(
        s.get(&format!("{DEV}/devices?name=bot-1"), k).await.body["total"],
        want(Some("default"), true, Some(1)).len() + want(Some("default"), false, Some(1)).len()
            - 1
    );
    assert_eq!(
        s.delete(&format!("{DEV}/devices/{first}"), k).await.status,
        204
    );
    assert_eq!(
        s.get(&format!("{DEV}/devices"), k).await.body["total"],
        made.iter().filter(|m| m.0 == "default").count() - 1
    );
    let store = &s.running.as_ref().unwrap().runtime.store();
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
}
