//! The inbound webhook through the real server, with the host's real payloads (copied from
//! the host's documentation into tests/payloads) re-signed here: signature and intake rules,
//! every host event the service handles and every reason code, idempotency, attempts,
//! cancellation, branch and draft policy, runners, rotation, and 500 concurrent deliveries.

use serde_json::{Value, json};

use crate::common::*;

pub(crate) const SECRET: &str = "It's a Secret to Everybody";
const SCM: &str = "/api/v1/scm";
pub(crate) const REPO: &str = "Codertocat/Hello-World";
pub(crate) const INST: u64 = 957387;

pub(crate) fn payload(name: &str) -> Value {
    let path = format!("{}/tests/payloads/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

pub(crate) use fleetops_testkit::sign;

pub(crate) async fn webhook_server() -> Srv {
    start_with(|c| c.scm.webhook_secret = SECRET.into()).await
}

/// A delivery with the given headers (`None` leaves one out).
async fn raw(
    s: &Srv,
    event: Option<&str>,
    id: Option<&str>,
    sig: Option<&str>,
    body: Vec<u8>,
) -> Resp {
    let mut rb = s
        .http
        .post(s.url(&format!("{SCM}/webhooks")))
        .header("content-type", "application/json")
        .body(body);
    if let Some(e) = event {
        rb = rb.header("X-Host-Event", e);
    }
    if let Some(i) = id {
        rb = rb.header("X-Host-Delivery", i);
    }
    if let Some(g) = sig {
        rb = rb.header("X-Hub-Signature-256", g);
    }
    s.raw(rb).await
}

/// A correctly signed delivery with a fresh id; returns (id, response).
pub(crate) async fn deliver(s: &Srv, event: &str, body: &Value) -> (String, Resp) {
    let id = uuid::Uuid::new_v4().to_string();
    let bytes = serde_json::to_vec(body).unwrap();
    let sig = sign(SECRET, &bytes);
    let r = raw(s, Some(event), Some(&id), Some(&sig), bytes).await;
    (id, r)
}

/// The delivery once the worker has settled it.
pub(crate) async fn settled(s: &Srv, id: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..200 {
        let r = s.get(&format!("{SCM}/deliveries/{id}"), s.key()).await;
        if r.status == 200 && r.body["outcome"] != "queued" {
            return r.body;
        }
        last = r.body;
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("delivery {id} never settled: {last}");
}

/// Delivers and waits; returns the settled log entry.
pub(crate) async fn run(s: &Srv, event: &str, body: &Value) -> Value {
    let (id, r) = deliver(s, event, body).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"status": "queued", "delivery_id": id}));
    settled(s, &id).await
}

fn skipped(d: &Value, reason: &str) {
    assert_eq!(
        (d["outcome"].as_str(), d["reason"].as_str()),
        (Some("skipped"), Some(reason)),
        "{d}"
    );
}

