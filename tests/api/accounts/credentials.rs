//! Signing in and credentials: login and refresh, expired, forged and unsigned tokens, token
//! lifetimes, API keys and their cap.

use reqwest::Method;
use serde_json::json;

use super::*;

each_backend!(login_refresh_and_wrong_password);
async fn login_refresh_and_wrong_password() {
    let s = start().await;
    let r = s
        .send(
            Method::POST,
            "/api/v1/auth/login",
            None,
            Some(json!({"email": "admin@localhost", "password": ADMIN_PASSWORD})),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["token_type"], "bearer");
    assert_eq!(r.body["expires_in"], 3600);
    let token = r.body["access_token"].as_str().unwrap().to_string();
    // The token carries sub (string), iat and exp = iat + 3600, signed HS256.
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    v.set_required_spec_claims(&["exp", "sub", "iat"]);
    let claims = jsonwebtoken::decode::<serde_json::Value>(
        &token,
        &jsonwebtoken::DecodingKey::from_secret(JWT_SECRET.as_bytes()),
        &v,
    )
    .unwrap()
    .claims;
    assert_eq!(claims["sub"], json!(s.admin.user_id.to_string()));
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3600
    );

    let me = s.get("/api/v1/users/me", &token).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.body["email"], "admin@localhost");
    assert_eq!(me.body["is_superuser"], true);
    assert_eq!(
        me.body["organizations"],
        json!([{"slug": "default", "role": "owner"}])
    );

    let r = s
        .send(Method::POST, "/api/v1/auth/refresh", Some(&token), None)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["token_type"], "bearer");
    assert_eq!(r.body["expires_in"], 3600);
    let t2 = r.body["access_token"].as_str().unwrap();
    assert_eq!(s.get("/api/v1/users/me", t2).await.status, 200);

    // Refresh with an API key: 403.
    let r = s
        .send(Method::POST, "/api/v1/auth/refresh", Some(s.key()), None)
        .await;
    assert_eq!(r.assert_error(403), "Not enough permissions");

    for (email, pw) in [
        ("admin@localhost", "wrong"),
        ("nobody@x.io", ADMIN_PASSWORD),
    ] {
        let r = s
            .send(
                Method::POST,
                "/api/v1/auth/login",
                None,
                Some(json!({"email": email, "password": pw})),
            )
            .await;
        assert_eq!(r.assert_error(401), "Could not validate credentials");
    }
}

each_backend!(expired_forged_and_none_tokens_are_401);
async fn expired_forged_and_none_tokens_are_401() {
    let s = start().await;
    let uid = s.admin.user_id.to_string();
    let t = now();
    let cases = [
        // Expired.
        sign(
            json!({"sub": uid, "iat": t - 7200, "exp": t - 3600, "auth_time": t - 7200}),
            JWT_SECRET,
        ),
        // Signed with another key.
        sign(
            json!({"sub": uid, "iat": t, "exp": t + 3600, "auth_time": t}),
            "another-secret-another-secret-another",
        ),
        // alg: none.
        format!(
            "{}.{}.",
            b64(&json!({"alg": "none", "typ": "JWT"})),
            b64(&json!({"sub": uid, "iat": t, "exp": t + 3600}))
        ),
        // alg: HS512 with the right key.
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS512),
            &json!({"sub": uid, "iat": t, "exp": t + 3600, "auth_time": t}),
            &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
        )
        .unwrap(),
        "garbage".to_string(),
        "fops_notakey".to_string(),
        "fopsd_notatoken".to_string(),
    ];
    for token in cases {
        let r = s.get("/api/v1/users/me", &token).await;
        assert_eq!(
            r.assert_error(401),
            "Could not validate credentials",
            "{token}"
        );
    }
    // Missing credentials, and a non-bearer scheme.
    let r = s.send(Method::GET, "/api/v1/users/me", None, None).await;
    assert_eq!(r.assert_error(401), "Could not validate credentials");
    let r = s
        .raw(
            s.http
                .get(s.url("/api/v1/users/me"))
                .header("Authorization", format!("Basic {}", s.key())),
        )
        .await;
    r.assert_error(401);
    // A correctly signed token is accepted, and refresh beyond 7 days of login is refused.
    let good = sign(
        json!({"sub": uid, "iat": t, "exp": t + 3600, "auth_time": t}),
        JWT_SECRET,
    );
    assert_eq!(s.get("/api/v1/users/me", &good).await.status, 200);
    let old = sign(
        json!({"sub": uid, "iat": t, "exp": t + 3600, "auth_time": t - 8 * 86400}),
        JWT_SECRET,
    );
    s.send(Method::POST, "/api/v1/auth/refresh", Some(&old), None)
        .await
        .assert_error(401);
}

