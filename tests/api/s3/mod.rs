//! The S3 backend against a real S3-compatible server on loopback: moto (`moto[server]` of
//! tests/requirements.txt, which `scripts/test` installs), started here on a free port.

use crate::common::*;

use fleetops_testkit::moto::Moto;

mod blobs;
mod logs;

/// A moto server of the test's own (some stop it).
async fn moto() -> Moto {
    Moto::start()
}

/// A bucket on the moto server and a fleetops server storing its blobs there.
async fn s3_server(m: &Moto, bucket: &str) -> Srv {
    s3_server_with(m, bucket, |_| {}).await
}

/// As [`s3_server`], with more of the configuration set by `f`.
async fn s3_server_with(
    m: &Moto,
    bucket: &str,
    f: impl FnOnce(&mut fleetops::config::Config),
) -> Srv {
    let c = reqwest::Client::new();
    assert_eq!(
        c.put(format!("{}/{bucket}", m.endpoint))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (endpoint, bucket) = (m.endpoint.clone(), bucket.to_string());
    start_with(move |cfg| {
        cfg.storage.backend = "s3".into();
        cfg.storage.bucket = bucket;
        cfg.storage.endpoint = endpoint;
        cfg.storage.region = "us-east-1".into();
        cfg.storage.access_key_id = "testing".into();
        cfg.storage.secret_access_key = "testing".into();
        cfg.storage.allow_http = true;
        f(cfg);
    })
    .await
}

/// The keys of the bucket (moto's ListObjectsV2 XML).
async fn keys(m: &Moto, bucket: &str) -> Vec<String> {
    let xml = reqwest::Client::new()
        .get(format!("{}/{bucket}?list-type=2", m.endpoint))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    xml.split("<Key>")
        .skip(1)
        .map(|k| k.split("</Key>").next().unwrap().to_string())
        .collect()
}
