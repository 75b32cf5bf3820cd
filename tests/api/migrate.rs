//! `fleetops admin migrate --to postgres://...`: an embedded store copied into an empty
//! PostgreSQL database (the suite's private cluster), then served from it with the same
//! answers. Only in the `api` binary: its servers are the embedded ones being migrated.

use serde_json::{Value, json};

use crate::cli::{client, device_and_session, field, serve};
use crate::common::DEV;

async fn get(c: &reqwest::Client, url: String, key: &str) -> Value {
    let r = c.get(url).bearer_auth(key).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// What a user reads of the store: devices, a session and its logs, the organizations.
async fn answers(c: &reqwest::Client, base: &str, key: &str, sid: u64) -> Vec<Value> {
    let mut out = Vec::new();
    for path in [
        format!("{DEV}/devices"),
        format!("{DEV}/sessions/{sid}"),
        format!("{DEV}/sessions/{sid}/logs?limit=1000"),
        format!("{DEV}/sessions/{sid}/logs?level=error"),
        "/api/v1/organizations".to_string(),
    ] {
        let mut v = get(c, format!("{base}{path}"), key).await;
        // A device's online status follows the clock, not the store.
        if let Some(items) = v["items"].as_array_mut() {
            for d in items {
                if let Some(o) = d.as_object_mut() {
                    o.remove("status");
                }
            }
        }
        out.push(v);
    }
    out
}

fn migrate(dir: &std::path::Path, url: &str) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleetops"))
        .args(["admin", "migrate", "--to", url])
        .current_dir(dir)
        .env("FLEETOPS_DATA_DIR", dir.join("data"))
        .env("FLEETOPS_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `fleetops serve` on `dir`, with or without a database, expected to stop at once:
/// (whether it exited 0, its standard error).
fn start_fails(dir: &std::path::Path, url: Option<&str>) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fleetops"));
    cmd.arg("serve")
        .current_dir(dir)
        .env("FLEETOPS_LISTEN", "127.0.0.1:0")
        .env("FLEETOPS_DATA_DIR", dir.join("data"))
        .env("FLEETOPS_LOG", "warn");
    if let Some(u) = url {
        cmd.env("FLEETOPS_DATABASE_URL", u);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

sled_only!(a_migrated_store_answers_the_same_from_postgres_and_its_ids_go_on);
async fn a_migrated_store_answers_the_same_from_postgres_and_its_ids_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let url = crate::common::postgres::database_for(&dir.path().join("pg"));
    let p = serve(dir.path(), &[]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (token, sid) = device_and_session(&c, &base, &key).await;
    let lines: Vec<Value> = (0..300)
        .map(|i| json!({"level": if i % 7 == 0 { "error" } else { "info" }, "message": format!("line {i}"), "module": "arm"}))
        .collect();
    for batch in lines.chunks(100) {
        let r = c
            .post(format!("{base}{DEV}/sessions/{sid}/logs"))
            .bearer_auth(&token)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let before = answers(&c, &base, &key, sid).await;
    assert_eq!(before[2]["total"], 300);

    // While it serves, the data directory is held: refused, nothing copied.
    let (ok, _, err) = migrate(dir.path(), &url);
    assert!(!ok && err.contains("stop it"), "{err}");
    drop(p);
    // Not migrated yet, a start on the database is refused rather than starting empty.
    let (ok, err) = start_fails(dir.path(), Some(&url));
    assert!(!ok && err.contains("admin migrate"), "{err}");

    let (ok, out, err) = migrate(dir.path(), &url);
    assert!(ok, "{out}{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(report["keys"]["records"].as_u64().unwrap() > 10, "{report}");
    assert!(report["keys"]["logs"].as_u64().unwrap() >= 3, "{report}");
    // A second run finds the directory moved over already.
    let (ok, _, err) = migrate(dir.path(), &url);
    assert!(
        !ok && err.contains("keeps its records in postgres"),
        "{err}"
    );
    // Another embedded store into the same (now full) database: refused.
    let other = tempfile::tempdir().unwrap();
    drop(serve(other.path(), &[]));
    let (ok, _, err) = migrate(other.path(), &url);
    assert!(!ok && err.contains("empty one"), "{err}");

    // Once migrated, a start without the database is refused rather than serving the stale
    // embedded copy.
    let (ok, err) = start_fails(dir.path(), None);
    assert!(
        !ok && err.contains("keeps its records in postgres"),
        "{err}"
    );

    // Served from PostgreSQL (the embedded files moved away, so nothing can come from them).
    std::fs::rename(dir.path().join("data/db"), dir.path().join("sled-db")).unwrap();
    let p = serve(dir.path(), &[("FLEETOPS_DATABASE_URL", url.as_str())]);
    assert!(
        field(&p.stdout, "API key:").is_none(),
        "the migrated server is not a first start"
    );
    let base = p.base.clone();
    assert_eq!(answers(&c, &base, &key, sid).await, before);
    // New ids continue after the copied ones; the device's token still works.
    let r: Value = c
        .post(format!("{base}{DEV}/devices"))
        .bearer_auth(&key)
        .json(&json!({"name": "r2"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        r["id"].as_u64().unwrap() > before[0]["items"][0]["id"].as_u64().unwrap(),
        "{r}"
    );
    let r = c
        .post(format!("{base}{DEV}/sessions/{sid}/logs"))
        .bearer_auth(&token)
        .json(&json!([{"level": "info", "message": "after"}]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let v = get(&c, format!("{base}{DEV}/sessions/{sid}/logs?limit=1"), &key).await;
    assert_eq!(v["total"], 301);
}
