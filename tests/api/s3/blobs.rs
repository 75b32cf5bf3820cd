//! Artifacts, capsules and configurations on a real S3 server: round trips, presigned URLs,
//! immutable confirmed bytes, and a background confirm.

use std::io::Read;

use super::*;
use crate::sessions::{device, session};

each_backend!(artifacts_round_trip_through_a_real_s3_server);
async fn artifacts_round_trip_through_a_real_s3_server() {
    let m = moto().await;
    let c = reqwest::Client::new();
    let s = s3_server(&m, "fleet-artifacts").await;
    let (d, tok) = device(&s, "cam").await;
    let sid = session(&s, d, &tok).await;
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/run/a.bin")))
                .bearer_auth(&tok)
                .body(data.clone()),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["size_bytes"], 200_000);

    // The bytes are in the bucket, under a key built from ids.
    let listing = c
        .get(format!("{}/fleet-artifacts?list-type=2", m.endpoint))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        listing.contains(&format!("<Key>artifacts/{sid}/")),
        "{listing}"
    );
    assert!(!listing.contains("a.bin"), "{listing}");

    let resp = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/run/a.bin")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().to_vec(), data);
    let resp = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/run/a.bin")))
        .bearer_auth(s.key())
        .header("range", "bytes=1000-1999")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(
        resp.bytes().await.unwrap().to_vec(),
        data[1000..2000].to_vec()
    );
    let zip = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/download")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap();
    let bytes = zip.bytes().await.unwrap();
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
    let mut v = Vec::new();
    z.by_name("run/a.bin").unwrap().read_to_end(&mut v).unwrap();
    assert_eq!(v, data);

    // Deleting the session deletes the object.
    assert_eq!(
        s.delete(&format!("{DEV}/sessions/{sid}"), s.key())
            .await
            .status,
        204
    );
    let listing = c
        .get(format!("{}/fleet-artifacts?list-type=2", m.endpoint))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(listing.contains("<KeyCount>0</KeyCount>"), "{listing}");
}

