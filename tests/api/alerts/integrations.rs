//! Integrations: secrets masked, merged by patches and encrypted at rest, special-purpose and
//! loopback targets refused, configs validated per type, and the test endpoint sending each
//! wire format once.

use serde_json::{Value, json};

use super::*;
use crate::peers::{Reply, Sink, Smtp, verify_standard_webhook};

each_backend!(integrations_mask_secrets_merge_patches_and_encrypt_at_rest);
async fn integrations_mask_secrets_merge_patches_and_encrypt_at_rest() {
    let s = server().await;
    let secret_url = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX";
    let chat = create(
        &s,
        json!({"type": "chat", "name": "ops", "config": {"webhook_url": secret_url, "channel": "#ops"}}),
    )
    .await;
    assert_eq!(chat["type"], "chat");
    assert_eq!(chat["enabled"], true);
    assert_eq!(
        chat["config"],
        json!({"webhook_url": "https://hooks.slack.com/****", "channel": "#ops"})
    );
    // An optional string left out is shown as null.
    let bare = create(
        &s,
        json!({"type": "chat", "name": "bare", "config": {"webhook_url": secret_url}}),
    )
    .await;
    assert_eq!(bare["config"]["channel"], Value::Null);
    assert!(bare["config"].as_object().unwrap().contains_key("channel"));
    s.delete(&format!("{INTEGRATIONS}/{}", bare["id"]), s.key())
        .await;
    let key = "R0UTINGKEY0123456789abcdefXYZW";
    let pd = create(
        &s,
        json!({"type": "incident", "name": "pager", "enabled": false,
               "config": {"integration_key": key, "service_id": "PX1",
                          "severity_mapping": {"critical": "critical", "warning": "error"}}}),
    )
    .await;
    assert_eq!(pd["enabled"], false);
    assert_eq!(pd["config"]["integration_key"], "****XYZW");
    assert_eq!(pd["config"]["service_id"], "PX1");

    // The list shows channel and service_id, secrets masked.
    let l = s.get(INTEGRATIONS, s.key()).await;
    assert_eq!(l.status, 200);
    let items = l.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], pd["id"], "newest first");
    assert_eq!(items[1]["config"]["channel"], "#ops");
    assert!(!l.body.to_string().contains("XXXXSECRETXXXX"));
    assert!(!l.body.to_string().contains("R0UTINGKEY"));

    // PATCH: the mask keeps the secret, other keys merge, a null removes an optional key.
    let r = s
        .patch(
            &format!("{INTEGRATIONS}/{}", pd["id"]),
            s.key(),
            json!({"name": "pager2", "config": {"integration_key": "****XYZW", "service_id": null}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["name"], "pager2");
    assert_eq!(r.body["config"]["integration_key"], "****XYZW");
    assert_eq!(r.body["config"]["service_id"], Value::Null, "{}", r.body);
    assert_eq!(r.body["config"]["severity_mapping"]["warning"], "error");
    // The type cannot change (repeating it is fine).
    s.patch(
        &format!("{INTEGRATIONS}/{}", pd["id"]),
        s.key(),
        json!({"type": "chat"}),
    )
    .await
    .assert_error(422);
    let r = s
        .patch(
            &format!("{INTEGRATIONS}/{}", pd["id"]),
            s.key(),
            json!({"type": "incident", "enabled": true}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["enabled"].clone()),
        (200, json!(true))
    );
    // A new secret replaces the old one.
    let r = s
        .patch(
            &format!("{INTEGRATIONS}/{}", pd["id"]),
            s.key(),
            json!({"config": {"integration_key": "ANOTHERKEY0123456789abcdLMNO"}}),
        )
        .await;
    assert_eq!(r.body["config"]["integration_key"], "****LMNO");

    // Secrets are encrypted at rest, and survive a restart.
    let dir = s._dir.path().join("data");
    let s = s.restart().await;
    let mut all = data_bytes(&dir);
    all.extend(crate::common::database_bytes(s._dir.path()));
    for secret in ["XXXXSECRETXXXX", "ANOTHERKEY0123456789", "R0UTINGKEY"] {
        assert!(
            !all.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} is stored in the clear"
        );
    }
    let r = s
        .get(&format!("{INTEGRATIONS}/{}", chat["id"]), s.key())
        .await;
    assert_eq!(
        r.body["config"]["webhook_url"],
        "https://hooks.slack.com/****"
    );

    // Delete: 204, then 404.
    let r = s
        .delete(&format!("{INTEGRATIONS}/{}", chat["id"]), s.key())
        .await;
    assert_eq!(r.status, 204);
    s.get(&format!("{INTEGRATIONS}/{}", chat["id"]), s.key())
        .await
        .assert_error(404);
}

