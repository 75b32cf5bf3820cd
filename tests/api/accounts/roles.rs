//! Roles and organizations: what each role may read and write, projects and members, another
//! organization, superusers, the caller's lists, validation, and the first start's tier.

use reqwest::Method;
use serde_json::json;

use super::*;

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

/// Sets up org A (owner, admin, member, viewer) and org B (its own owner).
struct Tenancy {
    owner: String,
    admin: String,
    member: String,
    viewer: String,
    outsider: String,
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
