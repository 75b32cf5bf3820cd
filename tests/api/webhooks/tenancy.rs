//! Organizations apart: a repository linked by another, installations bound by a superuser, an
//! organization's deletion.

use serde_json::{Value, json};

use super::*;

/// A free organization made by another user, and its project: (JWT, its project's path).
async fn other_tenant(s: &Srv, slug: &str) -> (String, String) {
    let jwt = s.user(&format!("owner@{slug}.example")).await;
    let r = s
        .post("/api/v1/organizations", &jwt, json!({"slug": slug}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(
            &format!("/api/v1/organizations/{slug}/projects"),
            &jwt,
            json!({"slug": "p"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    (jwt, format!("/api/v1/organizations/{slug}/projects/p"))
}

each_backend!(another_organization_linking_a_repository_never_receives_its_deliveries);
/// Another organization links the bound installation's repository: neither link conflicts
/// nor shows the other, and every delivery still resolves to the installation's organization.
async fn another_organization_linking_a_repository_never_receives_its_deliveries() {
    let s = webhook_server().await;
    // Bound to `default` when first seen: the service has one organization then.
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(
        inst.body["items"][0]["organization"], "default",
        "{}",
        inst.body
    );

    let (evil, evil_p) = other_tenant(&s, "evil").await;
    let r = s
        .post(
            &format!("{evil_p}/repositories"),
            &evil,
            json!({"full_name": REPO}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let evil_link = r.body["id"].as_u64().unwrap();
    assert_eq!(
        (r.body["state"].as_str(), &r.body["installation_id"]),
        (Some("pending"), &Value::Null)
    );
    // The owner's link is not refused because another organization linked the name first.
    let mine = link(&s, REPO).await;
    assert_eq!(mine["state"], "connected", "{mine}");

    let d = run(&s, "pull_request", &pr("opened", 7, "abc7", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["project"].as_str()),
        (Some("dispatched"), Some("default")),
        "{d}"
    );
    assert_eq!(runs(&s, "").await["total"], 1);
    let theirs = s.get(&format!("{evil_p}/test-runs"), &evil).await;
    assert_eq!(theirs.body["total"], 0, "{}", theirs.body);
    let log = s.get(&format!("{evil_p}/webhook-deliveries"), &evil).await;
    assert_eq!(log.body["total"], 0, "{}", log.body);
    let one = s
        .get(
            &format!(
                "{evil_p}/webhook-deliveries/{}",
                d["delivery_id"].as_str().unwrap()
            ),
            &evil,
        )
        .await;
    one.assert_error(404);
    let r = s
        .get(&format!("{evil_p}/repositories/{evil_link}"), &evil)
        .await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    // A runner of theirs finds nothing to claim.
    let r = s
        .post(&format!("{evil_p}/test-runs/claim"), &evil, json!({}))
        .await;
    assert_eq!(r.status, 204, "{}", r.body);
}

each_backend!(an_unbound_installation_is_skipped_until_a_superuser_binds_it);
/// With several organizations an installation seen for the first time is bound to none: its
/// deliveries are skipped `installation_unbound` until a superuser binds it; a rebind moves
/// its deliveries and leaves the old organization's links `disconnected`.
async fn an_unbound_installation_is_skipped_until_a_superuser_binds_it() {
    let s = webhook_server().await;
    let (other, other_p) = other_tenant(&s, "acme").await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(inst.body["items"][0]["organization"], Value::Null);
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa1", false)).await;
    skipped(&d, "installation_unbound");
    assert_eq!(d["project"], Value::Null);
    let l = s
        .get(
            &format!("{SCM}/deliveries?reason=installation_unbound"),
            s.key(),
        )
        .await;
    assert_eq!(l.body["total"], 1, "{}", l.body);

    let bind = format!("{SCM}/installations/{INST}/organization");
    // Only a superuser binds; an unknown organization is 404, a malformed slug 422.
    s.send(
        reqwest::Method::PUT,
        &bind,
        Some(&other),
        Some(json!({"organization": "acme"})),
    )
    .await
    .assert_error(403);
    s.send(
        reqwest::Method::PUT,
        &bind,
        Some(s.key()),
        Some(json!({"organization": "nobody"})),
    )
    .await
    .assert_error(404);
    s.send(
        reqwest::Method::PUT,
        &bind,
        Some(s.key()),
        Some(json!({"organization": "Not A Slug"})),
    )
    .await
    .assert_error(422);
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (r.body["id"].as_u64(), r.body["organization"].as_str()),
        (Some(INST), Some("default"))
    );
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "connected", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa2", false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");

    // Moved to `acme`: `default`'s link turns disconnected, and deliveries resolve in `acme`,
    // which links nothing yet.
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "acme"})),
        )
        .await;
    assert_eq!(r.body["organization"], "acme", "{}", r.body);
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(
        (r.body["state"].as_str(), &r.body["installation_id"]),
        (Some("disconnected"), &Value::Null),
        "{}",
        r.body
    );
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa3", false)).await;
    skipped(&d, "repository_not_linked");
    let r = s
        .post(
            &format!("{other_p}/repositories"),
            &other,
            json!({"full_name": REPO}),
        )
        .await;
    assert_eq!(r.body["state"], "connected", "{}", r.body);
    // The same commit as `default`'s run: a run of `acme`'s own, not a duplicate job.
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa2", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["project"].as_str()),
        (Some("dispatched"), Some("p")),
        "{d}"
    );
    assert_eq!(runs(&s, "").await["total"], 1, "default keeps its one run");
    // Moved back: `default`'s run of that commit still holds its key there, though `acme`'s
    // run took the key's index entry meanwhile.
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "aaa2", false)).await;
    skipped(&d, "duplicate_job");
    assert_eq!(runs(&s, "").await["total"], 1, "no second run of one key");
}

