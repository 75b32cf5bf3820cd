//! Uploading and confirming a capsule: every archive format, checksums and credentials, a
//! retried upload, versions, dependencies, deletion, background validation, a decompression
//! bomb, ranged downloads.

use std::io::Write;

use serde_json::json;

use super::*;

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
