//! Organizations themselves: read by their members, renamed by admins, re-tiered by a
//! superuser, deleted by an owner; a deleted organization's data purged in the background
//! while every other organization is untouched.

use serde_json::{Value, json};

use crate::capsules::{archive, secret_post, sha};
use crate::common::*;
use crate::sessions::{device, session};

const ORG: &str = "/api/v1/organizations/doomed";
const PROJECT: &str = "/api/v1/organizations/doomed/projects/p";

/// Organization `doomed` with an owner, an admin and a viewer, and project `p`.
struct Doomed {
    owner: String,
    admin: String,
    viewer: String,
    secret: String,
}

async fn doomed(s: &Srv) -> Doomed {
    let owner = s.user("owner@doomed.io").await;
    let r = s
        .post(
            "/api/v1/organizations",
            &owner,
            json!({"slug": "doomed", "name": "Doomed Robotics"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let admin = s.user("admin@doomed.io").await;
    let viewer = s.user("viewer@doomed.io").await;
    for (email, role) in [("admin@doomed.io", "admin"), ("viewer@doomed.io", "viewer")] {
        let r = s
            .post(
                &format!("{ORG}/members"),
                &owner,
                json!({"email": email, "role": role}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let r = s
        .post(&format!("{ORG}/projects"), &owner, json!({"slug": "p"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    Doomed {
        owner,
        admin,
        viewer,
        secret: r.body["project_secret"].as_str().unwrap().to_string(),
    }
}

/// Device `rover` of project `p`: its id and token.
async fn rover(s: &Srv, d: &Doomed) -> (u64, String) {
    let r = s
        .post(
            &format!("{PROJECT}/devices"),
            &d.admin,
            json!({"name": "rover"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    )
}

/// A session of device `dev` with `batches` one-line log batches; its id.
async fn session_of_batches(s: &Srv, dev: u64, tok: &str, batches: usize) -> u64 {
    let r = s
        .post(
            &format!("{PROJECT}/sessions"),
            tok,
            json!({"device_id": dev}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let sid = r.body["id"].as_u64().unwrap();
    for i in 0..batches {
        let r = s
            .post(
                &format!("{PROJECT}/sessions/{sid}/logs"),
                tok,
                json!([{"level": "info", "message": format!("line {i}")}]),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.body);
    }
    sid
}

fn project_id(s: &Srv) -> u64 {
    let rt = s.rt();
    let org = rt.store().org_by_slug("doomed").unwrap().unwrap();
    rt.store().project_by_slug(org.id, "p").unwrap().unwrap().id
}

each_backend!(members_read_an_organization_admins_rename_it_and_a_superuser_sets_its_tier);
/// Every member reads the organization; an admin renames it; only a superuser changes its tier,
/// to one the configuration defines; outsiders get 403.
async fn members_read_an_organization_admins_rename_it_and_a_superuser_sets_its_tier() {
    let s = start().await;
    let d = doomed(&s).await;
    let outsider = s.user("outsider@else.io").await;
    for tok in [&d.owner, &d.admin, &d.viewer] {
        let r = s.get(ORG, tok).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            (&r.body["slug"], &r.body["name"], &r.body["tier"]),
            (&json!("doomed"), &json!("Doomed Robotics"), &json!("free"))
        );
        assert!(r.body["id"].as_u64().is_some());
        assert!(r.body["created_at"].as_str().unwrap().ends_with('Z'));
    }
    s.get(ORG, &outsider).await.assert_error(403);
    s.patch(ORG, &d.viewer, json!({"name": "Mine"}))
        .await
        .assert_error(403);

    let r = s.patch(ORG, &d.admin, json!({"name": "Renamed"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.body["name"], &r.body["slug"]),
        (&json!("Renamed"), &json!("doomed"))
    );
    let list = s.get("/api/v1/organizations", &d.viewer).await;
    assert_eq!(list.body["items"][0]["name"], "Renamed", "{}", list.body);
    s.patch(ORG, &d.admin, json!({"name": ""}))
        .await
        .assert_error(422);

    // The tier decides quotas: a superuser's to change, even for the owner (repeating the
    // current one changes nothing and is anyone's with the rename right).
    let r = s
        .patch(ORG, &d.admin, json!({"tier": "free", "name": "Renamed"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    for tok in [&d.admin, &d.owner] {
        s.patch(ORG, tok, json!({"tier": "enterprise"}))
            .await
            .assert_error(403);
    }
    s.patch(ORG, s.key(), json!({"tier": "platinum"}))
        .await
        .assert_error(422);
    let r = s.patch(ORG, s.key(), json!({"tier": "team"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (&r.body["tier"], &r.body["name"]),
        (&json!("team"), &json!("Renamed"))
    );
    assert_eq!(s.get(ORG, &d.viewer).await.body["tier"], "team");
}

each_backend!(an_owner_deletes_an_organization_and_its_slug_is_free_at_once);
/// Only an owner (or a superuser) deletes; once it answers 204 the organization is gone from
/// every lookup and its slug is free for a new, empty organization.
async fn an_owner_deletes_an_organization_and_its_slug_is_free_at_once() {
    let s = start().await;
    let d = doomed(&s).await;
    for tok in [&d.admin, &d.viewer] {
        s.delete(ORG, tok).await.assert_error(403);
    }
    let r = s.delete(ORG, &d.owner).await;
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(r.body, Value::Null);
    // Gone for its members (no longer members of anything) and for the superuser.
    s.get(ORG, &d.owner).await.assert_error(403);
    s.get(&format!("{PROJECT}/devices"), &d.admin)
        .await
        .assert_error(403);
    assert_eq!(
        s.get(ORG, s.key()).await.assert_error(404),
        "Organization not found"
    );
    s.delete(ORG, s.key()).await.assert_error(404);
    let list = s.get("/api/v1/organizations", &d.owner).await;
    assert_eq!(list.body["items"], json!([]), "{}", list.body);

    // The slug is free: a new organization under it starts empty.
    let other = s.user("new@owner.io").await;
    let r = s
        .post("/api/v1/organizations", &other, json!({"slug": "doomed"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s.get(&format!("{ORG}/projects"), &other).await;
    assert_eq!(r.body["items"], json!([]), "{}", r.body);
    s.get(ORG, &d.owner).await.assert_error(403);
}

/// Every file under `dir`, recursively.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// Key families that outlive an organization by design: its members' user accounts, their
/// API keys and sign-outs.
const KEPT_FAMILIES: &[&str] = &["u", "ix-email", "k", "ix-khash", "uk", "so"];

each_backend!(a_deleted_organizations_data_is_purged_and_no_other_is_touched);
/// Deleting an organization purges every record and blob of its projects (sessions with logs
/// and files, devices with metrics and history, capsules, a deployment with device results,
/// a repository link, an integration, a rule and a firing alert with owed notifications),
/// refuses its device tokens at once, and leaves the default organization's data as it was:
/// no key of it is left in the store.
async fn a_deleted_organizations_data_is_purged_and_no_other_is_touched() {
    let s = start_with(|c| c.alerts.allow_private_targets = true).await;
    // The default organization's device, session, log lines and file: kept.
    let (kept_dev, kept_tok) = device(&s, "keeper").await;
    let kept_sid = session(&s, kept_dev, &kept_tok).await;
    let r = s
        .post(
            &format!("{DEV}/sessions/{kept_sid}/logs"),
            &kept_tok,
            json!([{"level": "info", "message": "still here"}]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let rt = s.rt();
    let before = rt.store().key_snapshot().unwrap();

    let d = doomed(&s).await;
    let (dev, tok) = rover(&s, &d).await;
    let r = s
        .post(
            &format!("{PROJECT}/devices/{dev}/heartbeat"),
            &tok,
            json!({"metrics": {"cpu": 0.5}}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    // A rule with an integration whose target refuses: its alert's notification stays owed.
    let r = s
        .post(
            &format!("{PROJECT}/integrations"),
            &d.admin,
            json!({"type": "webhook", "name": "hook",
                   "config": {"url": "http://127.0.0.1:9/h", "signing_secret": "s"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let iid = r.body["id"].as_u64().unwrap();
    let r = s
        .post(
            &format!("{PROJECT}/alert-rules"),
            &d.admin,
            json!({"name": "panics", "condition": {"type": "log_pattern", "pattern": "panic"},
                   "severity": "warning", "integration_ids": [iid]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let mut sids = Vec::new();
    for _ in 0..3 {
        sids.push(session_of_batches(&s, dev, &tok, 20).await);
    }
    let r = s
        .post(
            &format!("{PROJECT}/sessions/{}/logs", sids[0]),
            &tok,
            json!([{"level": "error", "message": "panic in the motor loop"}]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let alerts = format!("{PROJECT}/alerts");
    assert!(
        eventually(10, || async {
            s.get(&alerts, &d.admin).await.body["total"] == json!(1)
        })
        .await,
        "the alert did not fire"
    );
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{PROJECT}/sessions/{}/files/trace.bin", sids[0])))
                .bearer_auth(&tok)
                .body(vec![7u8; 10_000]),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(
            &format!("{PROJECT}/repositories"),
            &d.admin,
            json!({"full_name": "doomed/firmware"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(
            &format!("{PROJECT}/enrollment-tokens"),
            &d.admin,
            json!({"name": "line"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    // A capsule, and a deployment of it the device reports on.
    let caps = "/api/v1/projects/doomed/p/capsules";
    let bytes = archive(".tar", b"x");
    let r = secret_post(
        &s,
        &format!("{caps}/upload-url"),
        &d.secret,
        json!({"name": "nav", "version": "1.0.0", "capsule_type": "SW", "file_format": ".tar",
               "file_size_bytes": bytes.len(), "metadata": {}, "dependencies": []}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let cid = r.body["capsule_id"].as_u64().unwrap();
    let put = s
        .http
        .put(r.body["upload_url"].as_str().unwrap())
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        &s,
        &format!("{caps}/{cid}/confirm"),
        &d.secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let deps = "/api/v1/projects/doomed/p/deployments";
    let r = s
        .post(
            deps,
            &d.admin,
            json!({"name": "first", "composition_tag": "nav-1.0.0", "capsule_id": cid,
                   "target_devices": [dev],
                   "rollout": {"phases": [{"name": "all", "devices": {"percent": 100}}]}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{deps}/{dep}/activate"), &d.admin, json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    for status in ["installing", "succeeded"] {
        let r = s
            .raw(
                s.http
                    .post(s.url(&format!("/api/v1/device/deployment/{dep}/status")))
                    .bearer_auth(&tok)
                    .json(&json!({"status": status})),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.body);
    }

    let pid = project_id(&s);
    assert!(!rt.store().project_residue(pid).unwrap().is_empty());
    let blobs = s._dir.path().join("data/blobs");
    let theirs = |p: &std::path::Path| {
        let rel = p
            .strip_prefix(&blobs)
            .unwrap()
            .to_string_lossy()
            .to_string();
        rel.starts_with(&format!("capsules/{pid}/"))
            || sids
                .iter()
                .any(|sid| rel.starts_with(&format!("artifacts/{sid}/")))
    };
    let blobs_before = files(&blobs);
    assert_eq!(
        blobs_before.iter().filter(|p| theirs(p)).count(),
        2,
        "{blobs_before:?}"
    );

    let r = s.delete(ORG, &d.owner).await;
    assert_eq!(r.status, 204, "{}", r.body);
    // Its device token is refused at once, on the routes that name no organization too.
    s.get("/api/v1/device/deployment", &tok)
        .await
        .assert_error(401);
    assert_eq!(s.metric("fleetops_orgs_being_deleted").await, 1.0);

    assert!(
        eventually(30, || async { rt.directory.purging().unwrap().is_empty() }).await,
        "the purge did not finish"
    );
    assert_eq!(rt.store().project_residue(pid).unwrap(), Vec::<&str>::new());
    let left: std::collections::BTreeSet<String> = rt
        .store()
        .key_snapshot()
        .unwrap()
        .difference(&before)
        .map(|k| fleetops_storage::purge::key_family(k))
        .filter(|f| !KEPT_FAMILIES.contains(&f.as_str()))
        .collect();
    assert_eq!(
        left,
        Default::default(),
        "keys of the deleted organization are left"
    );
    let blobs_after = files(&blobs);
    assert_eq!(
        blobs_after.iter().filter(|p| theirs(p)).count(),
        0,
        "{blobs_after:?}"
    );

    // The default organization's data is as it was.
    let r = s
        .get(&format!("{DEV}/sessions/{kept_sid}/logs"), s.key())
        .await;
    assert_eq!(r.body["items"][0]["message"], "still here", "{}", r.body);
    let r = s.get(&format!("{DEV}/devices/{kept_dev}"), s.key()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(s.metric("fleetops_orgs_being_deleted").await, 0.0);
}

each_backend!(each_purge_step_removes_at_most_its_budget);
/// A purge step removes at most its budget of records, however long a session's log is, and
/// repeated steps finish with nothing left and the lists consistent (checked as the server
/// stops).
async fn each_purge_step_removes_at_most_its_budget() {
    let s = start().await;
    let d = doomed(&s).await;
    let (dev, tok) = rover(&s, &d).await;
    for _ in 0..2 {
        session_of_batches(&s, dev, &tok, 15).await;
    }
    let pid = project_id(&s);
    let store = s.rt().store().clone();
    let org = store.org_by_slug("doomed").unwrap().unwrap();
    // Marked as a deletion does it, and purged here step by step (no background task runs).
    store.begin_org_deletion(&org).unwrap();

    let mut steps = Vec::new();
    loop {
        let step = store.purge_org_step(org.id, 7).unwrap();
        assert!(step.removed <= 7, "a step removed {}", step.removed);
        steps.push(step.removed);
        if step.done {
            break;
        }
        assert!(steps.len() < 1000, "the purge does not end");
    }
    // Two sessions of 15 chunks (with their summaries), the sessions, the device and the
    // project at least.
    let total: usize = steps.iter().sum();
    let least = 2 * 15 * 2 + 2 + 1 + 1;
    assert!(total >= least, "{steps:?}");
    assert!(steps.len() >= total / 7, "{steps:?}");
    assert_eq!(store.project_residue(pid).unwrap(), Vec::<&str>::new());
    assert!(!store.org_being_deleted(org.id).unwrap());
}

each_backend!(a_write_already_past_the_lookup_is_refused_once_the_organization_is_deleted);
/// Once an organization is deleted, a write that got past its lookup before (a heartbeat
/// queued behind a busy project actor, a log batch, a heartbeat) is refused by the actor it
/// reaches: nothing is written into a project being purged.
async fn a_write_already_past_the_lookup_is_refused_once_the_organization_is_deleted() {
    let s = start().await;
    let d = doomed(&s).await;
    let (dev, tok) = rover(&s, &d).await;
    let sid = session_of_batches(&s, dev, &tok, 0).await;
    let pid = project_id(&s);
    let rt = s.rt();
    let entry = || -> Vec<fleetops_actors::logs::RawEntry> {
        vec![serde_json::from_value(json!({"level": "info", "message": "late"})).unwrap()]
    };
    // Both accepted while the organization exists (the session's actor is running).
    rt.sessions.append(pid, sid, entry(), None).await.unwrap();
    rt.projects
        .heartbeat(pid, dev, Default::default())
        .await
        .unwrap();

    // A heartbeat queued behind a busy project actor before the deletion: refused when the
    // actor takes it on, after.
    rt.projects
        .inject_stall(pid, std::time::Duration::from_millis(1500))
        .await
        .unwrap();
    let queued = tokio::spawn({
        let rt = rt.clone();
        async move { rt.projects.heartbeat(pid, dev, Default::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        rt.projects.waiting(pid),
        1,
        "the heartbeat waits behind the stall"
    );

    let r = s.delete(ORG, &d.owner).await;
    assert_eq!(r.status, 204, "{}", r.body);
    let late = queued.await.unwrap();
    assert!(
        matches!(late, Err(fleetops_actors::Error::NotFound(_))),
        "{late:?}"
    );
    let late = rt.sessions.append(pid, sid, entry(), None).await;
    assert!(
        matches!(late, Err(fleetops_actors::Error::NotFound(_))),
        "{late:?}"
    );
    let late = rt.projects.heartbeat(pid, dev, Default::default()).await;
    assert!(
        matches!(late, Err(fleetops_actors::Error::NotFound(_))),
        "{late:?}"
    );
    assert!(eventually(30, || async { rt.directory.purging().unwrap().is_empty() }).await);
}
