/// Each type's config schema takes what the parser takes (for public targets) and refuses
/// what it refuses, on examples of every field.
#[test]
fn config_schemas_agree_with_the_parser() {
    use serde_json::json;
    let cases: Vec<(&str, Value)> = vec![
        (
            "chat",
            json!({"webhook_url": "https://chat.example.com/hook"}),
        ),
        (
            "chat",
            json!({"webhook_url": "https://chat.example.com/hook", "channel": "#ops"}),
        ),
        (
            "chat",
            json!({"webhook_url": "ftp://chat.example.com/hook"}),
        ),
        (
            "chat",
            json!({"webhook_url": "https://chat.example.com/hook", "extra": 1}),
        ),
        ("chat", json!({"channel": "#ops"})),
        (
            "chat",
            json!({"webhook_url": format!("https://example.com/{}", "a".repeat(2100))}),
        ),
        ("incident", json!({"integration_key": "k-123"})),
        ("incident", json!({"integration_key": " "})),
        (
            "incident",
            json!({"integration_key": "k", "severity_mapping": {"critical": "error"}}),
        ),
        (
            "incident",
            json!({"integration_key": "k", "severity_mapping": {"major": "error"}}),
        ),
        (
            "incident",
            json!({"integration_key": "k", "severity_mapping": {"info": "low"}}),
        ),
        (
            "email",
            json!({"recipients": ["ops@example.com"], "subject_prefix": "[fleet]"}),
        ),
        ("email", json!({"recipients": []})),
        (
            "email",
            json!({"recipients": ["ops@example.com"], "subject_prefix": "a\nb"}),
        ),
        (
            "email",
            json!({"recipients": ["ops@example.com"], "subject_prefix": "é".repeat(200)}),
        ),
        (
            "email",
            json!({"recipients": ["ops@example.com"], "subject_prefix": "é".repeat(201)}),
        ),
        (
            "webhook",
            json!({"url": "https://hooks.example.com/x", "signing_secret": "s3cret"}),
        ),
        (
            "webhook",
            json!({"url": "https://hooks.example.com/x", "signing_secret": "s", "method": "put"}),
        ),
        (
            "webhook",
            json!({"url": "https://hooks.example.com/x", "signing_secret": "s", "method": "GET"}),
        ),
        (
            "webhook",
            json!({"url": "https://hooks.example.com/x", "signing_secret": ""}),
        ),
        ("webhook", json!({"url": "https://hooks.example.com/x"})),
    ];
    let schemas = config_schemas();
    for (kind, config) in cases {
        let schema = &schemas.iter().find(|(k, _)| *k == kind).unwrap().1;
        let v = jsonschema::validator_for(schema).unwrap();
        let t = IntegrationType::parse(kind).unwrap();
        assert_eq!(
            v.is_valid(&config),
            IntegrationConfig::parse(t, &config, false).is_ok(),
            "{kind} {config}"
        );
    }
}

use super::*;

fn msg(event: AlertEvent) -> AlertMessage {
    AlertMessage {
        event,
        alert_id: Some(7),
        rule_id: Some(3),
        rule_name: "hot".into(),
        severity: Severity::Warning,
        project: "default".into(),
        device_id: Some(1),
        device_name: Some("r1".into()),
        summary: "cpu > 0.9 on r1".into(),
        fired_at: 1_700_000_000_000,
        resolved_at: None,
        dedup_key: "fleetops-7".into(),
        related_deployment: None,
    }
}

#[test]
fn configs_validate_split_and_mask() {
    let c = IntegrationConfig::parse(
        IntegrationType::Webhook,
        &json!({"url": "https://example.com/h", "method": "put", "signing_secret": "whsec_c2VjcmV0"}),
        false,
    )
    .unwrap();
    let (public, secret) = c.split();
    assert_eq!(
        public,
        json!({"url": "https://example.com/h", "method": "PUT"})
    );
    assert_eq!(secret.as_deref(), Some("whsec_c2VjcmV0"));
    for (kind, bad) in [
        (
            IntegrationType::Webhook,
            json!({"url": "https://e.com", "method": "GET", "signing_secret": "x"}),
        ),
        (IntegrationType::Webhook, json!({"url": "https://e.com"})),
        (
            IntegrationType::Webhook,
            json!({"url": "https://e.com", "signing_secret": "whsec_!!"}),
        ),
        (IntegrationType::Chat, json!({"webhook_url": "not a url"})),
        (
            IntegrationType::Chat,
            json!({"webhook_url": "http://127.0.0.1/x"}),
        ),
        (IntegrationType::Email, json!({"recipients": ["nope"]})),
        (IntegrationType::Email, json!({"recipients": []})),
        (
            IntegrationType::Incident,
            json!({"integration_key": "k", "severity_mapping": {"critical": "huge"}}),
        ),
        (
            IntegrationType::Incident,
            json!({"integration_key": "k", "severity_mapping": {"urgent": "info"}}),
        ),
        (
            IntegrationType::Chat,
            json!({"webhook_url": "https://e.com", "other": 1}),
        ),
    ] {
        assert!(
            IntegrationConfig::parse(kind, &bad, false).is_err(),
            "{bad}"
        );
    }
    assert_eq!(
        mask(
            IntegrationType::Chat,
            "https://hooks.slack.com/services/T/B/X"
        ),
        "https://hooks.slack.com/****"
    );
    assert_eq!(
        mask(IntegrationType::Incident, "0123456789abcdef0123"),
        "****0123"
    );
    assert_eq!(mask(IntegrationType::Webhook, "short"), "****");
}

#[test]
fn webhook_signatures_follow_both_schemes() {
    let cfg = IntegrationConfig::Webhook {
        url: "https://e.com/h".into(),
        method: "POST".into(),
        signing_secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
    };
    let Outbound::Http { headers, body, .. } =
        render(&cfg, &msg(AlertEvent::Firing), "", "msg_1", 1_614_265_330)
    else {
        panic!("http")
    };
    let h = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(h("x-fleetops-event"), "alert.firing");
    let key = base64::engine::general_purpose::STANDARD
        .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .unwrap();
    let want = hmac256(&key, &[b"msg_1.1614265330.", &body]);
    assert_eq!(
        h("webhook-signature"),
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(want)
        )
    );
    let own = hmac256(b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", &[&body]);
    assert_eq!(
        h("x-fleetops-signature-256"),
        format!("sha256={}", hex::encode(own))
    );
}

#[test]
fn pagerduty_pairs_trigger_and_resolve() {
    let cfg = IntegrationConfig::Incident {
        integration_key: "rk".into(),
        severity_mapping: BTreeMap::from([("warning".into(), "error".into())]),
        service_id: None,
    };
    let body = |e| match render(&cfg, &msg(e), "https://pd/enqueue", "d", 0) {
        Outbound::Http { body, url, .. } => {
            assert_eq!(url, "https://pd/enqueue");
            serde_json::from_slice::<Value>(&body).unwrap()
        }
        Outbound::Mail { .. } => panic!("http"),
    };
    let t = body(AlertEvent::Firing);
    assert_eq!(t["event_action"], "trigger");
    assert_eq!(t["payload"]["severity"], "error");
    let r = body(AlertEvent::Resolved);
    assert_eq!(
        (r["event_action"].clone(), r["dedup_key"].clone()),
        (json!("resolve"), t["dedup_key"].clone())
    );
}
