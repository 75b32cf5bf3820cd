//! Provenance from commit to robot, and the policy that asks for a passed test run.

use serde_json::{Value, json};

use super::*;
use crate::configurations::capsule;
use crate::deployments::{DEPS, device};
use crate::evaluation::{fast, heartbeat, rule, webhook};
use crate::peers::Sink;

/// Publishes a capsule that declares the commit it was built from.
async fn publish_from(s: &Srv, name: &str, version: &str, source: Value) -> Resp {
    use crate::capsules::{archive, secret_post, sha};
    let bytes = archive(".tar", format!("{name} {version}").as_bytes());
    let caps = "/api/v1/projects/default/default/capsules";
    let r = secret_post(
        s,
        &format!("{caps}/upload-url"),
        &s.admin.project_secret,
        json!({"name": name, "version": version, "capsule_type": "SW", "file_format": ".tar",
               "file_size_bytes": bytes.len(), "source": source}),
    )
    .await;
    if r.status != 201 {
        return r;
    }
    let id = r.body["capsule_id"].as_u64().unwrap();
    let put = s
        .http
        .put(r.body["upload_url"].as_str().unwrap())
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        s,
        &format!("{caps}/{id}/confirm"),
        &s.admin.project_secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

each_backend!(provenance_from_commit_to_robot_and_the_passed_test_run_policy);
/// device → package → capsule → commit → test runs, on the package, the device update API
/// and an alert naming the device; and the policy that wants a passed run of the commit.
async fn provenance_from_commit_to_robot_and_the_passed_test_run_policy() {
    use crate::webhooks::{REPO, SECRET, link, pr, run};
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
        c.scm.webhook_secret = SECRET.into();
    })
    .await;
    link(&s, REPO).await;
    let sha = "c0ffee".repeat(6) + "abcd";
    let source = json!({"repository": REPO, "commit_sha": sha.to_uppercase()});
    for bad in [
        json!({"repository": REPO, "commit_sha": "xyz"}),
        json!({"repository": REPO, "commit_sha": &sha[..12]}),
        json!({"repository": "no-slash", "commit_sha": sha}),
        json!({"repository": REPO}),
    ] {
        let r = publish_from(&s, "nav", "0.9.0", bad.clone()).await;
        assert_eq!(r.status, 422, "{bad}: {}", r.body);
    }
    let cap = publish_from(&s, "nav", "1.0.0", source).await.body["id"]
        .as_u64()
        .unwrap();
    let bare = capsule(&s, "arm", "1.0.0").await;
    let c = s
        .get(
            &format!("/api/v1/projects/default/default/capsules/{cap}"),
            s.key(),
        )
        .await;
    assert_eq!(
        c.body["source"],
        json!({"repository": REPO, "commit_sha": sha})
    );
    assert_eq!(c.body["test_runs"], json!([]));

    // The policy: off by default; an admin turns it on.
    let policy = "/api/v1/projects/default/default/policy";
    let r = s.get(policy, s.key()).await;
    assert_eq!(r.body, json!({"require_passed_test_run": false}));
    s.patch(policy, s.key(), json!({"require_passed_test_run": "yes"}))
        .await
        .assert_error(422);
    let r = s
        .patch(policy, s.key(), json!({"require_passed_test_run": true}))
        .await;
    assert_eq!(r.body, json!({"require_passed_test_run": true}));

    let (dev, tok) = device(&s, "r1", json!({})).await;
    let body = json!({"name": "nav 1", "composition_tag": "nav-1", "capsule_id": cap, "target_devices": [dev]});
    let dep = create(&s, body.clone()).await;
    // No run of the commit yet: the plan names it, activation is 409 naming it.
    let p = s.post(&format!("{DEPS}/plan"), s.key(), body).await;
    assert_eq!(p.body["blocked"], true);
    assert_eq!(p.body["blockers"][0]["status"], 409);
    assert!(
        p.body["blockers"][0]["reason"]
            .as_str()
            .unwrap()
            .contains(&sha)
    );
    let act = format!("{DEPS}/{dep}/activate");
    let d = s
        .post(&act, s.key(), json!({}))
        .await
        .assert_error(409)
        .to_string();
    assert!(d.contains(&sha) && d.contains(REPO), "{d}");
    // A capsule that declares no commit cannot pass the policy either.
    let bare_dep = create(
        &s,
        json!({"name": "arm", "composition_tag": "arm-1", "capsule_id": bare, "target_devices": [dev]}),
    )
    .await;
    let d = s
        .post(&format!("{DEPS}/{bare_dep}/activate"), s.key(), json!({}))
        .await
        .assert_error(409)
        .to_string();
    assert!(d.contains("declares no source commit"), "{d}");

    // A pull request of the commit: its run is queued, still not passed.
    let d = run(&s, "pull_request", &pr("opened", 5, &sha, false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let run_id = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEPS}/{dep}"), s.key()).await;
    let prov = &r.body["provenance"];
    assert_eq!(prov["capsule"]["id"], cap);
    assert_eq!(prov["source"]["commit_sha"], sha);
    assert_eq!(prov["test_runs"][0]["id"], run_id);
    assert_eq!(prov["test_runs"][0]["status"], "queued");
    assert_eq!(prov["passed_test_run"], false);
    s.post(&act, s.key(), json!({})).await.assert_error(409);

    // The runner passes it: activation goes through.
    let claim = s
        .post(&format!("{DEV}/test-runs/claim"), s.key(), json!({}))
        .await;
    assert_eq!(claim.body["id"], run_id);
    let r = s
        .post(
            &format!("{DEV}/test-runs/{run_id}/complete"),
            s.key(),
            json!({"status": "passed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.post(&act, s.key(), json!({})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // The robot sees the chain.
    let r = crate::updates::poll(&s, &tok, None).await;
    assert_eq!(r.status, 200);
    let prov = &r.body["provenance"];
    assert_eq!(prov["deployment"]["id"], dep);
    assert_eq!(
        prov["source"],
        json!({"repository": REPO, "commit_sha": sha})
    );
    assert_eq!(prov["test_runs"][0]["status"], "passed");
    assert_eq!(prov["passed_test_run"], true);

    // So does an alert naming the device.
    let hook = webhook(&s, &sink).await;
    rule(
        &s,
        hook,
        json!({"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 90, "duration_seconds": 0}),
    )
    .await;
    heartbeat(&s, dev, &tok, json!({"cpu": 99})).await;
    let a = crate::evaluation::wait_alerts(&s, "state=firing", 1).await;
    let prov = &a["items"][0]["provenance"];
    assert_eq!(prov["deployment"]["id"], dep, "{a}");
    assert_eq!(prov["capsule"]["version"], "1.0.0");
    assert_eq!(prov["source"]["commit_sha"], sha);
    assert_eq!(prov["test_runs"][0]["id"], run_id);
}
