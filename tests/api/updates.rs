//! The device update API through the real server: what a robot should run (204 before any
//! package, 200 with links, config and an ETag, 304 for that ETag), the newest active package
//! winning and deprecation falling back to the previous one, the device's own token only,
//! intermediate and final reports (counted on the package, kept in the device's history), and
//! a label change reaching the next poll.

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::*;
use crate::deployments::{DEPS, Fleet, device, fleet};

pub(crate) const UPDATE: &str = "/api/v1/device/deployment";

/// A device's poll: status, ETag, body.
pub(crate) async fn poll(s: &Srv, token: &str, etag: Option<&str>) -> Resp {
    let mut rb = s.http.get(s.url(UPDATE)).bearer_auth(token);
    if let Some(e) = etag {
        rb = rb.header("If-None-Match", e);
    }
    s.raw(rb).await
}

pub(crate) async fn report(s: &Srv, token: &str, dep: u64, status: &str) -> Resp {
    s.raw(
        s.http
            .post(s.url(&format!("{UPDATE}/{dep}/status")))
            .bearer_auth(token)
            .json(&json!({"status": status, "message": format!("now {status}")})),
    )
    .await
}

async fn activate(s: &Srv, body: Value) -> u64 {
    let r = s.post(DEPS, s.key(), body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    dep
}

each_backend!(a_device_polls_for_its_package_and_reports_on_it);
async fn a_device_polls_for_its_package_and_reports_on_it() {
    let Fleet {
        s,
        nav,
        nav2,
        good_conf,
        d1,
        tok1,
        body,
        ..
    } = fleet().await;
    let (d4, tok4) = device(&s, "r5", json!({"site": "z"})).await;

    // Nothing active: 204. A user's key on the device API: 403.
    let r = poll(&s, &tok1, None).await;
    assert_eq!(r.status, 204);
    poll(&s, s.key(), None).await.assert_error(403);
    s.raw(s.http.get(s.url(UPDATE))).await.assert_error(401);

    // The package: capsule with its hash, size and a working link; the configuration inline.
    let dep = activate(&s, body.clone()).await;
    let r = poll(&s, &tok1, None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let etag = r.header("etag").unwrap().to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    assert_eq!(r.body["deployment_id"], dep);
    assert_eq!(r.body["name"], "nav rollout");
    assert_eq!(r.body["composition_tag"], "nav-1.2.0");
    assert_eq!(r.body["capsule"]["id"], nav);
    assert_eq!(r.body["capsule"]["version"], "1.2.0");
    let sha = r.body["capsule"]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64);
    assert_eq!(r.body["configuration"]["id"], good_conf);
    assert_eq!(r.body["configuration"]["config_data"], json!({"a": 1}));
    let link = r.body["capsule"]["download_url"].as_str().unwrap();
    let bytes = s.http.get(link).send().await.unwrap();
    assert_eq!(bytes.status(), 200);
    let bytes = bytes.bytes().await.unwrap();
    assert_eq!(
        bytes.len() as u64,
        r.body["capsule"]["size_bytes"].as_u64().unwrap()
    );
    use sha2::Digest;
    assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), sha);

    // Unchanged: 304 with the ETag and no body; another tag (or a weak form of this one).
    let r = poll(&s, &tok1, Some(&etag)).await;
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(r.body, Value::Null);
    let r = poll(&s, &tok1, Some(&format!("W/{etag}"))).await;
    assert_eq!(r.status, 304);
    assert_eq!(poll(&s, &tok1, Some("\"other\"")).await.status, 200);

    // A device the package does not target: 204; once its labels match, the next poll sees it.
    assert_eq!(poll(&s, &tok4, None).await.status, 204);
    let r = s
        .patch(
            &format!("{DEV}/devices/{d4}"),
            s.key(),
            json!({"labels": {"site": "a"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = poll(&s, &tok4, None).await;
    assert_eq!(
        (r.status.as_u16(), &r.body["deployment_id"]),
        (200, &json!(dep))
    );

    // A newer active package for d1 wins (new ETag); deprecating it falls back to the first.
    let newer = activate(
        &s,
        json!({"name": "nav 2", "composition_tag": "nav-2.0.0", "capsule_id": nav2,
            "target_devices": [d1]}),
    )
    .await;
    let r = poll(&s, &tok1, Some(&etag)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["deployment_id"], newer);
    assert_eq!(r.body["configuration"], Value::Null);
    assert_ne!(r.header("etag"), Some(etag.as_str()));
    let r = s
        .post(&format!("{DEPS}/{newer}/deprecate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(poll(&s, &tok1, Some(&etag)).await.status, 304);

    // Reports: the intermediate states, then the result, each 202 once durable.
    for st in ["downloading", "installing", "rebooting", "succeeded"] {
        let r = report(&s, &tok1, dep, st).await;
        assert_eq!(r.status, 202, "{}", r.body);
        assert_eq!(r.body["status"], st);
        assert_eq!(
            (&r.body["deployment_id"], &r.body["device_id"]),
            (&json!(dep), &json!(d1))
        );
    }
    assert_eq!(report(&s, &tok4, dep, "installing").await.status, 202);
    report(&s, &tok1, dep, "exploded").await.assert_error(422);
    report(&s, &tok1, 999_999, "installing")
        .await
        .assert_error(404);
    s.send(
        Method::POST,
        &format!("{UPDATE}/{dep}/status"),
        Some(s.key()),
        Some(json!({"status": "installing"})),
    )
    .await
    .assert_error(403);
    let r = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    assert_eq!(
        r.body["device_results"],
        json!({"succeeded": 1, "failed": 0})
    );
    assert_eq!(
        r.body["device_states"],
        json!({"downloading": 0, "installing": 1, "rebooting": 0, "succeeded": 1, "failed": 0,
            "rolled_back": 0, "rollback_failed": 0, "retrying": 0})
    );
    // The members' route still takes only the final states.
    s.post(
        &format!("{DEPS}/{dep}/device-status"),
        s.key(),
        json!({"device_id": d1, "status": "installing"}),
    )
    .await
    .assert_error(422);

    // A draft: 409.
    let r = s.post(DEPS, s.key(), body.clone()).await;
    let draft = r.body["id"].as_u64().unwrap();
    report(&s, &tok1, draft, "installing")
        .await
        .assert_error(409);

    // The history: each package the device reported on, its reports oldest first.
    let h = s.get(&format!("{DEV}/devices/{d1}/history"), s.key()).await;
    assert_eq!(h.status, 200, "{}", h.body);
    let items = h.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", h.body);
    assert_eq!(items[0]["deployment_id"], dep);
    assert_eq!(items[0]["deployment_name"], "nav rollout");
    assert_eq!(items[0]["capsule"]["id"], nav);
    assert_eq!(items[0]["state"], "succeeded");
    let states: Vec<&str> = items[0]["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["downloading", "installing", "rebooting", "succeeded"]
    );
    assert_eq!(items[0]["reports"][0]["message"], "now downloading");
    s.get(&format!("{DEV}/devices/999999/history"), s.key())
        .await
        .assert_error(404);
}

each_backend!(the_configuration_link_serves_the_effective_data_its_checksum_names);
/// The configuration a device is told to install is the effective one: its link serves the
/// merged data (the parent's values under the child's overrides) as JSON, not the uploaded
/// file, and the package's `sha256` and `size_bytes` are those of the bytes served.
async fn the_configuration_link_serves_the_effective_data_its_checksum_names() {
    use crate::configurations::{conf, configure};
    let s = start().await;
    let cap = crate::configurations::capsule(&s, "nav", "1.0.0").await;
    let (parent, r) = configure(
        &s,
        conf("base", cap, ".yaml", None),
        b"speed: 1\nlimits:\n  max: 5\n  min: 0\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (child, r) = configure(
        &s,
        conf("site", cap, ".yaml", Some(parent)),
        b"limits:\n  max: 9\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let (d, tok) = device(&s, "r1", json!({})).await;
    let dep = activate(
        &s,
        json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
            "configuration_id": child, "target_devices": [d]}),
    )
    .await;
    let r = poll(&s, &tok, None).await;
    assert_eq!(r.body["deployment_id"], dep);
    let c = &r.body["configuration"];
    let want = json!({"speed": 1, "limits": {"max": 9, "min": 0}});
    assert_eq!(c["config_data"], want);
    let got = s
        .http
        .get(c["download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(
        got.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let bytes = got.bytes().await.unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), want);
    assert_eq!(bytes.len() as u64, c["size_bytes"].as_u64().unwrap());
    use sha2::Digest;
    assert_eq!(
        hex::encode(sha2::Sha256::digest(&bytes)),
        c["sha256"].as_str().unwrap()
    );
}
