//! Tier limits with the three headers and 429; the login limiter per address.

use fleetops::config::TierFile;
use reqwest::Method;
use serde_json::json;

use crate::common::*;

each_backend!(headers_count_down_then_429_with_retry_after);
async fn headers_count_down_then_429_with_retry_after() {
    let s = start_with(|c| {
        c.tiers.insert(
            "free".into(),
            TierFile {
                requests_per_minute: Some(3),
                storage_bytes: None,
            },
        );
    })
    .await;
    let k = s.key();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for remaining in [2, 1, 0] {
        let r = s.get(&format!("{DEV}/devices"), k).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
        assert!(reset >= before && reset <= before + 61, "{reset}");
    }
    let r = s.get(&format!("{DEV}/devices"), k).await;
    let detail = r.assert_error(429).to_string();
    let retry = r.body["retry_after"].as_u64().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(
        detail,
        format!("Rate limit exceeded. Try again in {retry} seconds.")
    );
    assert_eq!(r.header("retry-after"), Some(retry.to_string().as_str()));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));

    // 401 comes before 429: bad credentials are not counted as this caller.
    s.get(&format!("{DEV}/devices"), "fops_bad")
        .await
        .assert_error(401);
    // Another credential has its own bucket.
    let jwt = s.login("admin@localhost", ADMIN_PASSWORD).await;
    let r = s.get(&format!("{DEV}/devices"), &jwt).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("2"));
    // Unauthenticated operational routes carry no rate-limit headers.
    let r = s.send(Method::GET, "/healthz", None, None).await;
    assert!(r.header("x-ratelimit-limit").is_none());
}

each_backend!(tier_of_the_organization_in_the_path_applies);
async fn tier_of_the_organization_in_the_path_applies() {
    let s = start_with(|c| {
        c.tiers.insert(
            "free".into(),
            TierFile {
                requests_per_minute: Some(2),
                storage_bytes: None,
            },
        );
        c.tiers.insert(
            "team".into(),
            TierFile {
                requests_per_minute: Some(5),
                storage_bytes: None,
            },
        );
    })
    .await;
    let k = s.key();
    let r = s
        .post(
            "/api/v1/organizations",
            k,
            json!({"slug": "big", "tier": "team"}),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = s.get("/api/v1/organizations/big/projects", k).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    let r = s.get("/api/v1/organizations/default/projects", k).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
}

each_backend!(login_is_limited_per_address);
async fn login_is_limited_per_address() {
    let s = start_with(|c| c.http.login_per_minute = 3).await;
    for _ in 0..3 {
        let r = s
            .send(
                Method::POST,
                "/api/v1/auth/login",
                None,
                Some(json!({"email": "admin@localhost", "password": "bad"})),
            )
            .await;
        r.assert_error(401);
    }
    let r = s
        .send(
            Method::POST,
            "/api/v1/auth/login",
            None,
            Some(json!({"email": "admin@localhost", "password": ADMIN_PASSWORD})),
        )
        .await;
    r.assert_error(429);
    assert!(r.body["retry_after"].as_u64().unwrap() >= 1);
    assert!(r.header("retry-after").is_some());
}

/// A wrong login for `email` from the client `xff` names (the server trusts loopback as its
/// proxy); its status.
async fn login_from(s: &Srv, xff: &str, email: &str) -> u16 {
    let r = s
        .raw(
            s.http
                .post(s.url("/api/v1/auth/login"))
                .header("x-forwarded-for", xff)
                .json(&json!({"email": email, "password": "wrong"})),
        )
        .await;
    r.status.as_u16()
}

each_backend!(login_is_limited_per_account_whatever_the_address);
/// Guessing one account's password from many addresses is limited per account too, and
/// unknown accounts alike (a 429 says nothing about whether the account exists).
async fn login_is_limited_per_account_whatever_the_address() {
    let s = start_with(|c| {
        c.http.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
        c.http.login_per_minute = 1_000;
        c.http.login_per_account_per_minute = 3;
    })
    .await;
    for i in 0..3 {
        let ip = format!("203.0.113.{i}");
        assert_eq!(login_from(&s, &ip, "admin@localhost").await, 401);
        assert_eq!(login_from(&s, &ip, "Nobody@Example.com").await, 401);
    }
    assert_eq!(login_from(&s, "198.51.100.9", "ADMIN@localhost").await, 429);
    assert_eq!(
        login_from(&s, "198.51.100.9", "nobody@example.com").await,
        429
    );
    assert_eq!(
        login_from(&s, "198.51.100.9", "someone@example.com").await,
        401
    );
}

each_backend!(ipv6_clients_are_counted_by_their_64);
/// An IPv6 client is counted by its /64: rotating through it does not make a new client.
async fn ipv6_clients_are_counted_by_their_64() {
    let s = start_with(|c| {
        c.http.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
        c.http.login_per_minute = 2;
        c.http.login_per_account_per_minute = 1_000;
    })
    .await;
    assert_eq!(
        login_from(&s, "2001:db8:1:2::1", "a@example.com").await,
        401
    );
    assert_eq!(
        login_from(&s, "2001:db8:1:2:ffff::9", "b@example.com").await,
        401
    );
    assert_eq!(
        login_from(&s, "2001:db8:1:2:abcd::7", "c@example.com").await,
        429
    );
    assert_eq!(
        login_from(&s, "2001:db8:1:3::1", "c@example.com").await,
        401
    );
}
