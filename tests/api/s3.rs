//! The S3 backend against a real S3-compatible server on loopback: moto (`pip install
//! 'moto[server]'`, which `.ci/run` installs), started here on a free port.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use crate::sessions::{device, session};

struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn moto() -> Moto {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Owned by the guard at once, so it is killed and reaped whatever happens.
    let m = Moto {
        child: Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 with moto[server] is needed: pip install 'moto[server]'"),
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let c = reqwest::Client::new();
    for _ in 0..200 {
        if c.get(&m.endpoint).send().await.is_ok() {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "moto did not start on {} (is moto[server] installed? pip install 'moto[server]')",
        m.endpoint
    );
}

#[tokio::test]
async fn artifacts_round_trip_through_a_real_s3_server() {
    let m = moto().await;
    let c = reqwest::Client::new();
    assert_eq!(
        c.put(format!("{}/fleet-artifacts", m.endpoint))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let endpoint = m.endpoint.clone();
    let s = start_with(move |cfg| {
        cfg.storage.backend = "s3".into();
        cfg.storage.bucket = "fleet-artifacts".into();
        cfg.storage.endpoint = endpoint;
        cfg.storage.region = "us-east-1".into();
        cfg.storage.access_key_id = "testing".into();
        cfg.storage.secret_access_key = "testing".into();
        cfg.storage.allow_http = true;
    })
    .await;
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
