//! Capsules through the real server: upload URL (project secret), PUT to the presigned URL,
//! confirm with server-side SHA-256 and archive checks, is_latest, dependencies, downloads,
//! quotas, and what is refused.

use std::io::Write;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::*;

mod quotas;
mod uploads;

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
