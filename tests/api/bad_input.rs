//! Malformed and hostile input: each gets the contract's envelope and status, never a 500.

use reqwest::Method;
use serde_json::json;

use crate::common::*;

each_backend!(malformed_bodies_types_sizes_routes_and_methods);
async fn malformed_bodies_types_sizes_routes_and_methods() {
    let s = start().await;
    let k = s.key();
    let url = s.url(&format!("{DEV}/devices"));

    // Malformed JSON: 400.
    for body in ["{", "", "not json", "{\"name\": }", "[1,"] {
        let r = s
            .raw(
                s.http
                    .post(&url)
                    .bearer_auth(k)
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await;
        assert!(r.assert_error(400).starts_with("Malformed JSON"), "{body}");
    }
    // Invalid UTF-8: 400.
    let r = s
        .raw(
            s.http
                .post(&url)
                .bearer_auth(k)
                .body(vec![b'"', 0xff, 0xfe, b'"']),
        )
        .await;
    r.assert_error(400);
    // Wrong types and missing fields: 422 naming the field.
    let r = s
        .post(&format!("{DEV}/devices"), k, json!({"name": 7}))
        .await;
    assert!(r.assert_error(422).contains("name"));
    let r = s
        .post(&format!("{DEV}/devices"), k, json!({"labels": {}}))
        .await;
    assert!(r.assert_error(422).contains("name"));
    let r = s
        .post(
            &format!("{DEV}/devices"),
            k,
            json!({"name": "x", "labels": {"a": 1}}),
        )
        .await;
    assert!(r.assert_error(422).contains("labels"));
    let r = s.post(&format!("{DEV}/devices"), k, json!([1, 2])).await;
    r.assert_error(422);
    // Unknown enum value: 422.
    let r = s
        .post(
            "/api/v1/organizations/default/members",
            k,
            json!({"email": "admin@localhost", "role": "king"}),
        )
        .await;
    assert!(r.assert_error(422).contains("role"));
    // Oversized body: 413, with and without a declared length.
    let big = format!("{{\"name\": \"{}\"}}", "x".repeat(2 * 1024 * 1024));
    let r = s
        .raw(s.http.post(&url).bearer_auth(k).body(big.clone()))
        .await;
    r.assert_error(413);
    let stream = futures_body(big.into_bytes());
    let r = s.raw(s.http.post(&url).bearer_auth(k).body(stream)).await;
    r.assert_error(413);
    // Unknown route: 404; wrong method: 405 with Allow.
    let r = s.get("/api/v1/nothing-here", k).await;
    r.assert_error(404);
    let r = s
        .send(Method::PUT, &format!("{DEV}/devices"), Some(k), None)
        .await;
    r.assert_error(405);
    let allow = r.header("allow").unwrap();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    // Percent-encoded garbage in the path.
    let r = s.get(&format!("{DEV}/devices/%FF"), k).await;
    assert!(r.status == 400 || r.status == 404, "{}", r.status);
    // Nothing above was stored.
    assert_eq!(s.get(&format!("{DEV}/devices"), k).await.body["total"], 0);
    // And the server is still fine.
    assert_eq!(
        s.send(Method::GET, "/healthz", None, None).await.status,
        200
    );
}

each_backend!(order_of_checks_401_then_403_then_404_then_413_then_422);
async fn order_of_checks_401_then_403_then_404_then_413_then_422() {
    let s = start().await;
    let viewer = s.user("v@x.io").await;
    s.post(
        "/api/v1/organizations/default/members",
        s.key(),
        json!({"email": "v@x.io", "role": "viewer"}),
    )
    .await;
    let big = "x".repeat(2 * 1024 * 1024);
    let url = s.url(&format!("{DEV}/devices"));
    // No credentials with a huge malformed body: 401.
    s.raw(s.http.post(&url).body(big.clone()))
        .await
        .assert_error(401);
    // A viewer writing with a huge body: 403.
    s.raw(s.http.post(&url).bearer_auth(&viewer).body(big.clone()))
        .await
        .assert_error(403);
    // A missing project with a huge body: 404.
    let missing = s.url("/api/v1/organizations/default/projects/nope/devices");
    s.raw(s.http.post(&missing).bearer_auth(s.key()).body(big.clone()))
        .await
        .assert_error(404);
    // A missing device on patch with a bad body: 404.
    s.raw(
        s.http
            .patch(s.url(&format!("{DEV}/devices/4242")))
            .bearer_auth(s.key())
            .body("{"),
    )
    .await
    .assert_error(404);
    // Then 413 before parsing, then 400, then 422.
    s.raw(s.http.post(&url).bearer_auth(s.key()).body(big))
        .await
        .assert_error(413);
    s.raw(s.http.post(&url).bearer_auth(s.key()).body("{"))
        .await
        .assert_error(400);
    s.post(&format!("{DEV}/devices"), s.key(), json!({}))
        .await
        .assert_error(422);
}

fn futures_body(bytes: Vec<u8>) -> reqwest::Body {
    // A body without Content-Length, sent in chunks.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(futures_util_stream(chunks))
}

fn futures_util_stream(
    chunks: Vec<Result<Vec<u8>, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    futures::stream::iter(chunks)
}

each_backend!(per_entity_maxima_are_422);
/// Documented maxima per entity: tags per session, devices per group, references per rule,
/// labels per device; past them 422 naming the field and the bound, and nothing written.
async fn per_entity_maxima_are_422() {
    let s = start().await;
    let (d, tok) = crate::sessions::device(&s, "r").await;
    let tags: Vec<String> = (0..65).map(|i| format!("t{i}")).collect();
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            &tok,
            json!({"device_id": d, "tags": tags}),
        )
        .await;
    assert!(r.assert_error(422).contains("at most 64"), "{}", r.body);
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            &tok,
            json!({"device_id": d, "tags": &tags[..64]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let sid = r.body["id"].as_u64().unwrap();
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/tags"),
            s.key(),
            json!({"tag": "one-more"}),
        )
        .await;
    assert!(r.assert_error(422).contains("at most 64"), "{}", r.body);
    // Re-adding a tag it has is fine.
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/tags"),
            s.key(),
            json!({"tag": "t1"}),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);

    let ids: Vec<u64> = (1..=10_001).collect();
    let r = s
        .post(
            &format!("{DEV}/device-groups"),
            s.key(),
            json!({"name": "g", "device_ids": ids}),
        )
        .await;
    assert!(r.assert_error(422).contains("at most 10000"), "{}", r.body);
    let refs: Vec<u64> = (1..=101).collect();
    let r = s
        .post(
            "/api/v1/organizations/default/projects/default/alert-rules",
            s.key(),
            json!({"name": "r", "severity": "info", "integration_ids": refs,
                   "condition": {"type": "deployment_status", "status": "failed"}}),
        )
        .await;
    assert!(r.assert_error(422).contains("at most 20"), "{}", r.body);
    let labels: serde_json::Map<String, serde_json::Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let r = s
        .post(
            &format!("{DEV}/devices"),
            s.key(),
            json!({"name": "l", "labels": labels}),
        )
        .await;
    assert!(r.assert_error(422).contains("at most 64"), "{}", r.body);
}

