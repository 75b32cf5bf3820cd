//! Health, metrics and the OpenAPI document.

use reqwest::Method;

use crate::common::*;

#[tokio::test]
async fn healthz_metrics_openapi() {
    let s = start().await;
    let r = s.send(Method::GET, "/healthz", None, None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, serde_json::json!({"status": "ok"}));

    s.get(&format!("{DEV}/devices"), s.key()).await;
    let text = s
        .http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("fleetops_http_requests_total{"), "{text}");
    assert!(
        text.contains("route=\"/api/v1/organizations/{org}/projects/{project}/devices\""),
        "{text}"
    );
    assert!(text.contains("fleetops_actor_restarts"), "{text}");

    let r = s
        .send(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["openapi"], "3.1.0");
    let paths = r.body["paths"].as_object().unwrap();
    for (p, m) in [
        ("/api/v1/auth/login", "post"),
        ("/api/v1/auth/api-keys/{key_id}", "delete"),
        (
            "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}",
            "get",
        ),
        (
            "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}/heartbeat",
            "post",
        ),
        ("/api/v1/organizations/{org}/devices", "get"),
        ("/healthz", "get"),
    ] {
        assert!(
            paths.get(p).and_then(|x| x.get(m)).is_some(),
            "{m} {p} missing"
        );
    }
}

#[tokio::test]
async fn metrics_token_when_configured() {
    let s = start_with(|c| c.http.metrics_token = "scrape-me".into()).await;
    let r = s.send(Method::GET, "/metrics", None, None).await;
    r.assert_error(401);
    let r = s
        .raw(s.http.get(s.url("/metrics")).bearer_auth("scrape-me"))
        .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn metrics_prometheus_text_unless_openmetrics_is_asked_for() {
    let s = start().await;
    s.get(&format!("{DEV}/devices"), s.key()).await;
    let r = s.http.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains("# TYPE fleetops_http_requests_total counter\n"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");

    // What Prometheus itself sends.
    let r = s
        .http
        .get(s.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains("# TYPE fleetops_http_requests counter\n"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}