each_backend!(an_installation_bound_before_its_first_delivery_resolves_there);
/// An installation the service never saw can be bound ahead of its first delivery; that
/// delivery, naming a repository no installation was known to hold, makes the installation
/// its holder, so the link that took it shows `connected`.
async fn an_installation_bound_before_its_first_delivery_resolves_there() {
    let s = webhook_server().await;
    other_tenant(&s, "acme").await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let r = s
        .send(
            reqwest::Method::PUT,
            &format!("{SCM}/installations/{INST}/organization"),
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["state"], "active");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 3, "ccc1", false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(
        (&r.body["state"], &r.body["installation_id"]),
        (&json!("connected"), &json!(INST)),
        "{}",
        r.body
    );
    s.send(
        reqwest::Method::PUT,
        &format!("{SCM}/installations/abc/organization"),
        Some(s.key()),
        Some(json!({"organization": "default"})),
    )
    .await
    .assert_error(404);
}

each_backend!(deleting_an_organization_unbinds_its_installation_and_frees_its_repositories);
/// Deleting the organization an installation is bound to unbinds it at once (its deliveries
/// are skipped `installation_unbound`), and once the purge is done its repository links are
/// gone, so another organization links the repository and, bound there, receives its runs.
async fn deleting_an_organization_unbinds_its_installation_and_frees_its_repositories() {
    let s = webhook_server().await;
    let (acme, acme_p) = other_tenant(&s, "acme").await;
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let bind = format!("{SCM}/installations/{INST}/organization");
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "acme"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .post(
            &format!("{acme_p}/repositories"),
            &acme,
            json!({"full_name": REPO}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "ddd1", false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");

    let r = s.delete("/api/v1/organizations/acme", &acme).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(
        inst.body["items"][0]["organization"],
        Value::Null,
        "{}",
        inst.body
    );
    let d = run(&s, "pull_request", &pr("opened", 1, "ddd2", false)).await;
    skipped(&d, "installation_unbound");

    let rt = s.rt();
    assert!(eventually(20, || async { rt.directory.purging().unwrap().is_empty() }).await);
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let r = s
        .send(
            reqwest::Method::PUT,
            &bind,
            Some(s.key()),
            Some(json!({"organization": "default"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "connected", "{}", r.body);
    let d = run(&s, "pull_request", &pr("opened", 1, "ddd3", false)).await;
    assert_eq!(
        (d["outcome"].as_str(), d["project"].as_str()),
        (Some("dispatched"), Some("default")),
        "{d}"
    );
}

each_backend!(a_delivery_naming_no_installation_and_held_by_none_is_not_linked_anywhere);
/// A delivery that names no installation, for a repository no installation holds, on a
/// service with several organizations resolves nowhere: skipped `repository_not_linked`
/// (there is no installation to be unbound), even though an organization links the name.
async fn a_delivery_naming_no_installation_and_held_by_none_is_not_linked_anywhere() {
    let s = webhook_server().await;
    other_tenant(&s, "acme").await;
    link(&s, REPO).await;
    let mut p = pr("opened", 1, "eee1", false);
    p.as_object_mut().unwrap().remove("installation");
    let d = run(&s, "pull_request", &p).await;
    skipped(&d, "repository_not_linked");
    assert_eq!(d["project"], Value::Null);
}