each_backend!(bodies_are_objects_and_whole_floats_are_integers);
/// A body that must be an object is 422 as an array (serde would read a struct from one), and
/// a whole number written `1.0` is that integer, as the document's `integer` says.
async fn bodies_are_objects_and_whole_floats_are_integers() {
    let s = start().await;
    let k = s.key();
    let r = s
        .post(&format!("{DEV}/devices"), k, json!(["robot", {}]))
        .await;
    assert!(r.assert_error(422).contains("JSON object"), "{}", r.body);
    let (d, _) = crate::sessions::device(&s, "r").await;
    let r = s
        .patch(&format!("{DEV}/devices/{d}"), k, json!([null, null]))
        .await;
    r.assert_error(422);
    let r = s
        .raw(
            s.http
                .post(s.url(&format!("{DEV}/sessions")))
                .bearer_auth(k)
                .header("content-type", "application/json")
                .body(format!(r#"{{"device_id": {d}.0, "tags": ["x"]}}"#)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["device_id"], d);
    // 1.5 is not an id, and neither is a whole number past 64 bits.
    for bad in [format!("{d}.5"), "1e20".to_string(), "-1.0".to_string()] {
        let r = s
            .raw(
                s.http
                    .post(s.url(&format!("{DEV}/sessions")))
                    .bearer_auth(k)
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"device_id": {bad}}}"#)),
            )
            .await;
        assert!(
            r.assert_error(422).contains("device_id"),
            "{bad}: {}",
            r.body
        );
    }
}

each_backend!(formats_are_the_documented_ones);
/// The formats the document states are the ones enforced: lengths count characters on what
/// was sent, and an e-mail address with whitespace anywhere is refused.
async fn formats_are_the_documented_ones() {
    let s = start().await;
    let k = s.key();
    // 200 characters of two bytes each is a name; 201, or 200 after a leading space, is not.
    let ok = "é".repeat(200);
    let r = s
        .post(&format!("{DEV}/devices"), k, json!({"name": ok}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    for bad in [
        "é".repeat(201),
        format!(" {}", "é".repeat(200)),
        " \u{3000} ".into(),
    ] {
        let r = s
            .post(&format!("{DEV}/devices"), k, json!({"name": bad}))
            .await;
        assert!(r.assert_error(422).contains("name"), "{}", r.body);
    }
    for bad in [
        " ops@example.com",
        "ops@example.com ",
        "ops@.example.com",
        "ops@example.",
    ] {
        let r = s
            .post(
                "/api/v1/users",
                k,
                json!({"email": bad, "password": "pw-123456"}),
            )
            .await;
        assert!(r.assert_error(422).contains("email"), "{bad}: {}", r.body);
    }
    let r = s
        .post(
            "/api/v1/users",
            k,
            json!({"email": "Ops@Example.COM", "password": "é".repeat(1024)}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["email"], "ops@example.com");
}
