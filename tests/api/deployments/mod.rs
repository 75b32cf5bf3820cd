//! Deployment packages through the real server: what blocks one (409 naming which, 422 for
//! bad input), targets by id, group and labels, plan, every allowed and forbidden transition,
//! drafts edited and deleted, rollout results (and the event the alert evaluator hears),
//! references that keep capsules and configurations, and sessions linked to a package.

use serde_json::{Value, json};

use crate::capsules::{archive, publish};
use crate::common::*;
use crate::configurations::{capsule, conf, configure};

mod plans;
mod transitions;

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