pub(crate) async fn link(s: &Srv, full_name: &str) -> Value {
    let r = s
        .post(
            &format!("{DEV}/repositories"),
            s.key(),
            json!({"full_name": full_name}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body
}

pub(crate) fn pr(action: &str, number: u64, sha: &str, draft: bool) -> Value {
    let mut p = payload("pull_request.opened");
    p["action"] = json!(action);
    p["number"] = json!(number);
    p["pull_request"]["number"] = json!(number);
    p["pull_request"]["head"]["sha"] = json!(sha);
    p["pull_request"]["draft"] = json!(draft);
    p["installation"]["id"] = json!(INST);
    p
}

pub(crate) fn push(git_ref: &str, sha: &str) -> Value {
    let mut p = payload("push");
    p["ref"] = json!(git_ref);
    p["after"] = json!(sha);
    p["deleted"] = json!(false);
    p["installation"]["id"] = json!(INST);
    p
}

async fn runs(s: &Srv, query: &str) -> Value {
    let r = s.get(&format!("{DEV}/test-runs?{query}"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
}

each_backend!(signature_ids_dedup_and_limits);
async fn signature_ids_dedup_and_limits() {
    let s = webhook_server().await;
    // The host documentation's vector: this body and secret give this signature.
    let vector = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    assert_eq!(sign(SECRET, b"Hello, World!"), vector);
    let id = uuid::Uuid::new_v4().to_string();
    let r = raw(
        &s,
        Some("ping"),
        Some(&id),
        Some(vector),
        b"Hello, World!".to_vec(),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"status": "ignored"}));
    // Ignored deliveries claim their id too.
    let r = raw(
        &s,
        Some("ping"),
        Some(&id),
        Some(vector),
        b"Hello, World!".to_vec(),
    )
    .await;
    assert_eq!(r.assert_error(401), "Duplicate delivery");

    let body = serde_json::to_vec(&payload("push")).unwrap();
    let good = sign(SECRET, &body);
    let id = uuid::Uuid::new_v4().to_string();
    // Wrong, missing and malformed signatures: 401, and the id is not claimed.
    for sig in [
        Some(sign("another secret", &body)),
        None,
        Some("sha1=abc".to_string()),
        Some("sha256=zz".to_string()),
        Some(good.trim_start_matches("sha256=").to_string()),
    ] {
        let r = raw(&s, Some("push"), Some(&id), sig.as_deref(), body.clone()).await;
        assert_eq!(r.assert_error(401), "Invalid signature");
    }
    // A body changed after signing fails too.
    let mut tampered = body.clone();
    tampered.push(b' ');
    raw(&s, Some("push"), Some(&id), Some(&good), tampered)
        .await
        .assert_error(401);
    // The signature is checked before the delivery id.
    raw(
        &s,
        Some("push"),
        Some("not-a-uuid"),
        Some("sha256=00"),
        body.clone(),
    )
    .await
    .assert_error(401);
    // Missing or non-UUID id: 400.
    raw(&s, Some("push"), None, Some(&good), body.clone())
        .await
        .assert_error(400);
    raw(&s, Some("push"), Some("12345"), Some(&good), body.clone())
        .await
        .assert_error(400);
    // Accepted once; the same id again is 401.
    let r = raw(&s, Some("push"), Some(&id), Some(&good), body.clone()).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["status"], "queued");
    let r = raw(&s, Some("push"), Some(&id), Some(&good), body.clone()).await;
    assert_eq!(r.assert_error(401), "Duplicate delivery");
    // Another spelling of the same UUID is the same delivery.
    let braced = format!("{{{}}}", id.to_uppercase());
    let r = raw(&s, Some("push"), Some(&braced), Some(&good), body.clone()).await;
    assert_eq!(r.assert_error(401), "Duplicate delivery");

    // The host's own header names.
    let gid = uuid::Uuid::new_v4().to_string();
    let r = s
        .raw(
            s.http
                .post(s.url(&format!("{SCM}/webhooks")))
                .header("X-GitHub-Event", "push")
                .header("X-GitHub-Delivery", &gid)
                .header("X-Hub-Signature-256", &good)
                .body(body.clone()),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(settled(&s, &gid).await["event"], "push");

    // Invalid JSON in a subscribed event: accepted by signature, then skipped.
    let junk = b"{\"action\": ".to_vec();
    let jid = uuid::Uuid::new_v4().to_string();
    let sig = sign(SECRET, &junk);
    assert_eq!(
        raw(&s, Some("pull_request"), Some(&jid), Some(&sig), junk)
            .await
            .status,
        202
    );
    skipped(&settled(&s, &jid).await, "invalid_payload");
    // Missing fields the handler needs: skipped too (the worker goes on).
    let (_, r) = deliver(
        &s,
        "pull_request",
        &json!({"action": "opened", "number": "x"}),
    )
    .await;
    assert_eq!(r.status, 202);
    let d = run(&s, "pull_request", &json!({"action": "opened"})).await;
    skipped(&d, "invalid_payload");

    // Over 25 MiB: 413 while read.
    let big = vec![b' '; 25 * 1024 * 1024 + 1];
    let r = raw(
        &s,
        Some("push"),
        Some(&uuid::Uuid::new_v4().to_string()),
        Some("sha256=00"),
        big,
    )
    .await;
    r.assert_error(413);
    // The same sent chunked (no declared length): 413 once the 25 MiB are read, before the
    // signature.
    let pieces = (0..26).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1024 * 1024]));
    let r = s
        .raw(
            s.http
                .post(s.url(&format!("{SCM}/webhooks")))
                .header("content-type", "application/json")
                .header("X-Host-Event", "push")
                .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                .header("X-Hub-Signature-256", "sha256=00")
                .body(reqwest::Body::wrap_stream(futures::stream::iter(pieces))),
        )
        .await;
    r.assert_error(413);

    // 20 concurrent deliveries of one id: exactly one accepted.
    let cid = uuid::Uuid::new_v4().to_string();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (http, url, cid, good, body) = (
            s.http.clone(),
            s.url(&format!("{SCM}/webhooks")),
            cid.clone(),
            good.clone(),
            body.clone(),
        );
        tasks.push(tokio::spawn(async move {
            http.post(url)
                .header("X-Host-Event", "push")
                .header("X-Host-Delivery", cid)
                .header("X-Hub-Signature-256", good)
                .body(body)
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
    assert_eq!(codes.iter().filter(|c| **c == 202).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 401).count(), 19, "{codes:?}");

    // Rejected and duplicate deliveries are in the log (bodies are not kept), and the
    // repeated signature failures raise the status alert.
    let log = s
        .get(&format!("{SCM}/deliveries?outcome=rejected"), s.key())
        .await;
    assert_eq!(log.body["total"], 7, "{}", log.body);
    assert_eq!(log.body["items"][0]["reason"], "invalid_signature");
    let log = s
        .get(
            &format!("{SCM}/deliveries?reason=duplicate_delivery"),
            s.key(),
        )
        .await;
    assert_eq!(log.body["total"], 22);
    let log = s
        .get(&format!("{SCM}/deliveries?outcome=ignored"), s.key())
        .await;
    assert_eq!(log.body["items"][0]["reason"], "event_ignored");
    let st = s.get(&format!("{SCM}/status"), s.key()).await;
    assert_eq!(st.status, 200);
    assert_eq!(st.body["signature_failures_last_hour"], 7);
    assert_eq!(st.body["signature_failure_alert"], true);
    assert_eq!(st.body["secret_age_days"], 0);
    assert_eq!(st.body["rotation_due"], false);
    // Superuser only.
    let u = s.user("someone@x.io").await;
    s.get(&format!("{SCM}/status"), &u).await.assert_error(403);
    s.get(&format!("{SCM}/deliveries"), &u)
        .await
        .assert_error(403);
    s.post(&format!("{SCM}/webhook-secret/rotate"), &u, json!({}))
        .await
        .assert_error(403);
    s.get(
        &format!("{SCM}/deliveries/{}", uuid::Uuid::new_v4()),
        s.key(),
    )
    .await
    .assert_error(404);
}

each_backend!(rotation_keeps_the_previous_secret_for_its_grace_period);
async fn rotation_keeps_the_previous_secret_for_its_grace_period() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.scm.rotation_grace_seconds = 60;
    })
    .await;
    let r = s
        .post(&format!("{SCM}/webhook-secret/rotate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let fresh = r.body["webhook_secret"].as_str().unwrap().to_string();
    assert!(fresh.len() >= 32);
    assert!(
        r.body["previous_valid_until"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    let body = b"{}".to_vec();
    for secret in [SECRET, fresh.as_str()] {
        let r = raw(
            &s,
            Some("ping"),
            Some(&uuid::Uuid::new_v4().to_string()),
            Some(&sign(secret, &body)),
            body.clone(),
        )
        .await;
        assert_eq!(r.status, 202, "{secret}: {}", r.body);
    }
    // Past the grace period, on the runtime's clock.
    let clock = s.running.as_ref().unwrap().runtime.clock.clone();
    clock.advance(std::time::Duration::from_secs(61));
    let old = raw(
        &s,
        Some("ping"),
        Some(&uuid::Uuid::new_v4().to_string()),
        Some(&sign(SECRET, &body)),
        body.clone(),
    )
    .await;
    old.assert_error(401);
    // The rotated secret survives a restart (the configured one no longer applies).
    let s = s.restart().await;
    let r = raw(
        &s,
        Some("ping"),
        Some(&uuid::Uuid::new_v4().to_string()),
        Some(&sign(&fresh, &body)),
        body.clone(),
    )
    .await;
    assert_eq!(r.status, 202);
}

/// A signed `ping` with a fresh id, answered with its status.
async fn ping_status(s: &Srv, secret: &str) -> u16 {
    let body = b"{}".to_vec();
    let r = raw(
        s,
        Some("ping"),
        Some(&uuid::Uuid::new_v4().to_string()),
        Some(&sign(secret, &body)),
        body,
    )
    .await;
    r.status.as_u16()
}

async fn rotate(s: &Srv) -> String {
    let r = s
        .post(&format!("{SCM}/webhook-secret/rotate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    r.body["webhook_secret"].as_str().unwrap().to_string()
}

each_backend!(rotating_twice_keeps_each_earlier_secret_for_its_own_grace_period);
/// Two rotations 30 s apart: each replaced secret verifies until its own grace period ends
/// (the first is not cut short by the second), across a restart.
async fn rotating_twice_keeps_each_earlier_secret_for_its_own_grace_period() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.scm.rotation_grace_seconds = 60;
    })
    .await;
    let clock = s.rt().clock.clone();
    let first = rotate(&s).await;
    clock.advance(std::time::Duration::from_secs(30));
    let second = rotate(&s).await;
    for secret in [SECRET, first.as_str(), second.as_str()] {
        assert_eq!(ping_status(&s, secret).await, 202, "{secret}");
    }
    // The stored state keeps them: a restart (its clock starts again at the real time, about
    // the first rotation's) verifies all three.
    let s = s.restart().await;
    for secret in [SECRET, first.as_str(), second.as_str()] {
        assert_eq!(
            ping_status(&s, secret).await,
            202,
            "{secret} after a restart"
        );
    }
    let clock = s.rt().clock.clone();
    // 61 s after the first rotation: the configured secret's grace is over, the first's not.
    clock.advance(std::time::Duration::from_secs(61));
    assert_eq!(ping_status(&s, SECRET).await, 401);
    assert_eq!(ping_status(&s, &first).await, 202);
    // 91 s after it: the first's grace is over too; the current one verifies.
    clock.advance(std::time::Duration::from_secs(30));
    assert_eq!(ping_status(&s, &first).await, 401);
    assert_eq!(ping_status(&s, &second).await, 202);
}

/// A webhook server with `REPO` linked to the default project and held by installation
/// `INST` (created through the host's real `installation.created` payload); the link's id.
async fn installed() -> (Srv, u64) {
    let s = webhook_server().await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    (s, rid)
}

each_backend!(a_repository_links_once_and_starts_pending);
async fn a_repository_links_once_and_starts_pending() {
    let s = webhook_server().await;
    let repo = link(&s, REPO).await;
    assert_eq!(repo["state"], "pending");
    assert_eq!(
        repo["branch_patterns"],
        json!(["main", "master", "release/*"])
    );
    assert_eq!(repo["include_drafts"], false);
    let rid = repo["id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    assert_eq!(r.body["installation_id"], Value::Null);
    // A repository links to one project at most.
    s.post(
        &format!("{DEV}/repositories"),
        s.key(),
        json!({"full_name": REPO}),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/repositories"),
        s.key(),
        json!({"full_name": "nope"}),
    )
    .await
    .assert_error(422);
}

each_backend!(installation_created_connects_its_repositories);
async fn installation_created_connects_its_repositories() {
    let s = webhook_server().await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    assert_eq!(d["installation_id"], INST);
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(inst.body["items"][0]["id"], INST);
    assert_eq!(inst.body["items"][0]["state"], "active");
    assert_eq!(inst.body["items"][0]["account_login"], "Codertocat");
    assert_eq!(inst.body["items"][0]["repositories"], json!([REPO]));
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(
        (r.body["state"].clone(), r.body["installation_id"].clone()),
        (json!("connected"), json!(INST))
    );
    // Listed newest first, as every list is: one made later with a lower host id comes first.
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let mut later = payload("installation.created");
    later["installation"]["id"] = json!(1);
    later["repositories"] = json!([]);
    assert_eq!(
        run(&s, "installation", &later).await["outcome"],
        "processed"
    );
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    let ids: Vec<&Value> = inst.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["id"])
        .collect();
    assert_eq!(ids, vec![&json!(1), &json!(INST)]);
}

each_backend!(pull_requests_run_once_per_head_commit_with_draft_policy_and_cancel_on_close);
async fn pull_requests_run_once_per_head_commit_with_draft_policy_and_cancel_on_close() {
    let (s, rid) = installed().await;
    // pull_request opened: a run for the head commit.
    let sha1 = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    let d = run(&s, "pull_request", &pr("opened", 2, sha1, false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    assert_eq!(d["project"], "default");
    let run1 = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{run1}"), s.key()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["idempotency_key"], format!("{REPO}@{sha1}#pr2"));
    assert_eq!(r.body["status"], "queued");
    assert_eq!(r.body["attempt"], 1);
    assert_eq!(r.body["event"], "pull_request");
    assert_eq!(r.body["pull_request_number"], 2);
    assert_eq!(r.body["ref"], "changes");
    assert_eq!(r.body["commit_sha"], sha1);
    assert_eq!(r.body["delivery_id"], d["delivery_id"]);
    // Redelivered with a new id, and synchronize of the same commit: no second run.
    for action in ["opened", "synchronize"] {
        let d = run(&s, "pull_request", &pr(action, 2, sha1, false)).await;
        skipped(&d, "duplicate_job");
        assert_eq!(d["test_run_id"], run1);
    }
    // A new head commit runs.
    let sha2 = "1111111111111111111111111111111111111111";
    let d = run(&s, "pull_request", &pr("synchronize", 2, sha2, false)).await;
    assert_eq!(d["outcome"], "dispatched");
    let run2 = d["test_run_id"].as_u64().unwrap();

    // Drafts: excluded by default, included when the repository says so.
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            3,
            "3333333333333333333333333333333333333333",
            true,
        ),
    )
    .await;
    skipped(&d, "draft_excluded");
    let r = s
        .patch(
            &format!("{DEV}/repositories/{rid}"),
            s.key(),
            json!({"include_drafts": true}),
        )
        .await;
    assert_eq!(r.body["include_drafts"], true);
    let d = run(
        &s,
        "pull_request",
        &pr(
            "ready_for_review",
            3,
            "3333333333333333333333333333333333333333",
            true,
        ),
    )
    .await;
    assert_eq!(d["outcome"], "dispatched");
    s.patch(
        &format!("{DEV}/repositories/{rid}"),
        s.key(),
        json!({"include_drafts": false}),
    )
    .await;

    // A runner takes run1; closing the pull request cancels run1 and run2.
    let c = s
        .post(&format!("{DEV}/test-runs/claim"), s.key(), json!({}))
        .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.body["id"], run1);
    assert_eq!(c.body["status"], "running");
    let mut closed = payload("pull_request.closed");
    closed["installation"]["id"] = json!(INST);
    let d = run(&s, "pull_request", &closed).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    for id in [run1, run2] {
        let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
        assert_eq!(r.body["status"], "cancelled", "{}", r.body);
    }
    // A cancelled run cannot complete; a reopened pull request runs again.
    let r = s
        .post(
            &format!("{DEV}/test-runs/{run1}/complete"),
            s.key(),
            json!({"status": "passed"}),
        )
        .await;
    r.assert_error(409);
    let d = run(&s, "pull_request", &pr("reopened", 2, sha2, false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    assert_ne!(d["test_run_id"], run2);
    // An action the service does not handle.
    let d = run(&s, "pull_request", &pr("labeled", 2, sha2, false)).await;
    skipped(&d, "action_ignored");
}

each_backend!(pushes_follow_the_branch_patterns);
async fn pushes_follow_the_branch_patterns() {
    let (s, rid) = installed().await;
    // push: branch policy (main, master, release/*), tags, deletions.
    let d = run(&s, "push", &{
        let mut p = payload("push");
        p["installation"]["id"] = json!(INST);
        p
    })
    .await;
    skipped(&d, "branch_deleted");
    for (git_ref, want) in [
        ("refs/heads/main", None),
        ("refs/heads/release/1.0", None),
        ("refs/heads/release/1/2", Some("branch_not_matched")),
        ("refs/heads/feature", Some("branch_not_matched")),
        ("refs/tags/v1.0.0", Some("branch_not_matched")),
    ] {
        let d = run(
            &s,
            "push",
            &push(git_ref, "4444444444444444444444444444444444444444"),
        )
        .await;
        match want {
            None => {
                assert_eq!(d["outcome"], "dispatched", "{git_ref}: {d}");
                let id = d["test_run_id"].as_u64().unwrap();
                let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
                let branch = git_ref.trim_start_matches("refs/heads/");
                assert_eq!(
                    r.body["idempotency_key"],
                    format!("{REPO}@4444444444444444444444444444444444444444@{branch}")
                );
            }
            Some(reason) => skipped(&d, reason),
        }
    }
    // Patterns can be changed.
    s.patch(
        &format!("{DEV}/repositories/{rid}"),
        s.key(),
        json!({"branch_patterns": ["feat-*"]}),
    )
    .await;
    let d = run(
        &s,
        "push",
        &push(
            "refs/heads/feat-x",
            "5555555555555555555555555555555555555555",
        ),
    )
    .await;
    assert_eq!(d["outcome"], "dispatched");
    let d = run(
        &s,
        "push",
        &push(
            "refs/heads/main",
            "5555555555555555555555555555555555555555",
        ),
    )
    .await;
    skipped(&d, "branch_not_matched");
    s.patch(
        &format!("{DEV}/repositories/{rid}"),
        s.key(),
        json!({"branch_patterns": ["main", "master", "release/*"]}),
    )
    .await;
}

each_backend!(check_suite_rerequests_count_attempts_per_commit);
async fn check_suite_rerequests_count_attempts_per_commit() {
    let (s, _) = installed().await;
    // check_suite: requested keyed like a push; rerequested always runs again, attempt + 1.
    let d = run(&s, "check_suite", &payload("check_suite.requested")).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let cs1 = d["test_run_id"].as_u64().unwrap();
    let d = run(&s, "check_suite", &payload("check_suite.requested")).await;
    skipped(&d, "duplicate_job");
    let mut rr = payload("check_suite.rerequested");
    rr["check_suite"]["head_sha"] =
        payload("check_suite.requested")["check_suite"]["head_sha"].clone();
    rr["check_suite"]["head_branch"] = json!("master");
    let mut attempts = Vec::new();
    for _ in 0..2 {
        let d = run(&s, "check_suite", &rr).await;
        assert_eq!(d["outcome"], "dispatched");
        let id = d["test_run_id"].as_u64().unwrap();
        assert_ne!(id, cs1);
        let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
        attempts.push(r.body["attempt"].as_u64().unwrap());
    }
    assert_eq!(attempts, vec![2, 3]);
    // Runners taking (and so rewriting) the older runs do not move the key back.
    while s
        .post(&format!("{DEV}/test-runs/claim"), s.key(), json!({}))
        .await
        .status
        == 200
    {}
    let d = run(&s, "check_suite", &rr).await;
    let id = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
    assert_eq!(r.body["attempt"], 4);
    // A rerequest counts every run of the commit in the repository, whatever event made it:
    // a push ran 7777... once, so the suite's first rerequest is attempt 2.
    let sha7 = "7777777777777777777777777777777777777777";
    let d = run(&s, "push", &push("refs/heads/main", sha7)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let mut rr7 = rr.clone();
    rr7["check_suite"]["head_sha"] = json!(sha7);
    rr7["check_suite"]["head_branch"] = json!("feature/seven");
    for want in [2, 3] {
        let d = run(&s, "check_suite", &rr7).await;
        let id = d["test_run_id"].as_u64().unwrap();
        let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
        assert_eq!(r.body["attempt"], want, "{}", r.body);
        assert_eq!(r.body["commit_sha"], sha7);
    }
}

each_backend!(workflow_run_completed_records_the_finished_run);
async fn workflow_run_completed_records_the_finished_run() {
    let (s, _) = installed().await;
    // workflow_run completed: the finished run recorded, resolved through its repository
    // (the payload names no installation).
    link(&s, "octo-org/octo-repo").await;
    let d = run(&s, "workflow_run", &payload("workflow_run.completed")).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let wr = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{wr}"), s.key()).await;
    assert_eq!(r.body["status"], "passed");
    assert_eq!(r.body["event"], "workflow_run");
    assert!(
        r.body["idempotency_key"]
            .as_str()
            .unwrap()
            .ends_with("#wr289782451.1")
    );
    assert_eq!(
        r.body["urls"]["artifacts_url"],
        "https://api.github.com/repos/octo-org/octo-repo/actions/runs/289782451/artifacts"
    );
    let d = run(&s, "workflow_run", &payload("workflow_run.completed")).await;
    skipped(&d, "duplicate_job");
    // A cancelled run holds no key; a repeat of its completion is a duplicate all the same.
    let mut cancelled = payload("workflow_run.completed");
    cancelled["workflow_run"]["id"] = json!(289782452);
    cancelled["workflow_run"]["conclusion"] = json!("cancelled");
    let d = run(&s, "workflow_run", &cancelled).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let first = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{first}"), s.key()).await;
    assert_eq!(r.body["status"], "cancelled");
    let d = run(&s, "workflow_run", &cancelled).await;
    skipped(&d, "duplicate_job");
    assert_eq!(d["test_run_id"], first);
}

each_backend!(a_repository_linked_to_no_project_is_skipped);
async fn a_repository_linked_to_no_project_is_skipped() {
    let (s, _) = installed().await;
    // A repository linked to no project.
    let mut p = push(
        "refs/heads/main",
        "6666666666666666666666666666666666666666",
    );
    p["repository"]["full_name"] = json!("someone/else");
    skipped(&run(&s, "push", &p).await, "repository_not_linked");
}

each_backend!(installation_repositories_removed_and_added_move_the_link);
async fn installation_repositories_removed_and_added_move_the_link() {
    let (s, rid) = installed().await;
    // installation_repositories removed / added.
    let mut removed = payload("installation_repositories.removed");
    removed["installation"]["id"] = json!(INST);
    removed["repositories_removed"][0]["full_name"] = json!(REPO);
    let d = run(&s, "installation_repositories", &removed).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "disconnected");
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            7,
            "7777777777777777777777777777777777777777",
            false,
        ),
    )
    .await;
    skipped(&d, "repository_removed");
    let mut added = payload("installation_repositories.added");
    added["repositories_added"][0]["full_name"] = json!(REPO);
    let d = run(&s, "installation_repositories", &added).await;
    assert_eq!(d["outcome"], "processed");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "connected");
}

