//! The storage quota at upload time: checked at the upload URL, never exceeded by concurrent
//! uploads or by a reservation whose caller hung up, and unconfirmed uploads purged when their
//! link expires.

use serde_json::json;

use super::*;

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
