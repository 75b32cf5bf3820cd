//! Configurations through the real server: the five formats, a three-level inheritance chain
//! with a schema on the root, explain, schema and parse failures, compatibility, the failed
//! parent rule, lists, downloads, deletes and what is refused.

use serde_json::{Value, json};

use crate::capsules::{CAPS, archive, publish, secret_post, sha};
use crate::common::*;

pub(crate) const CONFS: &str = "/api/v1/projects/default/default/configurations";

/// upload-url → PUT → confirm of a configuration file; returns (id, confirm response).
pub(crate) async fn configure(s: &Srv, body: Value, bytes: &[u8]) -> (u64, Resp) {
    let secret = &s.admin.project_secret;
    let r = secret_post(s, &format!("{CONFS}/upload-url"), secret, body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["expires_in"], 3600);
    let id = r.body["config_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    let put = s.http.put(&url).body(bytes.to_vec()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let c = secret_post(
        s,
        &format!("{CONFS}/{id}/confirm"),
        secret,
        json!({"checksum_sha256": sha(bytes)}),
    )
    .await;
    (id, c)
}

pub(crate) fn conf(name: &str, capsule: u64, format: &str, parent: Option<u64>) -> Value {
    json!({"name": name, "capsule_id": capsule, "version": "1.0.0", "environment": "prod",
           "compatible_capsule_versions": "^1.0.0", "file_format": format,
           "parent_config_id": parent})
}

/// A passed capsule `name` `version`; returns its id.
pub(crate) async fn capsule(s: &Srv, name: &str, version: &str) -> u64 {
    let r = publish(s, name, version, ".tar", &archive(".tar", b"x"), json!([])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "passed");
    r.body["id"].as_u64().unwrap()
}