each_backend!(suspended_and_deleted_installations_skip_their_events);
async fn suspended_and_deleted_installations_skip_their_events() {
    let (s, _) = installed().await;
    // suspend / unsuspend / deleted.
    let mut suspend = payload("installation.suspend");
    suspend["installation"]["id"] = json!(INST);
    assert_eq!(
        run(&s, "installation", &suspend).await["outcome"],
        "processed"
    );
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            8,
            "8888888888888888888888888888888888888888",
            false,
        ),
    )
    .await;
    skipped(&d, "installation_suspended");
    let mut unsuspend = suspend.clone();
    unsuspend["action"] = json!("unsuspend");
    assert_eq!(
        run(&s, "installation", &unsuspend).await["outcome"],
        "processed"
    );
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            8,
            "8888888888888888888888888888888888888888",
            false,
        ),
    )
    .await;
    assert_eq!(d["outcome"], "dispatched");
    let mut other = suspend.clone();
    other["action"] = json!("new_permissions_accepted");
    skipped(&run(&s, "installation", &other).await, "action_ignored");
    let mut deleted = payload("installation.deleted");
    deleted["installation"]["id"] = json!(INST);
    deleted["repositories"] = json!([{"full_name": REPO}]);
    assert_eq!(
        run(&s, "installation", &deleted).await["outcome"],
        "processed"
    );
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(inst.body["items"][0]["state"], "deleted");
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            9,
            "9999999999999999999999999999999999999999",
            false,
        ),
    )
    .await;
    skipped(&d, "installation_deleted");
}

