//! A failed package a member retries installed again, and a configuration too large to
//! inline downloaded, checked and written.

use super::*;

#[tokio::test]
async fn a_failed_package_a_member_retries_is_installed_again() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(
        &server,
        &token,
        "test -e fixed || { echo 'no room on /opt'; exit 3; }; cp \"$FLEETOPS_CAPSULE_PATH\" installed.bin",
    )
    .await;
    let (cap, bytes) = publish(&server, "1.0.0").await;
    let dep = deploy(&server, cap, None).await;
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "failed"]);
    // Failed, and not installed again by itself.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await, r);
    // The robot's problem is fixed, and a member retries the package.
    std::fs::write(agent.dir.path().join("fixed"), "").unwrap();
    let (s, b) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments/{dep}/rollout/devices/{device}/retry"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let r = until_reported(&server, device, &["succeeded"], 30).await;
    assert_eq!(
        r,
        [
            "downloading",
            "installing",
            "failed",
            "retrying",
            "downloading",
            "installing",
            "succeeded"
        ]
    );
    assert_eq!(
        std::fs::read(agent.dir.path().join("installed.bin")).unwrap(),
        bytes
    );
    // Succeeded: not installed again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reports(&server, device).await.len(), 7);
}

/// A configuration too large to come inline is downloaded from its link, checked against the
/// size and SHA-256 its package names, and written for the hook: the effective data, whole.
#[tokio::test]
async fn a_configuration_too_large_to_inline_is_downloaded_checked_and_written() {
    let server = Server::start();
    let token = server
        .enrollment_token(json!({"name": "line", "labels": {"fleet": "k"}}))
        .await;
    let agent = fleet_agent(&server, &token, "cp \"$FLEETOPS_CONFIG_PATH\" config.json").await;
    let (cap, _) = publish(&server, "1.0.0").await;
    // 100 KiB of settings: over the 64 KiB sent inline.
    let settings: serde_json::Map<String, Value> = (0..2000)
        .map(|i| (format!("key{i:04}"), json!("v".repeat(40))))
        .collect();
    let want = Value::Object(settings);
    let file = serde_json::to_vec(&want).unwrap();
    assert!(file.len() > 64 * 1024);
    let c = reqwest::Client::new();
    let secret = server.printed("project secret:");
    let r: Value = c
        .post(format!(
            "{}{PROJECT}/configurations/upload-url",
            server.base
        ))
        .header("X-Project-Secret", &secret)
        .json(
            &json!({"name": "nav-config", "capsule_id": cap, "version": "1.0.0",
            "environment": "prod", "compatible_capsule_versions": "^1.0.0",
            "file_format": ".json", "file_size_bytes": file.len()}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let conf = r["config_id"].as_u64().unwrap_or_else(|| panic!("{r}"));
    let put = c
        .put(r["upload_url"].as_str().unwrap())
        .body(file.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let confirm = c
        .post(format!(
            "{}{PROJECT}/configurations/{conf}/confirm",
            server.base
        ))
        .header("X-Project-Secret", &secret)
        .json(&json!({"checksum_sha256": hex::encode(sha2::Sha256::digest(&file))}))
        .send()
        .await
        .unwrap();
    assert_eq!(confirm.status(), 200);
    let (s, d) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments"),
            Some(
                json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
                "configuration_id": conf, "target_devices": [{"labels": {"fleet": "k"}}]}),
            ),
        )
        .await;
    assert_eq!(s, 201, "{d}");
    let dep = d["id"].as_u64().unwrap();
    let (s, r) = server
        .call(
            reqwest::Method::POST,
            &format!("{PROJECT}/deployments/{dep}/activate"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    let _d = agent.spawn(&["daemon"]);
    let device = agent.identity()["device_id"].as_u64().unwrap();
    let r = until_reported(&server, device, &["succeeded", "failed"], 30).await;
    assert_eq!(r, ["downloading", "installing", "succeeded"]);
    let written: Value =
        serde_json::from_slice(&std::fs::read(agent.dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(written, want);
}