each_backend!(capsules_and_configurations_use_presigned_s3_urls);
/// On S3 the upload and download URLs are the store's own presigned URLs: the client talks to
/// the store directly, and confirm reads the size and bytes back from it.
async fn capsules_and_configurations_use_presigned_s3_urls() {
    use crate::capsules::{CAPS, archive, secret_post, sha};
    use crate::configurations::{CONFS, conf};
    use serde_json::json;

    let m = moto().await;
    let s = s3_server(&m, "fleet-pipeline").await;
    let secret = s.admin.project_secret.clone();
    let bytes = archive(".tar.gz", b"firmware");
    let r = secret_post(
        &s,
        &format!("{CAPS}/upload-url"),
        &secret,
        json!({"name": "fw", "version": "1.0.0", "capsule_type": "FW", "file_format": ".tar.gz",
               "file_size_bytes": bytes.len()}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["capsule_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    assert!(url.starts_with(&m.endpoint), "{url}");
    assert!(url.contains("X-Amz-Signature="), "{url}");
    assert!(url.contains("X-Amz-Expires=3600"), "{url}");
    // Nothing uploaded yet: the store has no object, so confirm is 409.
    let confirm = format!("{CAPS}/{id}/confirm");
    secret_post(
        &s,
        &confirm,
        &secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await
    .assert_error(409);
    let put = s.http.put(&url).body(bytes.clone()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        &s,
        &confirm,
        &secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    assert_eq!(r.body["checksum_sha256"], sha(&bytes));
    let d = s.get(&format!("{CAPS}/{id}"), s.key()).await;
    let dl = d.body["download_url"].as_str().unwrap();
    assert!(
        dl.starts_with(&m.endpoint) && dl.contains("X-Amz-Expires=900"),
        "{dl}"
    );
    let got = s.http.get(dl).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), bytes);

    // A configuration the same way.
    let r = secret_post(
        &s,
        &format!("{CONFS}/upload-url"),
        &secret,
        conf("fw-conf", id, ".toml", None),
    )
    .await;
    let cid = r.body["config_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    assert!(url.starts_with(&m.endpoint), "{url}");
    let toml = b"[motor]\nspeed = 3\n";
    assert_eq!(
        s.http
            .put(&url)
            .body(toml.to_vec())
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = secret_post(
        &s,
        &format!("{CONFS}/{cid}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(toml)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["config_data"], json!({"motor": {"speed": 3}}));
    assert_eq!(r.body["file_size_bytes"], toml.len());
}

each_backend!(confirmed_bytes_stay_immutable_on_s3);
/// On S3 the presigned upload URL stays valid after confirm and the store accepts a late
/// `PUT`; confirm sealed the validated bytes under a key no URL targets, so the record, its
/// checksum and every download link keep the confirmed bytes.
async fn confirmed_bytes_stay_immutable_on_s3() {
    use crate::capsules::{CAPS, archive, secret_post, sha};
    use crate::configurations::{CONFS, conf};
    use serde_json::json;

    let m = moto().await;
    let bucket = "fleet-sealed";
    let s = s3_server(&m, bucket).await;
    let secret = s.admin.project_secret.clone();
    let bytes = archive(".tar.gz", b"firmware 1");
    let r = secret_post(
        &s,
        &format!("{CAPS}/upload-url"),
        &secret,
        json!({"name": "fw", "version": "1.0.0", "capsule_type": "FW", "file_format": ".tar.gz",
               "file_size_bytes": bytes.len()}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["capsule_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    let put = s.http.put(&url).body(bytes.clone()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        &s,
        &format!("{CAPS}/{id}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    assert_eq!(r.body["checksum_sha256"], sha(&bytes));
    let pid = r.body["project_id"].as_u64().unwrap();

    // The bytes moved to the capsule's content key; the upload key and the staging copy went.
    let sealed = format!("capsules/{pid}/sealed/{id}/sha256-{}", sha(&bytes));
    assert_eq!(keys(&m, bucket).await, vec![sealed.clone()]);

    // A late PUT to the same presigned URL: S3 takes it...
    let other = archive(".tar.gz", b"something else entirely");
    let put = s.http.put(&url).body(other.clone()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let mut now = keys(&m, bucket).await;
    now.sort();
    assert_eq!(now, vec![format!("capsules/{pid}/{id}"), sealed.clone()]);
    // ...and changes nothing: the record and its download link keep the confirmed bytes.
    let d = s.get(&format!("{CAPS}/{id}"), s.key()).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body["checksum_sha256"], sha(&bytes));
    assert_eq!(d.body["validation_status"], "passed");
    let dl = d.body["download_url"].as_str().unwrap();
    assert!(dl.contains(&sealed), "{dl}");
    let got = s.http.get(dl).send().await.unwrap();
    assert_eq!(got.status(), 200);
    let got = got.bytes().await.unwrap().to_vec();
    assert_eq!(sha(&got), sha(&bytes));
    assert_eq!(got, bytes);
    // Confirm stays done.
    secret_post(
        &s,
        &format!("{CAPS}/{id}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(&other)}),
    )
    .await
    .assert_error(409);

    // A configuration the same way.
    let r = secret_post(
        &s,
        &format!("{CONFS}/upload-url"),
        &secret,
        conf("fw-conf", id, ".toml", None),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let cid = r.body["config_id"].as_u64().unwrap();
    let curl = r.body["upload_url"].as_str().unwrap().to_string();
    let toml = b"[motor]\nspeed = 3\n";
    let put = s.http.put(&curl).body(toml.to_vec()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        &s,
        &format!("{CONFS}/{cid}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(toml)}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["validation_status"], "passed", "{}", r.body);
    let csealed = format!("configurations/{pid}/sealed/{cid}/sha256-{}", sha(toml));
    assert!(keys(&m, bucket).await.contains(&csealed));
    assert!(
        !keys(&m, bucket)
            .await
            .contains(&format!("configurations/{pid}/{cid}"))
    );
    let late = b"[motor]\nspeed = 300\n";
    let put = s.http.put(&curl).body(late.to_vec()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let d = s.get(&format!("{CONFS}/{cid}"), s.key()).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body["checksum_sha256"], sha(toml));
    assert_eq!(d.body["config_data"], json!({"motor": {"speed": 3}}));
    let dl = d.body["download_url"].as_str().unwrap();
    assert!(dl.contains(&csealed), "{dl}");
    let got = s.http.get(dl).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), toml.to_vec());

    // Deleting them deletes their sealed bytes and whatever the late PUTs left.
    assert_eq!(
        s.delete(&format!("{CONFS}/{cid}"), s.key()).await.status,
        204
    );
    assert_eq!(s.delete(&format!("{CAPS}/{id}"), s.key()).await.status, 204);
    assert_eq!(keys(&m, bucket).await, Vec::<String>::new());
}

each_backend!(a_background_confirm_on_s3_seals_what_it_validates);
/// A confirm answered 202 validates a sealed copy in the background: however a PUT racing it
/// lands, the bytes the record's download link serves are the ones its checksum names, and a
/// PUT after the verdict changes nothing.
async fn a_background_confirm_on_s3_seals_what_it_validates() {
    use crate::capsules::{CAPS, archive, secret_post, sha};
    use serde_json::json;

    let m = moto().await;
    let bucket = "fleet-sealed-bg";
    let s = s3_server_with(&m, bucket, |c| c.pipeline.sync_validation_max_bytes = 100).await;
    let secret = s.admin.project_secret.clone();
    let bytes = archive(".tar", &[7u8; 4096]);
    let r = secret_post(
        &s,
        &format!("{CAPS}/upload-url"),
        &secret,
        json!({"name": "big", "version": "1.0.0", "capsule_type": "SW", "file_format": ".tar",
               "file_size_bytes": bytes.len()}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let id = r.body["capsule_id"].as_u64().unwrap();
    let url = r.body["upload_url"].as_str().unwrap().to_string();
    let put = s.http.put(&url).body(bytes.clone()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let r = secret_post(
        &s,
        &format!("{CAPS}/{id}/confirm"),
        &secret,
        json!({"checksum_sha256": sha(&bytes)}),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.body);
    // Races the background validation: before its copy or after, never in between.
    let racing = archive(".tar", &[8u8; 4096]);
    let put = s.http.put(&url).body(racing.clone()).send().await.unwrap();
    assert_eq!(put.status(), 200);
    let settled = eventually(10, || async {
        s.get(&format!("{CAPS}/{id}"), s.key()).await.body["validation_status"] != "pending"
    })
    .await;
    assert!(settled);
    let check = || async {
        let d = s.get(&format!("{CAPS}/{id}"), s.key()).await;
        let checksum = d.body["checksum_sha256"].as_str().unwrap().to_string();
        let dl = d.body["download_url"].as_str().unwrap().to_string();
        assert!(
            dl.contains(&format!("/sealed/{id}/sha256-{checksum}")),
            "{dl}"
        );
        let got = s.http.get(&dl).send().await.unwrap().bytes().await.unwrap();
        assert_eq!(sha(&got), checksum);
        if d.body["validation_status"] == "passed" {
            assert_eq!(got.to_vec(), bytes);
        } else {
            assert_eq!(got.to_vec(), racing);
        }
        (d.body["validation_status"].clone(), checksum)
    };
    let before = check().await;
    let put = s
        .http
        .put(&url)
        .body(archive(".tar", &[9u8; 4096]))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    assert_eq!(check().await, before);
}