each_backend!(the_delivery_log_filters_by_reason_and_outcome);
async fn the_delivery_log_filters_by_reason_and_outcome() {
    let (s, _) = installed().await;
    let sha1 = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    assert_eq!(
        run(&s, "pull_request", &pr("opened", 2, sha1, false)).await["outcome"],
        "dispatched"
    );
    // Four duplicate jobs, then one other skip.
    for action in ["opened", "synchronize", "opened", "synchronize"] {
        skipped(
            &run(&s, "pull_request", &pr(action, 2, sha1, false)).await,
            "duplicate_job",
        );
    }
    skipped(
        &run(&s, "pull_request", &pr("labeled", 2, sha1, false)).await,
        "action_ignored",
    );
    // The project's delivery log: filters, and the single view with the payload.
    let l = s
        .get(
            &format!("{DEV}/webhook-deliveries?reason=duplicate_job"),
            s.key(),
        )
        .await;
    assert_eq!(l.status, 200);
    assert_eq!(l.body["total"], 4, "{}", l.body);
    let one = l.body["items"][0]["delivery_id"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s
        .get(&format!("{DEV}/webhook-deliveries/{one}"), s.key())
        .await;
    assert_eq!(d.status, 200);
    assert!(d.body["payload"].is_object());
    let l = s
        .get(
            &format!("{DEV}/webhook-deliveries?outcome=skipped&page_size=2"),
            s.key(),
        )
        .await;
    assert_eq!(l.body["items"].as_array().unwrap().len(), 2);
    s.get(&format!("{DEV}/webhook-deliveries?outcome=nope"), s.key())
        .await
        .assert_error(422);
}

each_backend!(test_runs_filter_by_status_commit_and_repository);
async fn test_runs_filter_by_status_commit_and_repository() {
    let (s, _) = installed().await;
    link(&s, "octo-org/octo-repo").await;
    let sha1 = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    let sha2 = "1111111111111111111111111111111111111111";
    for (n, sha) in [(2, sha1), (3, sha2)] {
        assert_eq!(
            run(&s, "pull_request", &pr("opened", n, sha, false)).await["outcome"],
            "dispatched"
        );
    }
    let mut closed = payload("pull_request.closed");
    closed["installation"]["id"] = json!(INST);
    closed["number"] = json!(3);
    closed["pull_request"]["number"] = json!(3);
    assert_eq!(
        run(&s, "pull_request", &closed).await["outcome"],
        "dispatched"
    );
    assert_eq!(
        run(&s, "workflow_run", &payload("workflow_run.completed")).await["outcome"],
        "dispatched"
    );
    let all = runs(&s, "page_size=500").await;
    assert_eq!(all["total"], 3, "{all}");
    let cancelled = runs(&s, "status=cancelled").await;
    assert_eq!(cancelled["total"], 1, "{cancelled}");
    let by_sha = runs(&s, &format!("commit_sha={sha1}")).await;
    assert_eq!(by_sha["total"], 1);
    let by_repo = runs(&s, "repository=octo-org/octo-repo").await;
    assert_eq!(by_repo["total"], 1);
    // A commit id is one commit however it is spelled: a pull request sent in capitals
    // stores it lower-cased, and the filter finds it in either spelling.
    let shouted = "ABCDEF0123456789ABCDEF0123456789ABCDEF01";
    assert_eq!(
        run(&s, "pull_request", &pr("opened", 4, shouted, false)).await["outcome"],
        "dispatched"
    );
    for q in [shouted.to_string(), shouted.to_ascii_lowercase()] {
        let by_sha = runs(&s, &format!("commit_sha={q}")).await;
        assert_eq!(by_sha["total"], 1, "{q}: {by_sha}");
        assert_eq!(
            by_sha["items"][0]["commit_sha"],
            shouted.to_ascii_lowercase()
        );
    }
    // The same pull request and commit spelled in lower case is the same job.
    let again = run(
        &s,
        "pull_request",
        &pr("synchronize", 4, &shouted.to_ascii_lowercase(), false),
    )
    .await;
    assert_eq!(again["reason"], "duplicate_job", "{again}");
}

each_backend!(runners_claim_renew_complete_and_leases_expire);
async fn runners_claim_renew_complete_and_leases_expire() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.runs.lease_seconds = 60;
    })
    .await;
    link(&s, REPO).await;
    for n in 1..=2 {
        let d = run(
            &s,
            "pull_request",
            &pr("opened", n, &format!("{n:040}"), false),
        )
        .await;
        assert_eq!(d["outcome"], "dispatched");
    }
    let claim = format!("{DEV}/test-runs/claim");
    let a = s.post(&claim, s.key(), json!({})).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["pull_request_number"], 1);
    assert!(a.body["lease_expires_at"].is_string());
    let a_id = a.body["id"].as_u64().unwrap();
    let b = s.post(&claim, s.key(), json!({})).await;
    assert_eq!(b.body["pull_request_number"], 2);
    let b_id = b.body["id"].as_u64().unwrap();
    let none = s.post(&claim, s.key(), json!({})).await;
    assert_eq!(none.status, 204);
    // Heartbeats keep `a` alive; `b` lapses and returns to the queue with attempt 2. Time
    // moves on the runtime's clock, so no step depends on a sleep being on time.
    let clock = s.running.as_ref().unwrap().runtime.clock.clone();
    let secs = std::time::Duration::from_secs;
    clock.advance(secs(40));
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/heartbeat"),
            s.key(),
            json!({}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // 40 s in, both leases hold (the expiry pass runs every second).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = s.get(&format!("{DEV}/test-runs/{b_id}"), s.key()).await;
    assert_eq!(
        (r.body["status"].clone(), r.body["attempt"].clone()),
        (json!("running"), json!(1))
    );
    // 70 s in: `b`'s lease (to 60 s) has lapsed, `a`'s (renewed to 100 s) holds.
    clock.advance(secs(30));
    assert!(
        eventually(10, || async {
            let r = s.get(&format!("{DEV}/test-runs/{b_id}"), s.key()).await;
            (r.body["status"].clone(), r.body["attempt"].clone()) == (json!("queued"), json!(2))
        })
        .await
    );
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/heartbeat"),
            s.key(),
            json!({}),
        )
        .await;
    assert_eq!(r.body["status"], "running");
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/complete"),
            s.key(),
            json!({"status": "ok"}),
        )
        .await;
    r.assert_error(422);
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/complete"),
            s.key(),
            json!({"status": "passed", "summary": "12 passed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "passed");
    assert_eq!(r.body["summary"], "12 passed");
    assert_eq!(r.body["lease_expires_at"], Value::Null);
    s.post(
        &format!("{DEV}/test-runs/{a_id}/complete"),
        s.key(),
        json!({"status": "failed"}),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/test-runs/{a_id}/heartbeat"),
        s.key(),
        json!({}),
    )
    .await
    .assert_error(409);
    s.get(&format!("{DEV}/test-runs/999999"), s.key())
        .await
        .assert_error(404);
    // A redelivery of a passed run's commit makes no new run.
    let d = run(
        &s,
        "pull_request",
        &pr("opened", 1, &format!("{:040}", 1), false),
    )
    .await;
    skipped(&d, "duplicate_job");
}

// On a multi-threaded runtime, as the server runs in production: a store call that waits
// for the database then holds one worker, not the whole server.
each_backend!(
    five_hundred_concurrent_deliveries_are_all_accepted_and_processed,
    threads = 4
);
async fn five_hundred_concurrent_deliveries_are_all_accepted_and_processed() {
    let s = webhook_server().await;
    link(&s, REPO).await;
    let mut tasks = Vec::new();
    for n in 0..500u64 {
        let body = serde_json::to_vec(&pr("opened", n + 1, &format!("{n:040}"), false)).unwrap();
        let (http, url) = (s.http.clone(), s.url(&format!("{SCM}/webhooks")));
        tasks.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let st = http
                .post(url)
                .header("X-Host-Event", "pull_request")
                .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                .header("X-Hub-Signature-256", sign(SECRET, &body))
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            (st, started.elapsed())
        }));
    }
    for t in tasks {
        let (st, took) = t.await.unwrap();
        assert_eq!(st, 202);
        // A server whose workers all wait on the database answers none of them: ten
        // seconds is far beyond a loaded CI machine's worst answer and far below a stall.
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
    assert!(
        eventually(30, || async {
            runs(&s, "page_size=1").await["total"] == 500
        })
        .await,
        "not every delivery made its run"
    );
    let queued = s
        .get(&format!("{SCM}/deliveries?outcome=queued"), s.key())
        .await;
    assert!(
        eventually(10, || async {
            s.get(
                &format!("{SCM}/deliveries?outcome=dispatched&page_size=1"),
                s.key(),
            )
            .await
            .body["total"]
                == 500
        })
        .await,
        "{}",
        queued.body
    );
}

