//! Capsules through the real server: upload URL (project secret), PUT to the presigned URL,
//! confirm with server-side SHA-256 and archive checks, is_latest, dependencies, downloads,
//! quotas, and what is refused.

use std::io::Write;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::*;

pub(crate) const CAPS: &str = "/api/v1/projects/default/default/capsules";

fn tar_bytes(payload: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(payload.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "app/main.bin", payload).unwrap();
    b.into_inner().unwrap()
}

pub(crate) fn archive(format: &str, payload: &[u8]) -> Vec<u8> {
    match format {
        ".tar" => tar_bytes(payload),
        ".tar.gz" | ".tgz" => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&tar_bytes(payload)).unwrap();
            gz.finish().unwrap()
        }
        ".zip" => {
            let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
            z.start_file("app/main.bin", zip::write::SimpleFileOptions::default())
                .unwrap();
            z.write_all(payload).unwrap();
            z.finish().unwrap().into_inner()
        }
        _ => unreachable!(),
    }
}

pub(crate) fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

pub(crate) async fn secret_post(s: &Srv, path: &str, secret: &str, body: Value) -> Resp {
    s.raw(
        s.http
            .post(s.url(path))
            .header("X-Project-Secret", secret)
            .json(&body),
    )
    .await
}

/// upload-url → PUT → confirm; returns the confirm response.
pub(crate) async fn publish(
    s: &Srv,
    name: &str,
    version: &str,
    format: &str,
    bytes: &[u8],
    deps: Value,
) -> Resp {
    let secret = &s.admin.project_secret;
    let r = secret_post(
        s,
        &format!("{CAPS}/upload-url"),
        secret,
        json!({"name": name, "version": version, "capsule_type": "SW", "file_format": format,
               "file_size_bytes": bytes.len(), "metadata": {"arch": "arm64"}, "dependencies": deps}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["capsule_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(r.body["expires_in"].as_i64().unwrap() > 0);
    let put = s.http.put(&url).body(bytes.to_vec()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    secret_post(
        s,
        &format!("{CAPS}/{id}/confirm"),
        secret,
        json!({"checksum_sha256": sha(bytes)}),
    )
    .await
}

each_backend!(a_failed_retry_of_an_upload_keeps_the_bytes_already_acknowledged);
/// An upload acknowledged 200 survives a retry of its link that fails (too large, or a body
/// cut off): the failed write never replaces it, and the capsule confirms from the first
/// bytes.
async fn a_failed_retry_of_an_upload_keeps_the_bytes_already_acknowledged() {
    let s = start().await;
    let secret = &s.admin.project_secret;
    let bytes = archive(".tar.gz", b"kept");
    let r = secret_post(
        &s,
        &format!("{CAPS}/upload-url"),
        secret,
        json!({"name": "kept", "version": "1.0.0", "capsule_type": "SW", "file_format": ".tar.gz",
               "file_size_bytes": bytes.len()}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["capsule_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    let put = s.http.put(&url).body(bytes.clone()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let too_big = s
        .http
        .put(&url)
        .body(vec![7u8; bytes.len() + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
    // A body that ends early: the stream fails part-way.
    let cut = futures::stream::iter(vec![
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 8])),
        Err(std::io::Error::other("the sender hung up")),
    ]);
    let _ = s
        .http
        .put(&url)
        .body(reqwest::Body::wrap_stream(cut))
        .send()
        .await;
    // The cut-off upload's handler may still hold the file's upload lock a moment (409).
    let mut r = None;
    for _ in 0..100 {
        let c = secret_post(
            &s,
            &format!("{CAPS}/{id}/confirm"),
            secret,
            json!({"checksum_sha256": sha(&bytes)}),
        )
        .await;
        if c.status != 409 {
            r = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = r.expect("the upload lock was released");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    let d = s.get(&format!("{CAPS}/{id}"), s.key()).await;
    let got = s
        .http
        .get(d.body["download_url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(got.bytes().await.unwrap().to_vec(), bytes);
}

each_backend!(every_format_round_trips_and_corrupt_ones_fail);
async fn every_format_round_trips_and_corrupt_ones_fail() {
    let s = start().await;
    for (i, format) in [".tar.gz", ".tgz", ".tar", ".zip"].iter().enumerate() {
        let bytes = archive(format, format!("payload {i}").as_bytes());
        let r = publish(&s, &format!("app{i}"), "1.0.0", format, &bytes, json!([])).await;
        assert_eq!(r.status, 200, "{format}: {}", r.body);
        let c = &r.body;
        assert_eq!(c["validation_status"], "passed", "{format}: {c}");
        assert_eq!(c["is_latest"], true);
        assert_eq!(c["checksum_sha256"], sha(&bytes));
        assert_eq!(c["file_format"], *format);
        assert_eq!(c["metadata"], json!({"arch": "arm64"}));
        assert_eq!(
            (
                c["version_major"].clone(),
                c["version_minor"].clone(),
                c["version_patch"].clone()
            ),
            (json!(1), json!(0), json!(0))
        );
        // The detail's download link gives the same bytes.
        let id = c["id"].as_u64().unwrap();
        let d = s.get(&format!("{CAPS}/{id}"), s.key()).await;
        assert_eq!(d.status, 200);
        assert_eq!(d.body["all_versions"], json!(["1.0.0"]));
        let got = s
            .http
            .get(d.body["download_url"].as_str().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(got.status(), 200);
        assert_eq!(got.bytes().await.unwrap().to_vec(), bytes);
    }
    // A corrupt archive fails with a note; a declared .zip that is a tar fails too.
    let mut bad = archive(".tar.gz", b"x");
    let n = bad.len();
    bad.truncate(n / 2);
    let r = publish(&s, "broken", "1.0.0", ".tar.gz", &bad, json!([])).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["validation_status"], "failed");
    assert!(!r.body["validation_notes"].as_str().unwrap().is_empty());
    assert_eq!(r.body["is_latest"], false);
    let r = publish(
        &s,
        "liar",
        "1.0.0",
        ".zip",
        &archive(".tar", b"x"),
        json!([]),
    )
    .await;
    assert_eq!(r.body["validation_status"], "failed");
    assert!(
        r.body["validation_notes"].as_str().unwrap().contains("zip"),
        "{}",
        r.body
    );
}

each_backend!(checksum_mismatch_upload_rules_and_credentials);
async fn checksum_mismatch_upload_rules_and_credentials() {
    let s = start().await;
    let secret = s.admin.project_secret.clone();
    let bytes = archive(".tar", b"abc");
    let body = json!({"name": "nav", "version": "2.0.0", "capsule_type": "FW", "file_format": ".tar", "file_size_bytes": bytes.len()});
    // Only the project secret opens upload-url: a JWT or API key alone is 401, so is a wrong
    // secret or an unknown project.
    s.post(&format!("{CAPS}/upload-url"), s.key(), body.clone())
        .await
        .assert_error(401);
    secret_post(&s, &format!("{CAPS}/upload-url"), "wrong", body.clone())
        .await
        .assert_error(401);
    secret_post(
        &s,
        "/api/v1/projects/default/nope/capsules/upload-url",
        &secret,
        body.clone(),
    )
    .await
    .assert_error(401);
    secret_post(
        &s,
        "/api/v1/projects/nope/default/capsules/upload-url",
        &secret,
        body.clone(),
    )
    .await
    .assert_error(401);
    for (k, v) in [
        ("version", json!("v2.0.0")),
        ("version", json!("2.0")),
        ("version", json!("2.0.0-rc1")),
        ("capsule_type", json!("APP")),
        ("file_format", json!(".rar")),
        ("name", json!("-bad")),
        ("file_size_bytes", json!(0)),
    ] {
        let mut b = body.clone();
        b[k] = v;
        secret_post(&s, &format!("{CAPS}/upload-url"), &secret, b)
            .await
            .assert_error(422);
    }
    let mut b = body.clone();
    b["dependencies"] = json!([{"name": "x", "version": "latest"}]);
    secret_post(&s, &format!("{CAPS}/upload-url"), &secret, b)
        .await
        .assert_error(422);

    let r = secret_post(&s, &format!("{CAPS}/upload-url"), &secret, body.clone()).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["expires_in"], 3600);
    let id = r.body["capsule_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    secret_post(&s, &format!("{CAPS}/upload-url"), &secret, body.clone())
        .await
        .assert_error(409);
    // Confirm before any upload: 409. More than declared: 413 (the link still works).
    secret_post(
        &s,
        &format!("{CAPS}/{id}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await
    .assert_error(409);
    let too_big = s
        .http
        .put(&url)
        .body(vec![0u8; bytes.len() + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
    // A tampered link is refused.
    let tampered = format!("{}x", url);
    assert_eq!(
        s.http
            .put(&tampered)
            .body(bytes.clone())
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        s.http
            .put(&url)
            .body(bytes.clone())
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Wrong checksum: 400 and the capsule fails.
    let r = secret_post(
        &s,
        &format!("{CAPS}/{id}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(b"other")}),
    )
    .await;
    assert_eq!(r.assert_error(400), "Checksum mismatch");
    let d = s.get(&format!("{CAPS}/{id}"), s.key()).await;
    assert_eq!(d.body["validation_status"], "failed");
    // Confirmed bytes are immutable.
    assert_eq!(
        s.http
            .put(&url)
            .body(bytes.clone())
            .send()
            .await
            .unwrap()
            .status(),
        409
    );
    secret_post(
        &s,
        &format!("{CAPS}/{id}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await
    .assert_error(409);
    // Reading needs a member's credentials; the secret alone does not read.
    let r = s
        .raw(s.http.get(s.url(CAPS)).header("X-Project-Secret", &secret))
        .await;
    r.assert_error(401);
    s.get(&format!("{CAPS}/999999"), s.key())
        .await
        .assert_error(404);
}

each_backend!(latest_versions_dependencies_delete_and_concurrency);
async fn latest_versions_dependencies_delete_and_concurrency() {
    let s = start().await;
    let k = s.key().to_string();
    for v in ["1.2.0", "1.10.0", "0.9.0"] {
        let r = publish(
            &s,
            "core",
            v,
            ".tar",
            &archive(".tar", v.as_bytes()),
            json!([]),
        )
        .await;
        assert_eq!(r.body["validation_status"], "passed");
    }
    let list = s.get(&format!("{CAPS}?name=core"), &k).await;
    assert!(list.body.is_array(), "a bare array");
    let latest: Vec<_> = list
        .body
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["is_latest"] == true)
        .map(|c| c["version"].clone())
        .collect();
    assert_eq!(latest, vec![json!("1.10.0")]);
    assert_eq!(
        s.get(&format!("{CAPS}?latest_only=true"), &k)
            .await
            .body
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(s.get(&format!("{CAPS}?type=FW"), &k).await.body, json!([]));
    s.get(&format!("{CAPS}?type=APP"), &k)
        .await
        .assert_error(422);
    let any = list.body[0]["id"].as_u64().unwrap();
    let d = s.get(&format!("{CAPS}/{any}"), &k).await;
    assert_eq!(d.body["all_versions"], json!(["1.10.0", "1.2.0", "0.9.0"]));

    // Dependencies: met, unmet.
    let r = publish(
        &s,
        "ui",
        "1.0.0",
        ".tar",
        &archive(".tar", b"ui"),
        json!([{"name": "core", "version": "^1.2.0"}]),
    )
    .await;
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    assert_eq!(
        r.body["dependencies"],
        json!([{"name": "core", "version": "^1.2.0"}])
    );
    let r = publish(
        &s,
        "ui",
        "2.0.0",
        ".tar",
        &archive(".tar", b"ui2"),
        json!([{"name": "core", "version": "2.*"}]),
    )
    .await;
    assert_eq!(r.body["validation_status"], "failed");
    assert!(
        r.body["validation_notes"]
            .as_str()
            .unwrap()
            .contains("core")
    );

    // A capsule another one depends on cannot go; deleting the latest moves is_latest.
    let core_latest = s
        .get(&format!("{CAPS}?name=core&latest_only=true"), &k)
        .await
        .body[0]["id"]
        .as_u64()
        .unwrap();
    s.delete(&format!("{CAPS}/{core_latest}"), &k)
        .await
        .assert_error(409);
    let ui1 = s
        .get(&format!("{CAPS}?name=ui&latest_only=true"), &k)
        .await
        .body[0]["id"]
        .as_u64()
        .unwrap();
    assert_eq!(s.delete(&format!("{CAPS}/{ui1}"), &k).await.status, 204);
    assert_eq!(
        s.delete(&format!("{CAPS}/{core_latest}"), &k).await.status,
        204
    );
    let latest: Vec<_> = s
        .get(&format!("{CAPS}?name=core&latest_only=true"), &k)
        .await
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["version"].clone())
        .collect();
    assert_eq!(latest, vec![json!("1.2.0")]);

    // Concurrent confirms of several versions leave exactly one latest.
    let s = std::sync::Arc::new(s);
    let mut tasks = Vec::new();
    for minor in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let v = format!("3.{minor}.0");
            publish(
                &s,
                "burst",
                &v,
                ".tar",
                &archive(".tar", v.as_bytes()),
                json!([]),
            )
            .await
            .status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let all = s.get(&format!("{CAPS}?name=burst"), &k).await.body;
    let latest: Vec<_> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["is_latest"] == true)
        .map(|c| c["version"].clone())
        .collect();
    assert_eq!(latest, vec![json!("3.7.0")]);
}

each_backend!(storage_quota_is_checked_at_upload_url);
async fn storage_quota_is_checked_at_upload_url() {
    let s = start_with(|c| {
        c.tiers.get_mut("free").unwrap().storage_bytes = Some(10_000);
    })
    .await;
    let secret = s.admin.project_secret.clone();
    let ok = json!({"name": "a", "version": "1.0.0", "capsule_type": "OS", "file_format": ".tar", "file_size_bytes": 6_000});
    assert_eq!(
        secret_post(&s, &format!("{CAPS}/upload-url"), &secret, ok)
            .await
            .status,
        201
    );
    let over = json!({"name": "a", "version": "1.0.1", "capsule_type": "OS", "file_format": ".tar", "file_size_bytes": 5_000});
    secret_post(&s, &format!("{CAPS}/upload-url"), &secret, over)
        .await
        .assert_error(413);
    let fits = json!({"name": "a", "version": "1.0.1", "capsule_type": "OS", "file_format": ".tar", "file_size_bytes": 3_000});
    let r = secret_post(&s, &format!("{CAPS}/upload-url"), &secret, fits).await;
    assert_eq!(r.status, 201);
    let cap = r.body["capsule_id"].as_u64().unwrap();
    // Configurations count too: their declared size, else 1 MiB reserved.
    let confs = "/api/v1/projects/default/default/configurations/upload-url";
    let mut c = crate::configurations::conf("c", cap, ".json", None);
    secret_post(&s, confs, &secret, c.clone())
        .await
        .assert_error(413);
    c["file_size_bytes"] = json!(1_001);
    secret_post(&s, confs, &secret, c.clone())
        .await
        .assert_error(413);
    c["file_size_bytes"] = json!(1_000);
    assert_eq!(secret_post(&s, confs, &secret, c).await.status, 201);
}

/// Projects `q0`, `q1`, ... of organization `default`; their project secrets.
async fn projects(s: &Srv, n: usize) -> Vec<String> {
    let mut secrets = Vec::new();
    for i in 0..n {
        let r = s
            .post(
                "/api/v1/organizations/default/projects",
                s.key(),
                json!({"slug": format!("q{i}")}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        secrets.push(r.body["project_secret"].as_str().unwrap().to_string());
    }
    secrets
}

each_backend!(concurrent_uploads_across_projects_never_exceed_the_quota);
/// The quota is the organization's, and its projects have separate writers: 16 reservations
/// racing across 4 projects at the edge must together stay within it.
async fn concurrent_uploads_across_projects_never_exceed_the_quota() {
    let s = start_with(|c| {
        c.tiers.get_mut("free").unwrap().storage_bytes = Some(12_000);
    })
    .await;
    let secrets = projects(&s, 4).await;
    let calls = (0..16).map(|n| {
        let (s, secret) = (&s, secrets[n % 4].clone());
        async move {
            let body = json!({"name": "q", "version": format!("1.0.{n}"), "capsule_type": "OS",
                "file_format": ".tar", "file_size_bytes": 1_500});
            let path = format!("/api/v1/projects/default/q{}/capsules/upload-url", n % 4);
            secret_post(s, &path, &secret, body).await
        }
    });
    let answers = futures::future::join_all(calls).await;
    let mut statuses: Vec<u16> = answers.iter().map(|r| r.status.as_u16()).collect();
    statuses.sort();
    assert_eq!(statuses, [[201; 8], [413; 8]].concat(), "{statuses:?}");
    for r in answers.iter().filter(|r| r.status == 413) {
        assert!(r.body["detail"].as_str().unwrap().contains("storage limit"));
    }
    // What is stored agrees: 8 × 1,500 bytes reserved, across the four projects.
    let mut held = 0;
    for i in 0..4 {
        let r = s
            .get(&format!("/api/v1/projects/default/q{i}/capsules"), s.key())
            .await;
        assert_eq!(r.status, 200);
        held += r.body.as_array().map_or(0, |a| a.len()) * 1_500;
    }
    assert_eq!(held, 12_000);
}

each_backend!(
    a_hung_up_reservation_never_lets_the_quota_be_exceeded,
    threads = 2
);
/// The organization's quota turn ends with the record's write, not with its caller: a
/// reservation whose client hung up while its record waited is either written (and counted)
/// or never applied, and the next reservation is counted after that is settled.
async fn a_hung_up_reservation_never_lets_the_quota_be_exceeded() {
    let s = start_with(|c| {
        c.tiers.get_mut("free").unwrap().storage_bytes = Some(3_000);
    })
    .await;
    let secrets = projects(&s, 2).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let q0 = s.project_id("q0");
    rt.projects
        .inject_stall(q0, std::time::Duration::from_millis(1500))
        .await
        .unwrap();
    let body = |name: &str| {
        json!({"name": name, "version": "1.0.0", "capsule_type": "OS",
        "file_format": ".tar", "file_size_bytes": 2_000})
    };
    let (http, url, secret, a) = (
        s.http.clone(),
        s.url("/api/v1/projects/default/q0/capsules/upload-url"),
        secrets[0].clone(),
        body("a"),
    );
    let caller = tokio::spawn(async move {
        http.post(url)
            .header("X-Project-Secret", secret)
            .json(&a)
            .send()
            .await
    });
    // It holds the turn and its record waits in q0's mailbox: its client goes away.
    assert!(eventually(10, || async { rt.projects.waiting(q0) == 1 }).await);
    caller.abort();
    let _ = caller.await;
    let b = secret_post(
        &s,
        "/api/v1/projects/default/q1/capsules/upload-url",
        &secrets[1],
        body("b"),
    )
    .await;
    assert!(matches!(b.status.as_u16(), 201 | 413), "{}", b.body);
    let mut held = 0;
    for i in 0..2 {
        let r = s
            .get(&format!("/api/v1/projects/default/q{i}/capsules"), s.key())
            .await;
        held += r.body.as_array().map_or(0, |a| a.len()) * 2_000;
    }
    assert!(
        held <= 3_000,
        "{held} bytes held of 3,000 (b: {})",
        b.status
    );
    // The hung-up one was never applied, so b fits.
    assert_eq!(b.status, 201);
}

each_backend!(unconfirmed_uploads_are_purged_when_their_link_expires);
async fn unconfirmed_uploads_are_purged_when_their_link_expires() {
    let s = start_with(|c| {
        // Lifetimes with seconds of margin for the steps that must finish inside them.
        c.pipeline.upload_ttl_seconds = 3;
        c.pipeline.download_ttl_seconds = 5;
    })
    .await;
    let secret = s.admin.project_secret.clone();
    let body = json!({"name": "tmp", "version": "1.0.0", "capsule_type": "SW", "file_format": ".tar", "file_size_bytes": 10});
    let r = secret_post(&s, &format!("{CAPS}/upload-url"), &secret, body.clone()).await;
    assert_eq!(r.body["expires_in"], 3);
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    let kept = publish(
        &s,
        "kept",
        "1.0.0",
        ".tar",
        &archive(".tar", b"k"),
        json!([]),
    )
    .await;
    assert_eq!(kept.status, 200);
    // A download link works now, not when altered, and not after its lifetime.
    let kid = kept.body["id"].as_u64().unwrap();
    let dl = s.get(&format!("{CAPS}/{kid}"), s.key()).await.body["download_url"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s.http.get(&dl).send().await.unwrap().status(), 200);
    let (claims, sig) = dl.rsplit_once('.').unwrap();
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    let tampered = format!("{claims}.{flipped}{}", &sig[1..]);
    assert_eq!(s.http.get(&tampered).send().await.unwrap().status(), 403);
    // Expired once its lifetime has passed, however late this poll runs.
    let gone = eventually(20, || async {
        s.http.get(&dl).send().await.unwrap().status() == 401
    })
    .await;
    assert!(gone);
    // The link has expired: 401, nothing stored.
    assert_eq!(
        s.http
            .put(&url)
            .body(vec![0u8; 10])
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let rt = s.running.as_ref().unwrap().runtime.clone();
    assert_eq!(rt.pipeline.purge_expired().await.unwrap(), 1);
    let names: Vec<_> = s
        .get(CAPS, s.key())
        .await
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("kept")]);
    // Its (name, version) is free again.
    assert_eq!(
        secret_post(&s, &format!("{CAPS}/upload-url"), &secret, body)
            .await
            .status,
        201
    );
}

each_backend!(large_capsules_confirm_in_the_background);
async fn large_capsules_confirm_in_the_background() {
    let s = start_with(|c| c.pipeline.sync_validation_max_bytes = 100).await;
    let bytes = archive(".tar", &[7u8; 4096]);
    let r = publish(&s, "big", "1.0.0", ".tar", &bytes, json!([])).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["validation_status"], "pending");
    let id = r.body["id"].as_u64().unwrap();
    let done = eventually(10, || async {
        s.get(&format!("{CAPS}/{id}"), s.key()).await.body["validation_status"] == "passed"
    })
    .await;
    assert!(done);
}

each_backend!(a_decompression_bomb_fails_validation_with_a_note);
/// A decompression bomb (64 MiB of zeros in a 64 KiB `.tar.gz`) fails its validation with a
/// note, quickly, instead of being expanded.
async fn a_decompression_bomb_fails_validation_with_a_note() {
    let s = start().await;
    let bomb = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&tar_bytes(&vec![0u8; 64 << 20])).unwrap();
        gz.finish().unwrap()
    };
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    let t = std::time::Instant::now();
    let r = publish(&s, "bomb", "1.0.0", ".tar.gz", &bomb, json!([])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "failed");
    assert!(
        r.body["validation_notes"]
            .as_str()
            .unwrap()
            .contains("decompression bomb"),
        "{}",
        r.body
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
}

each_backend!(a_download_link_resumes_from_a_range);
/// A download link serves one `Range` of the file (206 with `Content-Range`), so a device
/// resumes an interrupted download; a range past the end is 416.
async fn a_download_link_resumes_from_a_range() {
    let s = start().await;
    let bytes = archive(".tar", &vec![7u8; 5000]);
    let r = publish(&s, "big", "1.0.0", ".tar", &bytes, json!([])).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.body["id"].as_u64().unwrap();
    let url = s.get(&format!("{CAPS}/{id}"), s.key()).await.body["download_url"]
        .as_str()
        .unwrap()
        .to_string();
    let got = s
        .http
        .get(&url)
        .header("Range", "bytes=1000-")
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 206);
    assert_eq!(
        got.headers()["content-range"],
        format!("bytes 1000-{}/{}", bytes.len() - 1, bytes.len()).as_str()
    );
    assert_eq!(got.bytes().await.unwrap().to_vec(), bytes[1000..].to_vec());
    let whole = s.http.get(&url).send().await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["accept-ranges"], "bytes");
    let past = s
        .http
        .get(&url)
        .header("Range", format!("bytes={}-", bytes.len()))
        .send()
        .await
        .unwrap();
    assert_eq!(past.status(), 416);
}