each_backend!(inheritance_schema_explain_lists_and_deletes);
async fn inheritance_schema_explain_lists_and_deletes() {
    let s = start().await;
    let nav = capsule(&s, "nav", "1.2.0").await;

    // Root: YAML with the schema every descendant inherits.
    let mut body = conf("base", nav, ".yaml", None);
    body["validation_schema"] = json!({"type": "object", "required": ["motor"],
        "properties": {"motor": {"type": "object",
            "properties": {"speed": {"type": "integer", "maximum": 100}}}}});
    body["description"] = json!("shared defaults");
    let yaml = b"motor:\n  speed: 10\n  torque: 5\nlog_level: info\n";
    let (base, r) = configure(&s, body, yaml).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    assert_eq!(
        r.body["config_data"],
        json!({"motor": {"speed": 10, "torque": 5}, "log_level": "info"})
    );
    assert_eq!(r.body["override_fields"], r.body["config_data"]);
    assert_eq!(r.body["file_size_bytes"], yaml.len());
    assert_eq!(r.body["checksum_sha256"], sha(yaml));
    assert_eq!(r.body["parent_config_id"], Value::Null);

    // Middle: TOML over the root.
    let toml = b"[motor]\nspeed = 20\n\n[net]\nport = 8080\n";
    let (mid, r) = configure(&s, conf("mid", nav, ".toml", Some(base)), toml).await;
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    assert_eq!(
        r.body["override_fields"],
        json!({"motor": {"speed": 20}, "net": {"port": 8080}})
    );

    // Leaf: JSON over the middle.
    let leaf_json = br#"{"log_level": "debug", "motor": {"torque": 7}}"#;
    let (leaf, r) = configure(&s, conf("leaf", nav, ".json", Some(mid)), leaf_json).await;
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    let want = json!({"motor": {"speed": 20, "torque": 7}, "log_level": "debug",
                      "net": {"port": 8080}});
    assert_eq!(r.body["config_data"], want);
    assert_eq!(r.body["parent_config_id"], mid);

    // Explain: who set every leaf, and the inherited schema.
    let e = s.get(&format!("{CONFS}/{leaf}/explain"), s.key()).await;
    assert_eq!(e.status, 200, "{}", e.body);
    let chain: Vec<u64> = e.body["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    assert_eq!(chain, vec![base, mid, leaf]);
    assert_eq!(e.body["config_data"], want);
    let by = |ptr: &str| {
        e.body["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["pointer"] == ptr)
            .map(|x| (x["set_by"]["id"].as_u64().unwrap(), x["value"].clone()))
            .unwrap_or_else(|| panic!("no source for {ptr}: {}", e.body))
    };
    assert_eq!(by("/motor/speed"), (mid, json!(20)));
    assert_eq!(by("/motor/torque"), (leaf, json!(7)));
    assert_eq!(by("/log_level"), (leaf, json!("debug")));
    assert_eq!(by("/net/port"), (mid, json!(8080)));
    assert_eq!(e.body["sources"].as_array().unwrap().len(), 4);
    assert_eq!(e.body["schema_from"]["id"], base);
    assert_eq!(e.body["schema_errors"], json!([]));

    // A schema violation fails the configuration, located by JSON Pointer.
    let (bad, r) = configure(
        &s,
        conf("too-fast", nav, ".json", Some(leaf)),
        br#"{"motor": {"speed": 500}}"#,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["validation_status"], "failed");
    let notes = r.body["validation_notes"].as_str().unwrap();
    assert!(notes.contains("/motor/speed"), "{notes}");
    let e = s.get(&format!("{CONFS}/{bad}/explain"), s.key()).await;
    assert_eq!(e.body["schema_errors"][0]["pointer"], "/motor/speed");
    // ... and a failed parent fails its child, whatever the child says.
    let (_, r) = configure(&s, conf("child-of-bad", nav, ".env", Some(bad)), b"A=1\n").await;
    assert_eq!(r.body["validation_status"], "failed");
    assert!(
        r.body["validation_notes"]
            .as_str()
            .unwrap()
            .contains(&format!("parent configuration {bad}")),
        "{}",
        r.body
    );

    // The detail's download link returns the uploaded bytes.
    let d = s.get(&format!("{CONFS}/{base}"), s.key()).await;
    assert_eq!(d.status, 200);
    assert_eq!(d.body["description"], "shared defaults");
    assert_eq!(d.body["validation_schema"]["required"], json!(["motor"]));
    let got = s
        .http
        .get(d.body["download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), yaml.to_vec());

    // Lists: paginated, newest first, filtered by capsule and environment.
    let l = s.get(&format!("{CONFS}?page_size=3"), s.key()).await;
    assert_eq!(l.status, 200);
    assert_eq!(l.body["total"], 5);
    assert_eq!(l.body["items"].as_array().unwrap().len(), 3);
    assert_eq!(l.body["has_more"], true);
    let other = capsule(&s, "arm", "1.0.0").await;
    let mut staging = conf("arm-conf", other, ".env", None);
    staging["environment"] = json!("staging");
    let (_, r) = configure(&s, staging, b"A=1\n").await;
    assert_eq!(r.body["validation_status"], "passed");
    let l = s.get(&format!("{CONFS}?capsule_id={other}"), s.key()).await;
    assert_eq!(l.body["total"], 1);
    let l = s
        .get(&format!("{CONFS}?environment=staging"), s.key())
        .await;
    assert_eq!(l.body["total"], 1);
    assert_eq!(l.body["items"][0]["name"], "arm-conf");
    let l = s.get(&format!("{CONFS}?environment=prod"), s.key()).await;
    assert_eq!(l.body["total"], 5);
    let l = s.get(&format!("{CONFS}?capsule_id=x"), s.key()).await;
    l.assert_error(422);

    // Deletes: 409 while a child refers to it; a capsule with configurations is kept (409).
    let r = s.delete(&format!("{CONFS}/{base}"), s.key()).await;
    assert!(r.assert_error(409).contains("parent"), "{}", r.body);
    let r = s.delete(&format!("{CAPS}/{nav}"), s.key()).await;
    r.assert_error(409);
    // One nothing refers to goes.
    let (lone, _) = configure(&s, conf("lone", nav, ".env", None), b"A=1\n").await;
    assert_eq!(
        s.delete(&format!("{CONFS}/{lone}"), s.key()).await.status,
        204
    );
    s.get(&format!("{CONFS}/{lone}"), s.key())
        .await
        .assert_error(404);
}

each_backend!(ini_env_and_unparsable_files);
/// INI and .env parse on their own, nothing is expanded from the server's environment, and
/// unparsable files fail with the parser's message (YAML aliases refused).
async fn ini_env_and_unparsable_files() {
    let s = start().await;
    let nav = capsule(&s, "nav", "1.2.0").await;
    // INI and .env on their own.
    let (_, r) = configure(
        &s,
        conf("ini", nav, ".ini", None),
        b"mode = fast\n[motor]\nspeed = 10\n[net]\nhost = a.local\n",
    )
    .await;
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    assert_eq!(
        r.body["config_data"],
        json!({"mode": "fast", "motor": {"speed": "10"}, "net": {"host": "a.local"}})
    );
    let (_, r) = configure(
        &s,
        conf("env", nav, ".env", None),
        b"# robot\nSPEED=10\nexport NAME=\"two words\"\nHOME_DIR=${HOME}\nJWT=${FLEETOPS_JWT_SECRET}\n",
    )
    .await;
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    // Nothing is expanded from the server's environment.
    assert_eq!(
        r.body["config_data"],
        json!({"SPEED": "10", "NAME": "two words", "HOME_DIR": "${HOME}",
               "JWT": "${FLEETOPS_JWT_SECRET}"})
    );

    // Unparsable files fail with the parser's message; YAML aliases are refused.
    for (name, format, bytes, says) in [
        ("broken-json", ".json", &b"{\"a\": "[..], "JSON"),
        ("broken-toml", ".toml", &b"a = = 1"[..], "TOML"),
        ("broken-yaml", ".yaml", &b"a: [1, 2"[..], "YAML"),
        ("alias-yaml", ".yaml", &b"a: &x {b: 1}\nc: *x\n"[..], "YAML"),
        ("list-json", ".json", &b"[1, 2]"[..], "top level"),
    ] {
        let (_, r) = configure(&s, conf(name, nav, format, None), bytes).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body["validation_status"], "failed", "{name}");
        let notes = r.body["validation_notes"].as_str().unwrap();
        assert!(notes.contains(says), "{name}: {notes}");
    }
}

each_backend!(compatibility_pending_parents_and_refusals);
async fn compatibility_pending_parents_and_refusals() {
    let s = start().await;
    let secret = s.admin.project_secret.clone();
    let nav = capsule(&s, "nav", "1.2.0").await;
    let url = format!("{CONFS}/upload-url");

    // compatible_capsule_versions must match the linked capsule.
    let mut body = conf("wants-2", nav, ".json", None);
    body["compatible_capsule_versions"] = json!("^2.0.0");
    let (_, r) = configure(&s, body, b"{}").await;
    assert_eq!(r.body["validation_status"], "failed");
    assert!(
        r.body["validation_notes"]
            .as_str()
            .unwrap()
            .contains("compatible_capsule_versions"),
        "{}",
        r.body
    );

    // A child confirmed before its parent: 409, and it can be confirmed after.
    let r = secret_post(&s, &url, &secret, conf("parent", nav, ".json", None)).await;
    let parent = r.body["config_id"].as_u64().unwrap();
    let parent_url = r.body["upload_url"].as_str().unwrap().to_string();
    let (child, r) = configure(&s, conf("child", nav, ".json", Some(parent)), b"{\"b\": 2}").await;
    assert!(
        r.assert_error(409).contains("confirm it first"),
        "{}",
        r.body
    );
    s.http
        .put(&parent_url)
        .body("{\"a\": 1}")
        .send()
        .await
        .unwrap();
    let r = secret_post(
        &s,
        &format!("{CONFS}/{parent}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(b"{\"a\": 1}")}),
    )
    .await;
    assert_eq!(r.body["validation_status"], "passed");
    let r = secret_post(
        &s,
        &format!("{CONFS}/{child}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(b"{\"b\": 2}")}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["config_data"], json!({"a": 1, "b": 2}));

    // Credentials: the project secret only.
    let r = s.post(&url, s.key(), conf("x", nav, ".json", None)).await;
    r.assert_error(401);
    secret_post(&s, &url, "wrong", conf("x", nav, ".json", None))
        .await
        .assert_error(401);

    // 422s, 409s, 413s, 400s.
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"version": "1.0"}), 422, "version"),
        (json!({"version": "v1.0.0"}), 422, "version"),
        (json!({"file_format": ".xml"}), 422, "file_format"),
        (
            json!({"compatible_capsule_versions": "=>1"}),
            422,
            "compatible_capsule_versions",
        ),
        (json!({"capsule_id": 999_999}), 422, "capsule_id"),
        (
            json!({"parent_config_id": 999_999}),
            422,
            "parent_config_id",
        ),
        (json!({"environment": ""}), 422, "environment"),
        (
            json!({"validation_schema": {"type": 5}}),
            422,
            "validation_schema",
        ),
        (json!({"file_size_bytes": 2 * 1024 * 1024}), 413, "at most"),
        (json!({"name": "parent"}), 409, "already exists"),
    ];
    for (patch, status, says) in cases {
        let mut b = conf("case", nav, ".json", None);
        for (k, v) in patch.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = secret_post(&s, &url, &secret, b.clone()).await;
        let detail = r.assert_error(status);
        assert!(detail.contains(says), "{b}: {detail}");
    }

    // A parent from another project is refused like an unknown one.
    let r = s
        .post(
            "/api/v1/organizations/default/projects",
            s.key(),
            json!({"slug": "other"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let other_secret = r.body["project_secret"].as_str().unwrap().to_string();
    let other_caps = "/api/v1/projects/default/other/capsules";
    let r = secret_post(
        &s,
        &format!("{other_caps}/upload-url"),
        &other_secret,
        json!({"name": "nav", "version": "1.2.0", "capsule_type": "SW", "file_format": ".tar",
               "file_size_bytes": 10}),
    )
    .await;
    let other_nav = r.body["capsule_id"].as_u64().unwrap();
    let r = secret_post(
        &s,
        "/api/v1/projects/default/other/configurations/upload-url",
        &other_secret,
        conf("cross", other_nav, ".json", Some(parent)),
    )
    .await;
    assert!(r.assert_error(422).contains("parent_config_id"));

    // Confirm before upload, checksum mismatch, oversize uploads, immutable bytes.
    let r = secret_post(&s, &url, &secret, conf("c2", nav, ".json", None)).await;
    let id = r.body["config_id"].as_u64().unwrap();
    let put_url = r.body["upload_url"].as_str().unwrap().to_string();
    let confirm = format!("{CONFS}/{id}/confirm");
    secret_post(
        &s,
        &confirm,
        &secret,
        json!({"checksum_sha256": sha(b"{}")}),
    )
    .await
    .assert_error(409);
    let big = vec![b' '; 1024 * 1024 + 1];
    let put = s.http.put(&put_url).body(big).send().await.unwrap();
    assert_eq!(put.status(), 413);
    s.http.put(&put_url).body("{}").send().await.unwrap();
    let r = secret_post(
        &s,
        &confirm,
        &secret,
        json!({"checksum_sha256": sha(b"{ }")}),
    )
    .await;
    assert_eq!(r.assert_error(400), "Checksum mismatch");
    let d = s.get(&format!("{CONFS}/{id}"), s.key()).await;
    assert_eq!(d.body["validation_status"], "failed");
    let put = s.http.put(&put_url).body("{}").send().await.unwrap();
    assert_eq!(put.status(), 409);
    // A declared size caps the upload.
    let mut b = conf("c3", nav, ".json", None);
    b["file_size_bytes"] = json!(4);
    let r = secret_post(&s, &url, &secret, b).await;
    let put_url = r.body["upload_url"].as_str().unwrap().to_string();
    let put = s.http.put(&put_url).body("{\"a\":1}").send().await.unwrap();
    assert_eq!(put.status(), 413);
    // Another project's configuration is 404 here.
    s.get(&format!("{CONFS}/999999"), s.key())
        .await
        .assert_error(404);
}

each_backend!(every_constraint_form);
/// Every constraint form (exact, `^`, `~`, ranges, wildcards), through
/// `compatible_capsule_versions`: a configuration passes exactly when its linked capsule's
/// version matches.
async fn every_constraint_form() {
    let s = start().await;
    let secret = s.admin.project_secret.clone();
    let one = capsule(&s, "core", "1.2.3").await;
    let zero = capsule(&s, "core", "0.2.5").await;
    let cases = [
        (one, "1.2.3", true),
        (one, "1.2.4", false),
        (one, "1.2", true),
        (one, "1", true),
        (one, "1.2.*", true),
        (one, "1.3.*", false),
        (one, "1.*", true),
        (one, "2.*", false),
        (one, "^1.0.0", true),
        (one, "^1.3.0", false),
        (one, "~1.2.0", true),
        (one, "~1.1.0", false),
        (one, ">=1.2.0", true),
        (one, "<1.2.3", false),
        (one, ">=1.0.0, <2.0.0", true),
        (one, ">1.2.3,<2.0.0", false),
        (zero, "^0.2.3", true),
        (zero, "^0.3.0", false),
        (zero, "^0.1.0", false),
        (zero, "~0.2.0", true),
    ];
    for (i, (cap, constraint, passes)) in cases.iter().enumerate() {
        let mut b = conf(&format!("c{i}"), *cap, ".json", None);
        b["compatible_capsule_versions"] = json!(constraint);
        let (_, r) = configure(&s, b, b"{}").await;
        assert_eq!(r.status, 200, "{constraint}: {}", r.body);
        let want = if *passes { "passed" } else { "failed" };
        assert_eq!(
            r.body["validation_status"], want,
            "{constraint}: {}",
            r.body
        );
    }
    for bad in [
        "1.2.3.4",
        "v1.2.3",
        "",
        "^",
        "1.2.3 || 2.0.0",
        "01.2.3",
        "1.2.3-beta",
    ] {
        let mut b = conf("bad", one, ".json", None);
        b["compatible_capsule_versions"] = json!(bad);
        let r = secret_post(&s, &format!("{CONFS}/upload-url"), &secret, b).await;
        assert!(
            r.assert_error(422).contains("compatible_capsule_versions"),
            "{bad}: {}",
            r.body
        );
    }
}