each_backend!(an_installation_actor_panic_loses_no_delivery);
/// A panic in an installation's actor: it restarts, and deliveries queued behind the fault
/// are all processed, once.
async fn an_installation_actor_panic_loses_no_delivery() {
    let s = webhook_server().await;
    link(&s, REPO).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let mut ids = Vec::new();
    for n in 0..40u64 {
        if n == 10 {
            rt.webhooks.inject_panic(INST).await.unwrap();
        }
        let (id, r) = deliver(
            &s,
            "pull_request",
            &pr("opened", n + 1, &format!("{n:040}"), false),
        )
        .await;
        assert_eq!(r.status, 202);
        ids.push(id);
    }
    for id in &ids {
        assert_eq!(settled(&s, id).await["outcome"], "dispatched");
    }
    assert_eq!(runs(&s, "page_size=1").await["total"], 40);
    assert!(rt.restarts() > 0);
}

each_backend!(delivery_ids_are_remembered_for_the_dedup_window);
/// A delivery id is refused within the dedup window and accepted again after it (the
/// housekeeper frees expired ids); the delivery log keeps the first delivery.
async fn delivery_ids_are_remembered_for_the_dedup_window() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.scm.dedup_window_seconds = 60;
    })
    .await;
    let body = b"{}".to_vec();
    let id = uuid::Uuid::new_v4().to_string();
    let sig = sign(SECRET, &body);
    assert_eq!(
        raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
            .await
            .status,
        202
    );
    raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
        .await
        .assert_error(401);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.webhooks.expire().await.unwrap();
    // Still inside the window: still refused.
    raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
        .await
        .assert_error(401);
    rt.clock.advance(std::time::Duration::from_secs(61));
    rt.webhooks.expire().await.unwrap();
    assert_eq!(
        raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
            .await
            .status,
        202
    );
    // The dedup window survives a restart.
    raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
        .await
        .assert_error(401);
    drop(rt);
    let s = s.restart().await;
    raw(&s, Some("ping"), Some(&id), Some(&sig), body)
        .await
        .assert_error(401);
}