each_backend!(special_purpose_addresses_are_refused_as_targets);
/// Every range of IANA's special-purpose registries is refused as a target, as private
/// networks are: documentation, benchmarking, protocol assignments, reserved, multicast and
/// the IPv4-translated form.
async fn special_purpose_addresses_are_refused_as_targets() {
    let s = start().await;
    for host in [
        "192.0.0.8",
        "192.0.2.1",
        "198.18.0.1",
        "198.51.100.1",
        "203.0.113.1",
        "240.0.0.1",
        "224.0.0.251",
        "[ff02::1]",
        "[2001:db8::1]",
        "[2001::1]",
        "[::ffff:0:7f00:1]",
        "[::ffff:0:808:808]",
    ] {
        let r = s
            .post(
                INTEGRATIONS,
                s.key(),
                json!({"type": "webhook", "name": "x", "config": {"url": format!("http://{host}/h"), "signing_secret": "s"}}),
            )
            .await;
        let detail = r.assert_error(422);
        assert!(
            detail.contains("special-purpose address"),
            "{host}: {detail}"
        );
    }
    // A public address is fine.
    let r = s
        .post(
            INTEGRATIONS,
            s.key(),
            json!({"type": "webhook", "name": "x", "config": {"url": "http://8.8.8.8/h", "signing_secret": "s"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
}

each_backend!(integration_configs_are_validated_per_type);
async fn integration_configs_are_validated_per_type() {
    let s = start().await;
    for body in [
        json!({"type": "pager", "name": "x", "config": {}}),
        json!({"type": "chat", "name": "x", "config": {"webhook_url": "not a url"}}),
        json!({"type": "chat", "name": "x", "config": {"webhook_url": "ftp://example.com/x"}}),
        json!({"type": "chat", "name": "", "config": {"webhook_url": "https://example.com/x"}}),
        json!({"type": "email", "name": "x", "config": {"recipients": ["not-an-address"]}}),
        json!({"type": "email", "name": "x", "config": {"recipients": "ops@example.com"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "https://example.com/h", "method": "GET", "signing_secret": "s"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "https://example.com/h"}}),
        json!({"type": "incident", "name": "x", "config": {"integration_key": "k", "severity_mapping": {"critical": "sev1"}}}),
        json!({"type": "chat", "name": "x", "config": "https://example.com"}),
        // Private and loopback targets, when not allowed.
        json!({"type": "chat", "name": "x", "config": {"webhook_url": "http://localhost:9/x"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "http://10.0.0.8/h", "signing_secret": "s"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "http://[::ffff:127.0.0.1]/h", "signing_secret": "s"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "http://169.254.169.254/latest", "signing_secret": "s"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "http://100.64.1.1/h", "signing_secret": "s"}}),
        // NAT64 and 6to4 forms of private IPv4 addresses.
        json!({"type": "webhook", "name": "x", "config": {"url": "http://[64:ff9b::a9fe:a9fe]/h", "signing_secret": "s"}}),
        json!({"type": "webhook", "name": "x", "config": {"url": "http://[2002:a00:1::1]/h", "signing_secret": "s"}}),
    ] {
        let r = s.post(INTEGRATIONS, s.key(), body.clone()).await;
        r.assert_error(422);
        assert!(
            s.get(INTEGRATIONS, s.key()).await.body["items"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }
    // A patch to a private target is refused too, and changes nothing.
    let w = create(
        &s,
        json!({"type": "webhook", "name": "w", "config": {"url": "https://example.com/h", "signing_secret": "s"}}),
    )
    .await;
    assert_eq!(w["config"]["method"], "POST", "the default method");
    s.patch(
        &format!("{INTEGRATIONS}/{}", w["id"]),
        s.key(),
        json!({"config": {"url": "http://127.0.0.1:8080/h"}}),
    )
    .await
    .assert_error(422);
    let r = s.get(&format!("{INTEGRATIONS}/{}", w["id"]), s.key()).await;
    assert_eq!(r.body["config"]["url"], "https://example.com/h");
}

each_backend!(the_test_endpoint_sends_each_wire_format_once);
async fn the_test_endpoint_sends_each_wire_format_once() {
    let sink = Sink::start().await;
    let mut smtp = Smtp::start().await;
    let pd_url = sink.url("/v2/enqueue");
    let port = smtp.port;
    let s = start_with(move |c| {
        c.alerts.allow_private_targets = true;
        c.alerts.request_timeout_seconds = 1;
        c.alerts.pagerduty_events_url = pd_url;
        c.smtp.host = "127.0.0.1".into();
        c.smtp.port = port;
        c.smtp.from = "fleetops@example.com".into();
    })
    .await;

    // Chat: Slack incoming-webhook JSON.
    let chat = create(
        &s,
        json!({"type": "chat", "name": "c", "config": {"webhook_url": sink.url("/slack/T/B/X")}}),
    )
    .await;
    let r = test_send(&s, &chat["id"]).await;
    assert_eq!(r["success"], true, "{r}");
    let got = sink.wait_for(1).await;
    assert_eq!(
        (got[0].method.as_str(), got[0].path.as_str()),
        ("POST", "/slack/T/B/X")
    );
    assert!(
        got[0].json()["text"].as_str().unwrap().contains("TEST"),
        "{}",
        got[0].json()
    );

    // Incident: PagerDuty Events API v2 with the mapped severity.
    let pd = create(
        &s,
        json!({"type": "incident", "name": "p", "config": {"integration_key": "rk-0123456789",
               "severity_mapping": {"info": "warning"}}}),
    )
    .await;
    assert_eq!(test_send(&s, &pd["id"]).await["success"], true);
    let got = sink.wait_for(2).await;
    let b = got[1].json();
    assert_eq!(got[1].path, "/v2/enqueue");
    assert_eq!(b["routing_key"], "rk-0123456789");
    assert_eq!(b["event_action"], "trigger");
    assert_eq!(b["payload"]["severity"], "warning");
    assert!(b["dedup_key"].as_str().unwrap().starts_with("fleetops-"));
    for f in ["summary", "source", "timestamp", "custom_details"] {
        assert!(!b["payload"][f].is_null(), "{f}: {b}");
    }

    // Webhook: both signatures, checked with the reference library and by hand.
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let wh = create(
        &s,
        json!({"type": "webhook", "name": "w", "config": {"url": sink.url("/hook"), "method": "PUT", "signing_secret": secret}}),
    )
    .await;
    assert_eq!(wh["config"]["signing_secret"], "****LaSw");
    assert_eq!(test_send(&s, &wh["id"]).await["success"], true);
    let got = sink.wait_for(3).await;
    let req = &got[2];
    assert_eq!(req.method, "PUT");
    assert_eq!(req.header("x-fleetops-event"), Some("alert.test"));
    assert_eq!(req.header("webhook-id"), req.header("x-fleetops-delivery"));
    uuid::Uuid::parse_str(req.header("webhook-id").unwrap()).unwrap();
    verify_standard_webhook(secret, req);
    assert_eq!(
        req.header("x-fleetops-signature-256").unwrap(),
        crate::webhooks::sign(secret, &req.body)
    );
    assert_eq!(req.json()["event"], "alert.test");

    // E-mail through the real SMTP server.
    let mail = create(
        &s,
        json!({"type": "email", "name": "m", "config": {"recipients": ["ops@example.com", "oncall@example.com"], "subject_prefix": "[fleet] "}}),
    )
    .await;
    let r = test_send(&s, &mail["id"]).await;
    assert_eq!(r["success"], true, "{r}");
    let m = smtp.next().await;
    assert_eq!(m["mail_from"], "fleetops@example.com");
    assert_eq!(
        m["rcpt_tos"],
        json!(["ops@example.com", "oncall@example.com"])
    );
    assert!(
        m["data"]
            .as_str()
            .unwrap()
            .contains("Subject: [fleet] Test alert"),
        "{m}"
    );

    // A refusal, a 5xx and a timeout: success false with the reason, one attempt each.
    sink.script([
        Reply::Status(404, vec![]),
        Reply::Status(503, vec![]),
        Reply::Hang,
    ]);
    let before = sink.count();
    for want in ["HTTP 404", "HTTP 503", "timed out"] {
        let r = test_send(&s, &chat["id"]).await;
        assert_eq!(r["success"], false, "{r}");
        assert!(r["message"].as_str().unwrap().contains(want), "{want}: {r}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        sink.count(),
        before + 3,
        "no retries from the test endpoint"
    );
}

each_backend!(a_name_resolving_to_loopback_is_refused_at_send_time);
async fn a_name_resolving_to_loopback_is_refused_at_send_time() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        c.alerts
            .hosts
            .insert("hooks.example.test".into(), "127.0.0.1".parse().unwrap());
    })
    .await;
    // Not an address and not localhost: accepted at create.
    let w = create(
        &s,
        json!({"type": "webhook", "name": "w", "config": {
            "url": format!("http://hooks.example.test:{}/h", sink.addr.port()),
            "signing_secret": "s3cret"}}),
    )
    .await;
    let r = test_send(&s, &w["id"]).await;
    assert_eq!(r["success"], false, "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("resolves only to loopback, private or other special-purpose"),
        "{r}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(sink.count(), 0, "nothing reached the loopback address");
}