each_backend!(tokens_expire_after_their_ttl);
async fn tokens_expire_after_their_ttl() {
    // Seconds of margin for the first use; the expiry is polled, not slept to.
    let s = start_with(|c| c.auth.token_ttl_seconds = 3).await;
    let token = s.login("admin@localhost", ADMIN_PASSWORD).await;
    assert_eq!(s.get("/api/v1/users/me", &token).await.status, 200);
    let expired = eventually(20, || async {
        s.get("/api/v1/users/me", &token).await.status == 401
    })
    .await;
    assert!(expired);
    s.get("/api/v1/users/me", &token).await.assert_error(401);
}

each_backend!(api_key_life_cycle);
async fn api_key_life_cycle() {
    let s = start().await;
    let jwt = s.login("admin@localhost", ADMIN_PASSWORD).await;
    let r = s
        .post("/api/v1/auth/api-keys", &jwt, json!({"name": "ci"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let key = r.body["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("fops_") && key.len() >= 5 + 32, "{key}");
    assert_eq!(r.body["name"], "ci");
    assert!(r.body["created_at"].as_str().unwrap().ends_with('Z'));
    let id = r.body["id"].as_u64().unwrap();

    // Both header forms work.
    assert_eq!(s.get("/api/v1/users/me", &key).await.status, 200);
    let r = s
        .raw(
            s.http
                .get(s.url("/api/v1/users/me"))
                .header("X-API-Key", &key),
        )
        .await;
    assert_eq!(r.status, 200);

    // Listed without the key itself.
    let r = s.get("/api/v1/auth/api-keys", &jwt).await;
    assert_eq!(r.status, 200);
    let item = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == id)
        .unwrap()
        .clone();
    assert_eq!(item["name"], "ci");
    assert!(key.starts_with(item["prefix"].as_str().unwrap()));
    assert!(item.get("key").is_none());
    assert!(!r.body.to_string().contains(&key));
    assert!(item.get("last_used_at").is_some());

    // An API key cannot create or delete keys.
    s.post("/api/v1/auth/api-keys", &key, json!({"name": "x"}))
        .await
        .assert_error(403);
    s.delete(&format!("/api/v1/auth/api-keys/{id}"), &key)
        .await
        .assert_error(403);

    // Revocation is immediate.
    assert_eq!(
        s.delete(&format!("/api/v1/auth/api-keys/{id}"), &jwt)
            .await
            .status,
        204
    );
    s.get("/api/v1/users/me", &key).await.assert_error(401);
    s.delete(&format!("/api/v1/auth/api-keys/{id}"), &jwt)
        .await
        .assert_error(404);
}

each_backend!(api_keys_past_the_per_user_cap_are_refused);
/// A user holds at most `[auth] max_api_keys_per_user` keys: one more is 422 with the
/// envelope, another user is not affected, and deleting one makes room.
async fn api_keys_past_the_per_user_cap_are_refused() {
    let s = start_with(|c| c.auth.max_api_keys_per_user = 3).await;
    // The first start's own key counts: the admin holds one already.
    let jwt = s.login("admin@localhost", ADMIN_PASSWORD).await;
    let mut ids = Vec::new();
    for i in 0..2 {
        let r = s
            .post(
                "/api/v1/auth/api-keys",
                &jwt,
                json!({"name": format!("k{i}")}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        ids.push(r.body["id"].as_u64().unwrap());
    }
    let r = s
        .post(
            "/api/v1/auth/api-keys",
            &jwt,
            json!({"name": "one too many"}),
        )
        .await;
    let detail = r.assert_error(422);
    assert!(detail.contains("at most 3 API keys"), "{detail}");
    let listed = s.get("/api/v1/auth/api-keys", &jwt).await;
    assert_eq!(listed.body["items"].as_array().unwrap().len(), 3);
    // Another user has a cap of their own.
    let other = s.user("other@example.com").await;
    let r = s
        .post("/api/v1/auth/api-keys", &other, json!({"name": "mine"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    // Deleting one makes room.
    let r = s
        .delete(&format!("/api/v1/auth/api-keys/{}", ids[0]), &jwt)
        .await;
    assert_eq!(r.status, 204);
    let r = s
        .post("/api/v1/auth/api-keys", &jwt, json!({"name": "again"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
}