each_backend!(the_delivery_log_forgets_deliveries_after_30_days);
/// The delivery log keeps an accepted delivery 30 days: a day short of it the housekeeper
/// keeps it, past it the housekeeper's pass removes it (404, out of the list and its total).
async fn the_delivery_log_forgets_deliveries_after_30_days() {
    let s = webhook_server().await;
    let (id, r) = deliver(&s, "ping", &json!({"zen": "keep it logically awesome"})).await;
    assert_eq!(r.status, 202, "{}", r.body);
    settled(&s, &id).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let day = std::time::Duration::from_secs(86_400);
    rt.clock.advance(29 * day);
    rt.housekeep_now();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        s.get(&format!("{SCM}/deliveries/{id}"), s.key())
            .await
            .status,
        200
    );
    rt.clock.advance(2 * day);
    rt.housekeep_now();
    assert!(
        eventually(10, || async {
            s.get(&format!("{SCM}/deliveries/{id}"), s.key())
                .await
                .status
                == 404
        })
        .await,
        "a delivery older than 30 days is still in the log"
    );
    let r = s.get(&format!("{SCM}/deliveries"), s.key()).await;
    assert_eq!(r.body["total"], 0, "{}", r.body);
}

each_backend!(deliveries_queued_together_are_worked_in_batches_in_order);
/// Deliveries queued together are worked in batches, in arrival order: a suspend or a
/// repository's removal between pull requests takes effect exactly between them, and a run of
/// more pull requests than one batch holds is worked whole, each once.
async fn deliveries_queued_together_are_worked_in_batches_in_order() {
    let s = installed_for_batches().await;
    let sha = |n: u64| format!("{n:040}");
    let mut suspend = payload("installation.suspend");
    suspend["installation"]["id"] = json!(INST);
    let mut unsuspend = suspend.clone();
    unsuspend["action"] = json!("unsuspend");
    let mut removed = payload("installation_repositories.removed");
    removed["installation"]["id"] = json!(INST);
    removed["repositories_removed"][0]["full_name"] = json!(REPO);
    let mut added = payload("installation_repositories.added");
    added["installation"]["id"] = json!(INST);
    added["repositories_added"][0]["full_name"] = json!(REPO);
    let mut plan: Vec<(&str, Value)> = vec![
        ("pull_request", pr("opened", 1, &sha(1), false)),
        ("pull_request", pr("opened", 2, &sha(2), false)),
        ("installation", suspend),
        ("pull_request", pr("opened", 3, &sha(3), false)),
        ("installation", unsuspend),
        ("pull_request", pr("opened", 4, &sha(4), false)),
        ("installation_repositories", removed),
        ("pull_request", pr("opened", 5, &sha(5), false)),
        ("installation_repositories", added),
    ];
    for n in 6..=75 {
        plan.push(("pull_request", pr("opened", n, &sha(n), false)));
    }
    // Pull requests that name no installation go to the one holding their repository: the
    // move of the repository to another installation between them decides where each goes.
    let unnamed = |n: u64| {
        let mut p = pr("opened", n, &sha(n), false);
        p.as_object_mut().unwrap().remove("installation");
        p
    };
    let mut moved = payload("installation_repositories.added");
    moved["installation"]["id"] = json!(4242);
    moved["repositories_added"][0]["full_name"] = json!(REPO);
    plan.push(("pull_request", unnamed(76)));
    plan.push(("installation_repositories", moved));
    plan.push(("pull_request", unnamed(77)));
    // Everything queues in the intake's mailbox in the order sent, is stored in one batch,
    // and reaches the worker together.
    let ids = send_held(&s, plan).await;
    for (i, id) in ids.iter().enumerate() {
        let d = settled(&s, id).await;
        match i {
            2 | 4 | 6 | 8 => assert_eq!(d["outcome"], "processed", "{i}: {}", d["reason"]),
            3 => skipped(&d, "installation_suspended"),
            7 => skipped(&d, "repository_removed"),
            80 => assert_eq!(d["outcome"], "processed", "{i}: {}", d["reason"]),
            _ => assert_eq!(d["outcome"], "dispatched", "{i}: {}", d["reason"]),
        }
        match i {
            79 => assert_eq!(d["installation_id"], INST),
            81 => assert_eq!(d["installation_id"], 4242),
            _ => {}
        }
    }
    assert_eq!(runs(&s, "page_size=1").await["total"], 75);
}

each_backend!(a_dispatch_failing_mid_batch_is_retried_in_order_without_duplicates);
/// A dispatch that fails in the middle of a batch (as on a failing write) leaves that delivery
/// queued; it and everything after it are worked again one at a time, in order: every
/// delivery is dispatched once, into one run each, and the runs are made in arrival order.
async fn a_dispatch_failing_mid_batch_is_retried_in_order_without_duplicates() {
    let s = installed_for_batches().await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    // The twenty pull requests reach the worker as one batch; the fifth of them fails in
    // the dispatcher.
    let failed = rt.webhooks.inject_dispatch_failure(5);
    let run_ids = twenty_prs_each_dispatched_once(&s).await;
    // The failed attempt's run (its id taken, its writes taken back) left one gap, before
    // the fifth: had its writes been kept, the fifth's run would be the failed attempt's.
    let gaps: Vec<usize> = run_ids
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1] != w[0] + 1)
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(gaps, vec![4], "{run_ids:?}");
    assert_eq!(runs(&s, "page_size=1").await["total"], 20);
    assert!(
        failed.load(std::sync::atomic::Ordering::SeqCst),
        "the injected failure happened"
    );
}

each_backend!(a_shared_commit_that_fails_leaves_its_deliveries_to_be_worked_again_in_order);
/// A shared batch of outcomes that fails to commit (as on a failing disk) leaves all of its
/// deliveries queued; each is worked again on its own, in order: every delivery is
/// dispatched once, into one run each, made in arrival order, and nothing of the failed
/// batch survives (its runs' ids are gaps).
async fn a_shared_commit_that_fails_leaves_its_deliveries_to_be_worked_again_in_order() {
    let s = installed_for_batches().await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let failed = rt.webhooks.inject_commit_failure();
    let run_ids = twenty_prs_each_dispatched_once(&s).await;
    assert!(
        failed.load(std::sync::atomic::Ordering::SeqCst),
        "the injected failure happened"
    );
    // The failed batch had taken ids for its runs, so the runs kept start past a gap.
    let first = run_ids.first().copied().unwrap_or_default();
    let listed = runs(&s, "page_size=100").await;
    assert_eq!(listed["total"], 20, "no run of the failed batch was kept");
    let lowest = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_u64())
        .min()
        .unwrap();
    assert_eq!(lowest, first);
    assert!(
        first > 1,
        "the failed batch's run ids were taken and left unused: {run_ids:?}"
    );
}

/// Sends twenty pull requests as one batch and waits for each: every one dispatched into a
/// run of its own, the runs made in arrival order. Their run ids, in arrival order.
async fn twenty_prs_each_dispatched_once(s: &Srv) -> Vec<u64> {
    let plan = (1..=20u64)
        .map(|n| ("pull_request", pr("opened", n, &format!("{n:040}"), false)))
        .collect();
    let ids = send_held(s, plan).await;
    let mut run_ids = Vec::new();
    for id in &ids {
        let d = settled(s, id).await;
        assert_eq!(d["outcome"], "dispatched", "{d}");
        run_ids.push(d["test_run_id"].as_u64().expect("a run"));
    }
    let mut sorted = run_ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(run_ids, sorted, "one run each, made in arrival order");
    run_ids
}

