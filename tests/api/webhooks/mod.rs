//! The inbound webhook through the real server, with the host's real payloads (copied from the
//! host's documentation into tests/payloads) re-signed here: signature and intake rules, every
//! host event the service handles and every reason code, idempotency, attempts, cancellation,
//! branch and draft policy, runners, rotation, and 500 concurrent deliveries.

use serde_json::{Value, json};

use crate::common::*;

mod events;
mod intake;
mod queue;
mod runs;
mod tenancy;

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

/// A webhook server with `REPO` linked to the default project and held by installation
/// `INST` (created through the host's real `installation.created` payload); the link's id.
async fn installed() -> (Srv, u64) {
    let s = webhook_server().await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    (s, rid)
}
