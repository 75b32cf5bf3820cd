//! The admin commands: backup and restore while serving, a purge interrupted by kill -9, and
//! organizations offline and through the running server.

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::common::DEV;

/// One line of JSON from a successful `admin` run.
fn admin_json(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let (ok, stdout, stderr) = admin(dir, args, env);
    assert!(ok, "{args:?}: {stderr}");
    assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

each_backend!(backup_while_serving_then_restore_serves_the_copy);
/// `admin backup` while the server serves and log batches keep arriving (the server makes a
/// consistent copy), then `admin restore` into an empty data directory: the restored server
/// has every record and file acknowledged before the backup, its lists match its records,
/// and it serves. Offline, the same command copies directly; a destination that is not empty
/// and a restore over a data directory in use are refused.
async fn backup_while_serving_then_restore_serves_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (token, sid) = device_and_session(&c, &base, &key).await;
    let r = c
        .put(format!("{base}{DEV}/sessions/{sid}/files/a/trace.bin"))
        .bearer_auth(&token)
        .body(vec![7u8; 50_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let logs = format!("{base}{DEV}/sessions/{sid}/logs");
    let batch: Vec<_> = (0..100)
        .map(|i| json!({"level": "info", "message": format!("line {i}")}))
        .collect();
    for _ in 0..5 {
        let r = c
            .post(&logs)
            .bearer_auth(&token)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    // Batches keep coming while the backup is taken.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (c, logs, token, batch, stop) = (
            c.clone(),
            logs.clone(),
            token.clone(),
            batch.clone(),
            stop.clone(),
        );
        async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .post(&logs)
                    .bearer_auth(&token)
                    .json(&batch)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                n += 1;
            }
            n
        }
    });
    let backup = dir.path().join("backup");
    let (ok, out, err) = tokio::task::spawn_blocking({
        let (d, backup, base, key) = (
            dir.path().to_path_buf(),
            backup.clone(),
            base.clone(),
            key.clone(),
        );
        move || {
            admin(
                &d,
                &["backup", "--to", backup.to_str().unwrap(), "--url", &base],
                &[("FLEETOPS_TOKEN", &key)],
            )
        }
    })
    .await
    .unwrap();
    if crate::backend::on_postgres() {
        // The records are the database's to back up: refused with the reason, nothing made.
        assert!(
            !ok && err.contains("keeps its records in PostgreSQL"),
            "{out}{err}"
        );
        assert!(!backup.exists());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(writer.await.unwrap() > 0);
        return;
    }
    assert!(ok, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(report["keys"].as_u64().unwrap() > 0, "{report}");
    // Local blobs (sealed log segments among them) are in the copy.
    assert_eq!(report["not_included"], json!([]), "{report}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.await.unwrap() > 0);
    // Without a token, against a running server: refused with a reason.
    let (ok, _, err) = admin(
        dir.path(),
        &["backup", "--to", dir.path().join("b2").to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("--token"), "{err}");
    // Not a superuser's key: 403 from the server.
    let member = c
        .post(format!("{base}/api/v1/admin/backup"))
        .bearer_auth(&token)
        .json(&json!({"to": dir.path().join("b3")}))
        .send()
        .await
        .unwrap();
    assert_eq!(member.status(), 403);
    // A destination inside the data directory: 422.
    let inside = c
        .post(format!("{base}/api/v1/admin/backup"))
        .bearer_auth(&key)
        .json(&json!({"to": dir.path().join("data/b")}))
        .send()
        .await
        .unwrap();
    assert_eq!(inside.status(), 422);
    drop(p);

    // Restore into a second directory and serve it.
    let other = tempfile::tempdir().unwrap();
    let (ok, out, err) = admin(
        other.path(),
        &["restore", "--from", backup.to_str().unwrap()],
        &[],
    );
    assert!(ok, "{out}{err}");
    {
        let store = crate::common::open_store(other.path());
        assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    }
    let p = serve(other.path(), &[]);
    let base = p.base.clone();
    let r = c
        .get(format!("{base}{DEV}/sessions/{sid}/files/a/trace.bin"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 50_000);
    let v: serde_json::Value = c
        .get(format!("{base}{DEV}/sessions/{sid}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let lines = v["metrics"]["log_count"].as_u64().unwrap();
    assert!(lines >= 500 && lines.is_multiple_of(100), "{v}");
    // A restore over a data directory in use is refused.
    let (ok, _, err) = admin(
        other.path(),
        &["restore", "--from", backup.to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("not empty"), "{err}");
    drop(p);
    // Offline: the command copies directly; a destination that is not empty is refused.
    let (ok, out, err) = admin(
        other.path(),
        &[
            "backup",
            "--to",
            other.path().join("offline").to_str().unwrap(),
        ],
        &[],
    );
    assert!(ok, "{out}{err}");
    let (ok, _, err) = admin(
        other.path(),
        &["backup", "--to", backup.to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("not empty"), "{err}");
    // A data directory that holds no store is not backed up (nor created).
    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = admin(
        empty.path(),
        &["backup", "--to", empty.path().join("b").to_str().unwrap()],
        &[],
    );
    assert!(!ok && err.contains("holds no fleetops store"), "{err}");
    assert!(!empty.path().join("data").exists());
}

each_backend!(kill_9_mid_purge_then_the_restart_finishes_the_purge);
/// `kill -9` while a deleted organization's data is being purged (slowed down to small steps):
/// the restart resumes the purge, which finishes with nothing of its projects left, the lists
/// consistent, and the default organization's data intact.
async fn kill_9_mid_purge_then_the_restart_finishes_the_purge() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[supervision]\npurge_records_per_step = 5\npurge_pause_ms = 20\n",
    )
    .unwrap();
    let mut p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (kept_token, kept_sid) = device_and_session(&c, &base, &key).await;
    let post = |path: String, cred: String, body: serde_json::Value| {
        post_json(c.clone(), format!("{base}{path}"), cred, body)
    };
    let (st, _) = post(
        format!("{DEV}/sessions/{kept_sid}/logs"),
        kept_token.clone(),
        json!([{"level": "info", "message": "kept"}]),
    )
    .await;
    assert_eq!(st, 202);
    let (st, _) = post(
        "/api/v1/organizations".into(),
        key.clone(),
        json!({"slug": "gone"}),
    )
    .await;
    assert_eq!(st, 201);
    let org = "/api/v1/organizations/gone";
    let (st, proj) = post(format!("{org}/projects"), key.clone(), json!({"slug": "p"})).await;
    assert_eq!(st, 201);
    let pid = proj["id"].as_u64().unwrap();
    let project = format!("{org}/projects/p");
    let (st, d) = post(
        format!("{project}/devices"),
        key.clone(),
        json!({"name": "r"}),
    )
    .await;
    assert_eq!(st, 201);
    let token = d["device_token"].as_str().unwrap().to_string();
    let mut sids = Vec::new();
    for _ in 0..10 {
        let (st, v) = post(
            format!("{project}/sessions"),
            token.clone(),
            json!({"device_id": d["id"]}),
        )
        .await;
        assert_eq!(st, 201);
        let sid = v["id"].as_u64().unwrap();
        for i in 0..5 {
            let (st, _) = post(
                format!("{project}/sessions/{sid}/logs"),
                token.clone(),
                json!([{"level": "info", "message": format!("line {i}")}]),
            )
            .await;
            assert_eq!(st, 202);
        }
        sids.push(sid);
    }
    let r = c
        .delete(format!("{base}{org}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let metric = |base: String| {
        let c = c.clone();
        async move {
            let text = c
                .get(format!("{base}/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("fleetops_orgs_being_deleted "))
                .map(|v| v.trim().to_string())
                .unwrap()
        }
    };
    assert_eq!(metric(base.clone()).await, "1", "the purge is under way");
    tokio::time::sleep(Duration::from_millis(150)).await;
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    drop(p);
    {
        let store = crate::common::open_store(dir.path());
        assert_eq!(
            store.orgs_being_deleted().unwrap().len(),
            1,
            "killed mid-purge"
        );
        assert!(!store.project_residue(pid).unwrap().is_empty());
    }

    let p = serve(dir.path(), &[]);
    let base = p.base.clone();
    let mut finished = false;
    for _ in 0..200 {
        if metric(base.clone()).await == "0" {
            finished = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(finished, "the restart did not finish the purge");
    let r = c
        .get(format!("{base}{DEV}/sessions/{kept_sid}/logs"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["items"][0]["message"], "kept", "{v}");
    drop(p);
    let store = crate::common::open_store(dir.path());
    assert_eq!(store.project_residue(pid).unwrap(), Vec::<&str>::new());
    for sid in sids {
        assert!(store.session_by_id(sid).unwrap().is_none());
        assert_eq!(store.log_chunk_heads(sid).unwrap(), vec![]);
    }
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
}

each_backend!(admin_org_offline_lists_changes_and_deletes_an_organization);
/// `admin org` with the server stopped: list, show, rename and set-tier change the data
/// directory; a tier the configuration does not define, an unknown organization and a delete
/// without `--yes` are refused; a delete returns once everything of the organization is purged.
async fn admin_org_offline_lists_changes_and_deletes_an_organization() {
    let dir = tempfile::tempdir().unwrap();
    let v = admin_json(
        dir.path(),
        &[
            "bootstrap",
            "--email",
            "root@acme.io",
            "--password",
            "pw",
            "--org",
            "acme",
            "--project",
            "arms",
        ],
        &[],
    );
    assert_eq!(v["org"], "acme");
    admin_json(
        dir.path(),
        &[
            "bootstrap",
            "--email",
            "root@kept.io",
            "--password",
            "pw",
            "--org",
            "kept",
            "--project",
            "p",
        ],
        &[],
    );
    let list = admin_json(dir.path(), &["org", "list"], &[]);
    let slugs: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["slug"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(slugs, ["kept", "acme"], "{list}");
    assert_eq!(list["being_purged"], 0);

    let v = admin_json(dir.path(), &["org", "rename", "acme", "Acme Robotics"], &[]);
    assert_eq!(
        (&v["slug"], &v["name"]),
        (&json!("acme"), &json!("Acme Robotics"))
    );
    let v = admin_json(dir.path(), &["org", "set-tier", "acme", "enterprise"], &[]);
    assert_eq!(v["tier"], "enterprise");
    let v = admin_json(dir.path(), &["org", "show", "acme"], &[]);
    assert_eq!(
        (&v["name"], &v["tier"]),
        (&json!("Acme Robotics"), &json!("enterprise"))
    );

    let (ok, _, err) = admin(dir.path(), &["org", "set-tier", "acme", "platinum"], &[]);
    assert!(!ok);
    assert!(err.contains("tier: must be one of"), "{err}");
    let (ok, _, err) = admin(dir.path(), &["org", "show", "nobody"], &[]);
    assert!(!ok);
    assert!(err.contains("no organization nobody"), "{err}");
    let (ok, _, err) = admin(dir.path(), &["org", "delete", "acme"], &[]);
    assert!(!ok);
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(
        admin_json(dir.path(), &["org", "show", "acme"], &[])["slug"],
        "acme"
    );

    let pid = {
        let store = crate::common::open_store(dir.path());
        let org = store.org_by_slug("acme").unwrap().unwrap();
        store.project_by_slug(org.id, "arms").unwrap().unwrap().id
    };
    let v = admin_json(dir.path(), &["org", "delete", "acme", "--yes"], &[]);
    assert_eq!(v, json!({"deleted": "acme", "purging": false}));
    let list = admin_json(dir.path(), &["org", "list"], &[]);
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["being_purged"], 0);
    let store = crate::common::open_store(dir.path());
    assert_eq!(store.project_residue(pid).unwrap(), Vec::<&str>::new());
    assert_eq!(store.orgs_being_deleted().unwrap(), Vec::<u64>::new());
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
}

each_backend!(admin_org_goes_through_the_running_server);
/// `admin org` while the server runs: through its API with a superuser's key (a delete
/// returns with the purge under way in the server); without a key, or with a key that is
/// not a superuser's, it is refused.
async fn admin_org_goes_through_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let r = c
        .post(format!("{}/api/v1/organizations", p.base))
        .bearer_auth(&key)
        .json(&json!({"slug": "acme"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let url = p.base.clone();
    let remote = |args: &[&str]| {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(["--url".into(), url.clone()]);
        v
    };
    let run = |args: Vec<String>, token: &str| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        admin(dir.path(), &args, &[("FLEETOPS_TOKEN", token)])
    };

    let (ok, out, err) = run(remote(&["org", "list"]), &key);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let slugs: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["slug"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(slugs, ["acme", "default"], "{list}");
    let (ok, out, err) = run(remote(&["org", "set-tier", "acme", "team"]), &key);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["tier"], "team");
    let r: serde_json::Value = c
        .get(format!("{}/api/v1/organizations/acme", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["tier"], "team");

    // No key: told what to give; a key of a user who is not a superuser: the server's 403.
    let (ok, _, err) = admin(dir.path(), &["org", "list"], &[]);
    assert!(!ok);
    assert!(err.contains("--token"), "{err}");
    let r: serde_json::Value = c
        .post(format!("{}/api/v1/users", p.base))
        .bearer_auth(&key)
        .json(&json!({"email": "plain@acme.io", "password": "plain-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["id"].as_u64().is_some(), "{r}");
    let login: serde_json::Value = c
        .post(format!("{}/api/v1/auth/login", p.base))
        .json(&json!({"email": "plain@acme.io", "password": "plain-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let plain = login["access_token"].as_str().unwrap().to_string();
    let (ok, _, err) = run(remote(&["org", "list"]), &plain);
    assert!(!ok);
    assert!(err.contains("403"), "{err}");

    let (ok, out, err) = run(remote(&["org", "delete", "acme", "--yes"]), &key);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v, json!({"deleted": "acme", "purging": true}));
    let r = c
        .get(format!("{}/api/v1/organizations/acme", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
