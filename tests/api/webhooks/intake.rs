//! Signatures, delivery ids, body limits and the secret's rotation.

use serde_json::json;

use super::*;

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