/// A server with the repository linked and installed, whose calls wait long enough for a
/// held intake write (the batch tests hold it while their deliveries queue).
async fn installed_for_batches() -> Srv {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.supervision.call_timeout_ms = 30_000;
    })
    .await;
    link(&s, REPO).await;
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    s
}

/// Sends `plan` while the intake's write is held, so it is stored as one batch and reaches
/// the worker together; returns the delivery ids once every one is answered 202.
async fn send_held(s: &Srv, plan: Vec<(&'static str, Value)>) -> Vec<String> {
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let hold = rt.webhooks.inject_write_hold();
    let mut ids = Vec::new();
    let mut tasks = Vec::new();
    for (i, (event, body)) in plan.into_iter().enumerate() {
        let id = uuid::Uuid::new_v4().to_string();
        ids.push(id.clone());
        let bytes = serde_json::to_vec(&body).unwrap();
        let sig = sign(SECRET, &bytes);
        let (http, url) = (s.http.clone(), s.url(&format!("{SCM}/webhooks")));
        tasks.push(tokio::spawn(async move {
            http.post(url)
                .header("X-Host-Event", event)
                .header("X-Host-Delivery", id)
                .header("X-Hub-Signature-256", sig)
                .body(bytes)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
        assert!(eventually(10, || async { rt.webhooks.intake_waiting() == i + 1 }).await);
    }
    hold.release();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 202);
    }
    ids
}

each_backend!(one_batch_reads_the_runs_its_earlier_deliveries_made);
/// Deliveries worked in one batch see the runs the earlier ones made: a repeat of a pull
/// request's head is a duplicate job, and its close cancels both heads' runs, as if they had
/// come one at a time (the dispatcher commits its shared batch before a delivery that may
/// read what it holds).
async fn one_batch_reads_the_runs_its_earlier_deliveries_made() {
    let s = installed_for_batches().await;
    let (a, b, c) = (
        format!("{:040}", 1),
        format!("{:040}", 2),
        "abcdef".repeat(7)[..40].to_string(),
    );
    // A push of a commit, then a rerequest of its suite spelled in capitals: attempt 2.
    let push_c = push("refs/heads/main", &c);
    let mut rerequest = payload("check_suite.rerequested");
    rerequest["check_suite"]["head_sha"] = json!(c.to_ascii_uppercase());
    rerequest["check_suite"]["head_branch"] = json!("main");
    rerequest["installation"]["id"] = json!(INST);
    rerequest["repository"]["full_name"] = json!(REPO.to_ascii_uppercase());
    let ids = send_held(
        &s,
        vec![
            ("pull_request", pr("opened", 7, &a, false)),
            ("pull_request", pr("opened", 8, &a, false)),
            ("pull_request", pr("opened", 7, &a, false)),
            ("pull_request", pr("synchronize", 7, &b, false)),
            ("pull_request", pr("closed", 7, &b, false)),
            ("pull_request", pr("opened", 9, &b, false)),
            // A close whose head is new: only its number ties it to 10's run.
            (
                "pull_request",
                pr("opened", 10, &format!("{:040}", 3), false),
            ),
            (
                "pull_request",
                pr("closed", 10, &format!("{:040}", 4), false),
            ),
            ("push", push_c),
            ("check_suite", rerequest),
        ],
    )
    .await;
    let mut out = Vec::new();
    for id in &ids {
        let d = settled(&s, id).await;
        out.push((
            d["outcome"].as_str().unwrap().to_string(),
            d["reason"].as_str().map(str::to_string),
        ));
    }
    let dispatched = ("dispatched".to_string(), None);
    let mut expected = vec![dispatched.clone(); 10];
    expected[2] = ("skipped".into(), Some("duplicate_job".into()));
    assert_eq!(out, expected);
    let cancelled = runs(&s, "status=cancelled").await;
    assert_eq!(cancelled["total"], 3, "{cancelled}");
    assert_eq!(runs(&s, "status=queued").await["total"], 4);
    let d = settled(&s, &ids[9]).await;
    let id = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
    assert_eq!(r.body["attempt"], 2, "{}", r.body);
}

each_backend!(the_merged_delivery_log_pages_as_the_whole_list_reads);
/// The superuser's log merges stored deliveries with the rejected ones kept in memory; every
/// page of it, read one window deep into the store, is the same slice of the whole list.
async fn the_merged_delivery_log_pages_as_the_whole_list_reads() {
    let s = webhook_server().await;
    // Stored and rejected deliveries interleaved in time, some in the same millisecond.
    for i in 0..24u32 {
        if i % 3 == 1 {
            let id = uuid::Uuid::new_v4().to_string();
            let r = raw(
                &s,
                Some("push"),
                Some(&id),
                Some("sha256=00"),
                b"{}".to_vec(),
            )
            .await;
            assert_eq!(r.status, 401);
        } else {
            let (_, r) = deliver(&s, "ping", &json!({"zen": i})).await;
            assert_eq!(r.status, 202);
        }
        if i % 4 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
    }
    let whole = s
        .get(&format!("{SCM}/deliveries?page_size=500"), s.key())
        .await;
    assert_eq!(whole.body["total"], 24, "{}", whole.body);
    let whole = whole.body["items"].as_array().unwrap().clone();
    assert_eq!(whole.len(), 24);
    for size in [1usize, 3, 5, 7] {
        let mut paged = Vec::new();
        for page in 1..=24usize.div_ceil(size) + 1 {
            let r = s
                .get(
                    &format!("{SCM}/deliveries?page_size={size}&page={page}"),
                    s.key(),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.body["total"], 24);
            paged.extend(r.body["items"].as_array().unwrap().iter().cloned());
        }
        assert_eq!(paged, whole, "pages of {size}");
    }
}

each_backend!(a_long_event_name_is_ignored_and_logged_short);
/// An event name no subscription could match, however long, is ignored (202) like any
/// other unsubscribed event: its id is claimed, and the log keeps the name cut short (its
/// first 64 characters and "...", as for a rejected delivery).
async fn a_long_event_name_is_ignored_and_logged_short() {
    let s = webhook_server().await;
    let long = "x".repeat(80);
    let (id, r) = deliver(&s, &long, &json!({"zen": 1})).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"status": "ignored"}));
    let d = s.get(&format!("{SCM}/deliveries/{id}"), s.key()).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body["event"], format!("{}...", "x".repeat(64)));
    assert_eq!(d.body["outcome"], "ignored");
    // Its id is claimed like any correctly signed delivery's.
    let body = serde_json::to_vec(&json!({"zen": 1})).unwrap();
    let sig = sign(SECRET, &body);
    let again = raw(&s, Some(&long), Some(&id), Some(&sig), body).await;
    assert_eq!(again.assert_error(401), "Duplicate delivery");
    // No event at all is still a bad request.
    let body = b"{}".to_vec();
    let sig = sign(SECRET, &body);
    let id = uuid::Uuid::new_v4().to_string();
    raw(&s, None, Some(&id), Some(&sig), body)
        .await
        .assert_error(400);
}

