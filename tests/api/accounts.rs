//! Login, refresh, expiry, API keys, users, organizations, members, projects, and the 401/403
//! matrix across two organizations and the four roles.

use base64::Engine;
use reqwest::Method;
use serde_json::json;

use crate::common::*;

fn b64(v: &serde_json::Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn sign(claims: serde_json::Value, secret: &str) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

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

/// Sets up org A (owner, admin, member, viewer) and org B (its own owner).
struct Tenancy {
    owner: String,
    admin: String,
    member: String,
    viewer: String,
    outsider: String,
}

async fn tenancy(s: &Srv) -> Tenancy {
    let owner = s.user("owner@a.io").await;
    let r = s
        .post(
            "/api/v1/organizations",
            &owner,
            json!({"slug": "org-a", "name": "A"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["slug"], "org-a");
    assert_eq!(r.body["tier"], "free");
    let admin = s.user("admin@a.io").await;
    let member = s.user("member@a.io").await;
    let viewer = s.user("viewer@a.io").await;
    for (email, role) in [
        ("admin@a.io", "admin"),
        ("member@a.io", "member"),
        ("viewer@a.io", "viewer"),
    ] {
        let r = s
            .post(
                "/api/v1/organizations/org-a/members",
                &owner,
                json!({"email": email, "role": role}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        assert_eq!(r.body["role"], role);
        assert_eq!(r.body["email"], email);
    }
    let r = s
        .post(
            "/api/v1/organizations/org-a/projects",
            &owner,
            json!({"slug": "p1"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(r.body["project_secret"].as_str().unwrap().len() >= 32);
    let outsider = s.user("owner@b.io").await;
    let r = s
        .post("/api/v1/organizations", &outsider, json!({"slug": "org-b"}))
        .await;
    assert_eq!(r.status, 201);
    let r = s
        .post(
            "/api/v1/organizations/org-b/projects",
            &outsider,
            json!({"slug": "p1"}),
        )
        .await;
    assert_eq!(r.status, 201);
    Tenancy {
        owner,
        admin,
        member,
        viewer,
        outsider,
    }
}

each_backend!(every_role_reads_and_members_and_up_write);
/// Reads: every role; writes of project resources: member and up.
async fn every_role_reads_and_members_and_up_write() {
    let s = start().await;
    let t = tenancy(&s).await;
    let devices = "/api/v1/organizations/org-a/projects/p1/devices";
    // Reads: every role.
    for tok in [&t.owner, &t.admin, &t.member, &t.viewer] {
        assert_eq!(s.get(devices, tok).await.status, 200);
        assert_eq!(
            s.get("/api/v1/organizations/org-a/projects", tok)
                .await
                .status,
            200
        );
    }
    // Writes of project resources: member and up.
    s.post(devices, &t.viewer, json!({"name": "d"}))
        .await
        .assert_error(403);
    for tok in [&t.member, &t.admin, &t.owner] {
        assert_eq!(s.post(devices, tok, json!({"name": "d"})).await.status, 201);
    }
}

each_backend!(projects_and_members_are_for_admins_and_owner_grants_owner);
/// Projects and members: admin and up; only an owner grants owner.
async fn projects_and_members_are_for_admins_and_owner_grants_owner() {
    let s = start().await;
    let t = tenancy(&s).await;
    // Projects and members: admin and up.
    for tok in [&t.viewer, &t.member] {
        s.post(
            "/api/v1/organizations/org-a/projects",
            tok,
            json!({"slug": "p2"}),
        )
        .await
        .assert_error(403);
        s.post(
            "/api/v1/organizations/org-a/members",
            tok,
            json!({"email": "x@y.io", "role": "viewer"}),
        )
        .await
        .assert_error(403);
        s.send(
            Method::POST,
            "/api/v1/organizations/org-a/projects/p1/rotate-secret",
            Some(tok),
            None,
        )
        .await
        .assert_error(403);
    }
    assert_eq!(
        s.post(
            "/api/v1/organizations/org-a/projects",
            &t.admin,
            json!({"slug": "p2"})
        )
        .await
        .status,
        201
    );
    // Only an owner grants owner.
    s.user("new@a.io").await;
    s.post(
        "/api/v1/organizations/org-a/members",
        &t.admin,
        json!({"email": "new@a.io", "role": "owner"}),
    )
    .await
    .assert_error(403);
    let r = s
        .post(
            "/api/v1/organizations/org-a/members",
            &t.owner,
            json!({"email": "new@a.io", "role": "owner"}),
        )
        .await;
    assert_eq!(r.status, 201);
    s.post(
        "/api/v1/organizations/org-a/members",
        &t.owner,
        json!({"email": "new@a.io", "role": "viewer"}),
    )
    .await
    .assert_error(409);
    s.post(
        "/api/v1/organizations/org-a/members",
        &t.owner,
        json!({"email": "ghost@a.io", "role": "viewer"}),
    )
    .await
    .assert_error(404);
}

each_backend!(another_organization_is_403_and_the_superuser_has_owner_rights);
/// Another organization: 403 whether it exists or not; the superuser has owner rights
/// everywhere and gets 404 for what does not exist.
async fn another_organization_is_403_and_the_superuser_has_owner_rights() {
    let s = start().await;
    let t = tenancy(&s).await;
    let devices = "/api/v1/organizations/org-a/projects/p1/devices";
    // Another organization: 403 whether it exists or not; its project ids are unreachable.
    for path in [
        "/api/v1/organizations/org-b/projects/p1/devices",
        "/api/v1/organizations/org-b/projects",
        "/api/v1/organizations/org-b/devices",
        "/api/v1/organizations/no-such-org/projects/p1/devices",
    ] {
        assert_eq!(
            s.get(path, &t.owner).await.assert_error(403),
            "Not enough permissions"
        );
    }
    s.get(devices, &t.outsider).await.assert_error(403);
    // The superuser has owner rights everywhere, and gets 404 for what does not exist.
    assert_eq!(
        s.get("/api/v1/organizations/org-b/projects/p1/devices", s.key())
            .await
            .status,
        200
    );
    assert_eq!(
        s.get("/api/v1/organizations/no-such-org/projects", s.key())
            .await
            .assert_error(404),
        "Organization not found"
    );
    assert_eq!(
        s.get(
            "/api/v1/organizations/org-a/projects/nope/devices",
            &t.viewer
        )
        .await
        .assert_error(404),
        "Project not found"
    );
}

each_backend!(creating_users_and_higher_tiers_is_for_superusers);
/// Creating users is for superusers, and so is a tier above free.
async fn creating_users_and_higher_tiers_is_for_superusers() {
    let s = start().await;
    let t = tenancy(&s).await;
    // Creating users is for superusers; a tier above free too.
    s.post(
        "/api/v1/users",
        &t.owner,
        json!({"email": "z@z.io", "password": "x"}),
    )
    .await
    .assert_error(403);
    s.post(
        "/api/v1/organizations",
        &t.owner,
        json!({"slug": "rich", "tier": "team"}),
    )
    .await
    .assert_error(403);
    let r = s
        .post(
            "/api/v1/organizations",
            s.key(),
            json!({"slug": "rich", "tier": "team"}),
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["tier"], "team");
    s.post("/api/v1/organizations", s.key(), json!({"slug": "rich"}))
        .await
        .assert_error(409);
}

each_backend!(lists_show_the_callers_organizations_and_admins_rotate_secrets);
/// Lists show only the caller's organizations, and projects without secrets; an admin rotates a
/// project secret.
async fn lists_show_the_callers_organizations_and_admins_rotate_secrets() {
    let s = start().await;
    let t = tenancy(&s).await;
    let r = s
        .post(
            "/api/v1/organizations/org-a/projects",
            &t.admin,
            json!({"slug": "p2"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    // Lists show only the caller's organizations, and projects without secrets.
    let r = s.get("/api/v1/organizations", &t.viewer).await;
    let slugs: Vec<_> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["slug"].clone())
        .collect();
    assert_eq!(slugs, vec![json!("org-a")]);
    let r = s
        .get("/api/v1/organizations/org-a/projects", &t.viewer)
        .await;
    assert_eq!(r.body["items"].as_array().unwrap().len(), 2);
    assert_eq!(r.body["items"][0]["slug"], "p2", "newest first");
    assert!(!r.body.to_string().contains("project_secret"));

    // rotate-secret by an admin gives a new secret.
    let r = s
        .send(
            Method::POST,
            "/api/v1/organizations/org-a/projects/p1/rotate-secret",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body["project_secret"].as_str().unwrap().len() >= 32);
}

each_backend!(validation_of_account_inputs);
async fn validation_of_account_inputs() {
    let s = start().await;
    for slug in ["Upper", "-lead", "", "a_b", &"x".repeat(64)] {
        let r = s
            .post("/api/v1/organizations", s.key(), json!({"slug": slug}))
            .await;
        assert!(r.assert_error(422).starts_with("slug"), "{slug}");
    }
    s.post(
        "/api/v1/organizations",
        s.key(),
        json!({"slug": "ok", "tier": "platinum"}),
    )
    .await
    .assert_error(422);
    s.post(
        "/api/v1/users",
        s.key(),
        json!({"email": "not-an-email", "password": "x"}),
    )
    .await
    .assert_error(422);
    s.post(
        "/api/v1/users",
        s.key(),
        json!({"email": "admin@localhost", "password": "x"}),
    )
    .await
    .assert_error(409);
    let r = s
        .post(
            "/api/v1/users",
            s.key(),
            json!({"email": "U@X.io", "password": "pw"}),
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["email"], "u@x.io");
    assert_eq!(r.body["is_superuser"], false);
    assert!(r.body.get("password_hash").is_none());
    s.post(
        "/api/v1/organizations/default/members",
        s.key(),
        json!({"email": "u@x.io", "role": "boss"}),
    )
    .await
    .assert_error(422);
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

each_backend!(the_first_start_organization_takes_the_configured_tier);
/// The first start's organization is on `[admin] tier`: its rate limit is that tier's.
async fn the_first_start_organization_takes_the_configured_tier() {
    let s = start_with(|c| {
        c.admin.tier = "team".into();
        c.tiers.get_mut("team").unwrap().requests_per_minute = Some(1234);
    })
    .await;
    let r = s.get("/api/v1/organizations", s.key()).await;
    assert_eq!(r.body["items"][0]["tier"], "team", "{}", r.body);
    let r = s.get(&format!("{DEV}/devices"), s.key()).await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("1234"));
}