/// A free organization made by another user, and its project: (JWT, its project's path).
async fn other_tenant(s: &Srv, slug: &str) -> (String, String) {
    let jwt = s.user(&format!("owner@{slug}.example")).await;
    let r = s
        .post("/api/v1/organizations", &jwt, json!({"slug": slug}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(
            &format!("/api/v1/organizations/{slug}/projects"),
            &jwt,
            json!({"slug": "p"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    (jwt, format!("/api/v1/organizations/{slug}/projects/p"))
}

each_backend!(another_organization_linking_a_repository_never_receives_its_deliveries);
/// Another organization links the bound installation's repository: neither link conflicts
/// nor shows the other, and every delivery still resolves to the installation's organization.
async fn another_organization_linking_a_repository_never_receives_its_deliveries() {
    let s = webhook_server().await;
    // Bound to `default` when first seen: the service has one organization then.
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(
        inst.body["items"][0]["organization"], "default",
        "{}",
        inst.body
    );

    let (evil, evil_p) = other_tenant(&s, "evil").await;
    let r = s
        .post(
            &format!("{evil_p}/repositories"),
            &evil,
            json!({"full_name": REPO}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let evil_link = r.body["id"].as_u64().unwrap();
    assert_eq!(
        (r.body["state"].as_str(), &r.body["installation_id"]),
        (Some("pending"), &Value::Null)
    );
    // The owner's link is not refused because another organization linked the name first.
    let mine = link(&s, REPO).await;
    assert_eq!(mine["state"], "connected", "{mine}");

    let d = run(&s, "pull_request", &pr("opened", 7, "abc7", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["project"].as_str()),
        (Some("dispatched"), Some("default")),
        "{d}"
    );
    assert_eq!(runs(&s, "").await["total"], 1);
    let theirs = s.get(&format!("{evil_p}/test-runs"), &evil).await;
    assert_eq!(theirs.body["total"], 0, "{}", theirs.body);
    let log = s.get(&format!("{evil_p}/webhook-deliveries"), &evil).await;
    assert_eq!(log.body["total"], 0, "{}", log.body);
    let one = s
        .get(
            &format!(
                "{evil_p}/webhook-deliveries/{}",
                d["delivery_id"].as_str().unwrap()
            ),
            &evil,
        )
        .await;
    one.assert_error(404);
    let r = s
        .get(&format!("{evil_p}/repositories/{evil_link}"), &evil)
        .await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    // A runner of theirs finds nothing to claim.
    let r = s
        .post(&format!("{evil_p}/test-runs/claim"), &evil, json!({}))
        .await;
    assert_eq!(r.status, 204, "{}", r.body);
}

each_backend!(an_unbound_installation_is_skipped_until_a_superuser_binds_it);
/// With several organizations an installation seen for the first time is bound to none: its
/// deliveries are skipped `installation_unbound` until a superuser binds it; a rebind moves
/// its deliveries and leaves the old organization's links `disconnected`.
async fn an_unbound_installation_is_skipped_until_a_superuser_binds_it() {
    let s = webhook_server().await;
    let (other, other_p) = other_tenant(&s, "acme").await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(inst.body["items"][0]["organization"], Value::Null);
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa1", false)).await;
    skipped(&d, "installation_unbound");
    assert_eq!(d["project"], Value::Null);
    let l = s
        .get(
            &format!("{SCM}/deliveries?reason=installation_unbound"),
            s.key(),
        )
        .await;
    assert_eq!(l.body["total"], 1, "{}", l.body);

    let bind = format!("{SCM}/installations/{INST}/organization");
    // Only a superuser binds; an unknown organization is 404, a malformed slug 422.
    s.send(
        reqwest::Method::PUT,
        &bind,
        Some(&other),
        Some(json!({"organization": "acme"})),
    )
    .await
    .assert_error(403);
    s.send(
        reqwest::Method::PUT,
        &bind,
        Some(s.key()),
        Some(json!({"organization": "nobody"})),
    )
    .await
    .assert_error(404);
    s.send(
        reqwest::Method::PUT,
        &bind,
        Some(s.key()),
        Some(json!({"organization": "Not A Slug"})),
    )
    .await
    .assert_error(422);
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["id"].as_u64(), r.body["organization"].as_str()),
        (Some(INST), Some("default"))
    );
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "connected", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa2", false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");

    // Moved to `acme`: `default`'s link turns disconnected, and deliveries resolve in `acme`,
    // which links nothing yet.
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "acme"})),
        )
        .await;
    assert_eq!(r.body["organization"], "acme", "{}", r.body);
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(
        (r.body["state"].as_str(), &r.body["installation_id"]),
        (Some("disconnected"), &Value::Null),
        "{}",
        r.body
    );
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa3", false)).await;
    skipped(&d, "repository_not_linked");
    let r = s
        .post(
            &format!("{other_p}/repositories"),
            &other,
            json!({"full_name": REPO}),
        )
        .await;
    assert_eq!(r.body["state"], "connected", "{}", r.body);
    // The same commit as `default`'s run: a run of `acme`'s own, not a duplicate job.
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa2", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["project"].as_str()),
        (Some("dispatched"), Some("p")),
        "{d}"
    );
    assert_eq!(runs(&s, "").await["total"], 1, "default keeps its one run");
    // Moved back: `default`'s run of that commit still holds its key there, though `acme`'s
    // run took the key's index entry meanwhile.
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa2", false)).await;
    skipped(&d, "duplicate_job");
    assert_eq!(runs(&s, "").await["total"], 1, "no second run of one key");
}

each_backend!(an_installation_bound_before_its_first_delivery_resolves_there);
/// An installation the service never saw can be bound ahead of its first delivery; that
/// delivery, naming a repository no installation was known to hold, makes the installation
/// its holder, so the link that took it shows `connected`.
async fn an_installation_bound_before_its_first_delivery_resolves_there() {
    let s = webhook_server().await;
    other_tenant(&s, "acme").await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let r = s
        .send(
            reqwest::Method::PUT,
            &format!("{SCM}/installations/{INST}/organization"),
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "active");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 3, "ccc1", false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(
        (&r.body["state"], &r.body["installation_id"]),
        (&json!("connected"), &json!(INST)),
        "{}",
        r.body
    );
    s.send(
        reqwest::Method::PUT,
        &format!("{SCM}/installations/abc/organization"),
        Some(s.key()),
        Some(json!({"organization": "default"})),
    )
    .await
    .assert_error(404);
}

each_backend!(deleting_an_organization_unbinds_its_installation_and_frees_its_repositories);
/// Deleting the organization an installation is bound to unbinds it at once (its deliveries
/// are skipped `installation_unbound`), and once the purge is done its repository links are
/// gone, so another organization links the repository and, bound there, receives its runs.
async fn deleting_an_organization_unbinds_its_installation_and_frees_its_repositories() {
    let s = webhook_server().await;
    let (acme, acme_p) = other_tenant(&s, "acme").await;
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let bind = format!("{SCM}/installations/{INST}/organization");
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "acme"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .post(
            &format!("{acme_p}/repositories"),
            &acme,
            json!({"full_name": REPO}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "ddd1", false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");

    let r = s.delete("/api/v1/organizations/acme", &acme).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(
        inst.body["items"][0]["organization"],
        Value::Null,
        "{}",
        inst.body
    );
    let d = run(&s, "pull_request", &pr("opened", 1, "ddd2", false)).await;
    skipped(&d, "installation_unbound");

    let rt = s.rt();
    assert!(eventually(20, || async { rt.directory.purging().unwrap().is_empty() }).await);
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "connected", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "ddd3", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["project"].as_str()),
        (Some("dispatched"), Some("default")),
        "{d}"
    );
}

each_backend!(a_delivery_naming_no_installation_and_held_by_none_is_not_linked_anywhere);
/// A delivery that names no installation, for a repository no installation holds, on a
/// service with several organizations resolves nowhere: skipped `repository_not_linked`
/// (there is no installation to be unbound), even though an organization links the name.
async fn a_delivery_naming_no_installation_and_held_by_none_is_not_linked_anywhere() {
    let s = webhook_server().await;
    other_tenant(&s, "acme").await;
    link(&s, REPO).await;
    let mut p = pr("opened", 1, "eee1", false);
    p.as_object_mut().unwrap().remove("installation");
    let d = run(&s, "pull_request", &p).await;
    skipped(&d, "repository_not_linked");
    assert_eq!(d["project"], Value::Null);
}
