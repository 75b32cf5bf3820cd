//! Artifact files: upload, replace, list, content types, ranges, the ZIP, traversal paths,
//! and what completion and deletion do to them.

use std::io::Read;

use serde_json::json;

use crate::common::*;
use crate::sessions::{device, session};

async fn put(s: &Srv, sid: u64, path: &str, cred: &str, ct: Option<&str>, bytes: Vec<u8>) -> Resp {
    let mut rb = s
        .http
        .put(s.url(&format!("{DEV}/sessions/{sid}/files/{path}")))
        .bearer_auth(cred)
        .body(bytes);
    if let Some(ct) = ct {
        rb = rb.header("content-type", ct);
    }
    s.raw(rb).await
}

each_backend!(upload_list_get_range_zip_and_delete);
async fn upload_list_get_range_zip_and_delete() {
    let s = start().await;
    let (d, tok) = device(&s, "cam").await;
    let sid = session(&s, d, &tok).await;
    let k = s.key();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();

    let r = put(
        &s,
        sid,
        "run/trace.mcap",
        &tok,
        Some("application/x-mcap"),
        big.clone(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["path"], "run/trace.mcap");
    assert_eq!(r.body["size_bytes"], 300_000);
    assert_eq!(r.body["content_type"], "application/x-mcap");
    assert!(r.body["created_at"].as_str().unwrap().ends_with('Z'));
    let r = put(&s, sid, "notes.txt", k, None, b"first".to_vec()).await;
    assert_eq!(r.body["content_type"], "text/plain");
    let r = put(&s, sid, "notes.txt", k, None, b"second version".to_vec()).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["size_bytes"], 14);
    put(&s, sid, "a%20b/photo.png", k, None, vec![1, 2, 3]).await;
    let r = put(
        &s,
        sid,
        "download",
        k,
        Some("text/plain"),
        b"named download".to_vec(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);

    // List: sorted by path.
    let r = s.get(&format!("{DEV}/sessions/{sid}/files"), k).await;
    let paths: Vec<_> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        paths,
        ["a b/photo.png", "download", "notes.txt", "run/trace.mcap"]
    );
    assert_eq!(r.body["items"][0]["content_type"], "image/png");
    // Detail counts them (the replaced file once, at its new size).
    let r = s.get(&format!("{DEV}/sessions/{sid}"), k).await;
    assert_eq!(r.body["metrics"]["artifact_count"], 4);
    assert_eq!(
        r.body["metrics"]["artifact_size_bytes"],
        300_000 + 14 + 3 + 14
    );
    assert_eq!(r.body["artifact_count"], 4);

    // Whole file with type and length.
    let resp = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/run/trace.mcap")))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-mcap");
    assert_eq!(resp.headers()["content-length"], "300000");
    assert_eq!(resp.bytes().await.unwrap().to_vec(), big);
    // Ranges.
    for (range, want) in [
        ("bytes=0-9", 0..10),
        ("bytes=299990-", 299_990..300_000),
        ("bytes=-5", 299_995..300_000),
        ("bytes=100-100", 100..101),
    ] {
        let resp = s
            .http
            .get(s.url(&format!("{DEV}/sessions/{sid}/files/run/trace.mcap")))
            .bearer_auth(k)
            .header("range", range)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 206, "{range}");
        assert_eq!(
            resp.headers()["content-range"],
            format!("bytes {}-{}/300000", want.start, want.end - 1)
        );
        assert_eq!(
            resp.headers()["content-length"],
            (want.end - want.start).to_string()
        );
        assert_eq!(
            resp.bytes().await.unwrap().to_vec(),
            big[want.start..want.end].to_vec(),
            "{range}"
        );
    }
    let resp = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/notes.txt")))
        .bearer_auth(k)
        .header("range", "bytes=14-")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 416);
    assert_eq!(resp.headers()["content-range"], "bytes */14");
    s.get(&format!("{DEV}/sessions/{sid}/files/missing.bin"), k)
        .await
        .assert_error(404);

    // The ZIP holds every file, byte for byte (the file named `download` included).
    let resp = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/download")))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/zip");
    assert_eq!(
        resp.headers()["content-disposition"],
        format!("attachment; filename=\"session-{sid}-artifacts.zip\"")
    );
    let bytes = resp.bytes().await.unwrap();
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
    assert_eq!(zip.len(), 4);
    let mut read = |name: &str| {
        let mut f = zip.by_name(name).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    };
    assert_eq!(read("run/trace.mcap"), big);
    assert_eq!(read("notes.txt"), b"second version");
    assert_eq!(read("download"), b"named download");
    assert_eq!(read("a b/photo.png"), vec![1, 2, 3]);

    // Completed sessions take no more files; deletion takes them all away.
    s.post(
        &format!("{DEV}/sessions/{sid}/complete"),
        &tok,
        json!({"status": "completed"}),
    )
    .await;
    put(&s, sid, "late.txt", k, None, b"x".to_vec())
        .await
        .assert_error(409);
    assert_eq!(
        s.delete(&format!("{DEV}/sessions/{sid}"), k).await.status,
        204
    );
    s.get(&format!("{DEV}/sessions/{sid}/files/notes.txt"), k)
        .await
        .assert_error(404);
    s.get(&format!("{DEV}/sessions/{sid}/files"), k)
        .await
        .assert_error(404);
}

each_backend!(traversal_paths_and_foreign_devices_are_refused);
async fn traversal_paths_and_foreign_devices_are_refused() {
    let s = start().await;
    let (d, tok) = device(&s, "cam").await;
    let (_, other) = device(&s, "other").await;
    let sid = session(&s, d, &tok).await;
    // Sent byte for byte over TCP: an HTTP client library would normalise the dot segments.
    for path in [
        "a/../b",
        "../etc/passwd",
        "a/%2E%2E/b",
        "a%5Cb",
        "a%00b",
        "a//b",
        "dir/",
        "%2Fabs",
        "./x",
    ] {
        let status = raw_put(&s, &format!("{DEV}/sessions/{sid}/files/{path}"), &tok).await;
        assert_eq!(status, 400, "{path}");
    }
    put(&s, sid, "ok.txt", &other, None, b"x".to_vec())
        .await
        .assert_error(403);
    put(&s, 999_999, "ok.txt", s.key(), None, b"x".to_vec())
        .await
        .assert_error(404);
    let r = s.get(&format!("{DEV}/sessions/{sid}/files"), s.key()).await;
    assert_eq!(r.body["items"], json!([]));
}

each_backend!(oversized_artifacts_are_413_and_leave_nothing);
async fn oversized_artifacts_are_413_and_leave_nothing() {
    let s = start_with(|c| c.sessions.max_artifact_bytes = 1000).await;
    let (d, tok) = device(&s, "cam").await;
    let sid = session(&s, d, &tok).await;
    put(&s, sid, "big.bin", &tok, None, vec![0; 1001])
        .await
        .assert_error(413);
    assert_eq!(
        put(&s, sid, "ok.bin", &tok, None, vec![0; 1000])
            .await
            .status,
        201
    );
    let r = s.get(&format!("{DEV}/sessions/{sid}/files"), s.key()).await;
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
}

/// A PUT written by hand, so the path reaches the server exactly as given; returns the status.
async fn raw_put(s: &Srv, path: &str, cred: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {cred}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    conn.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("\"status_code\""), "{text}");
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

each_backend!(the_sweep_collects_only_blobs_no_record_points_at);
/// Blobs a crash left without a record (between a blob's write and its record, or a record's
/// removal and its blob's) are collected by the housekeeper's sweep; every blob a record
/// points at, and an artifact upload that may still be streaming, is kept.
async fn the_sweep_collects_only_blobs_no_record_points_at() {
    let s = start().await;
    let (d, tok) = device(&s, "cam").await;
    let sid = session(&s, d, &tok).await;
    let k = s.key();
    let r = put(&s, sid, "kept.bin", k, None, b"kept".to_vec()).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let capsule = crate::configurations::capsule(&s, "nav", "1.0.0").await;
    let blobs = s._dir.path().join("data/blobs");
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let pid = s.project_id("default");
    let write = |rel: String| {
        let p = blobs.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"orphan").unwrap();
        p
    };
    // Orphans: a key of an older binary (v4, no time), a deleted session's blob, a capsule
    // and a configuration whose records are gone (an upload key and a sealed copy).
    let old_style = write(format!("artifacts/{sid}/{}", uuid::Uuid::new_v4()));
    let gone_session = write(format!("artifacts/999999/{}", uuid::Uuid::now_v7()));
    let gone_capsule = write(format!("capsules/{pid}/999999"));
    let gone_sealed = write(format!("configurations/{pid}/sealed/999999/sha256-ab"));
    // Kept: a fresh unreferenced key (an upload that may still be streaming), and a file
    // that is not a key of ours.
    let in_flight = write(format!("artifacts/{sid}/{}", uuid::Uuid::now_v7()));
    let foreign = write(format!("artifacts/{sid}/upload.tmp"));
    let before: Vec<_> = files(&blobs);

    assert_eq!(rt.collect_orphans_now().await.unwrap(), 4);
    for p in [&old_style, &gone_session, &gone_capsule, &gone_sealed] {
        assert!(!p.exists(), "{p:?} should be collected");
    }
    for p in [&in_flight, &foreign] {
        assert!(p.exists(), "{p:?} should be kept");
    }
    assert_eq!(files(&blobs).len(), before.len() - 4);
    // What records point at is untouched and still served.
    let r = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/kept.bin")))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"kept");
    let c = s
        .get(
            &format!("/api/v1/projects/default/default/capsules/{capsule}"),
            k,
        )
        .await;
    let dl = c.body["download_url"].as_str().unwrap().to_string();
    assert_eq!(s.http.get(&dl).send().await.unwrap().status(), 200);
    // A day later the unreferenced upload is no longer in flight: collected too.
    rt.clock.advance(std::time::Duration::from_secs(25 * 3600));
    assert_eq!(rt.collect_orphans_now().await.unwrap(), 1);
    assert!(!in_flight.exists());
    assert_eq!(rt.collect_orphans_now().await.unwrap(), 0);
}

/// A session whose artifacts (24 MB that does not compress) make a ZIP larger than a
/// stream's channel and the sockets' buffers hold, so a ZIP nobody reads stays in flight.
async fn incompressible_artifacts(s: &Srv) -> u64 {
    let (d, tok) = device(s, "bulk-cam").await;
    let sid = session(s, d, &tok).await;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..3 {
        let bytes = noise(&mut x, 8 << 20);
        let r = put(s, sid, &format!("noise-{i}.bin"), &tok, None, bytes).await;
        assert_eq!(r.status, 201, "{}", r.body);
    }
    sid
}

each_backend!(zips_share_the_stream_cap_and_a_stalled_one_is_cut_short);
/// The artifact ZIP streams from a blocking thread as an export does, under the same cap
/// (`[sessions] max_streams`: 503 with `Retry-After` past it) and the same stall timeout (a
/// ZIP nobody reads gives its place back, and its reader then gets an error, never a body
/// that ends as if it were whole).
async fn zips_share_the_stream_cap_and_a_stalled_one_is_cut_short() {
    let s = start_with(|c| {
        c.sessions.max_streams = 1;
        c.sessions.stalled_reader_seconds = 1;
    })
    .await;
    let sid = incompressible_artifacts(&s).await;
    let zip = || {
        s.http
            .get(s.url(&format!("{DEV}/sessions/{sid}/files/download")))
            .bearer_auth(s.key())
            .send()
    };
    let stalled = zip().await.unwrap();
    assert_eq!(stalled.status(), 200);
    assert_eq!(stalled.headers()["content-type"], "application/zip");
    let refused = zip().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let mut freed = None;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = zip().await.unwrap();
        if r.status() == 200 {
            freed = Some(r);
            break;
        }
    }
    // Read at once (before the stalled one, so its own stall timer never runs out), the
    // ZIP that took the place is whole.
    let bytes = freed
        .expect("the stalled ZIP gave its place back")
        .bytes()
        .await
        .unwrap();
    let zip = zip::ZipArchive::new(std::io::Cursor::new(bytes.to_vec())).unwrap();
    assert_eq!(zip.len(), 3);
    assert!(
        stalled.bytes().await.is_err(),
        "a cut-short ZIP must not end cleanly"
    );
}

each_backend!(artifact_downloads_are_attachments_that_are_never_sniffed);
/// A device's file served by the API is a download that a browser neither sniffs nor shows
/// as a page of this origin, whole or in part; the ZIP of them is not sniffed either.
async fn artifact_downloads_are_attachments_that_are_never_sniffed() {
    let s = start().await;
    let (d, tok) = crate::sessions::device(&s, "r1").await;
    let sid = crate::sessions::session(&s, d, &tok).await;
    let page = b"<html><script>alert(document.cookie)</script></html>".to_vec();
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/logs/x\"y;.html")))
                .bearer_auth(&tok)
                .header("content-type", "text/html")
                .body(page.clone()),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let url = s.url(&format!("{DEV}/sessions/{sid}/files/logs/x%22y;.html"));
    for range in [None, Some("bytes=0-9")] {
        let mut rb = s.http.get(&url).bearer_auth(s.key());
        if let Some(rg) = range {
            rb = rb.header("range", rg);
        }
        let resp = rb.send().await.unwrap();
        assert!(resp.status().is_success(), "{range:?}: {}", resp.status());
        let h = resp.headers();
        assert_eq!(h["content-type"], "text/html", "the type as uploaded");
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["content-disposition"], "attachment; filename=\"xy.html\"");
        assert_eq!(h["content-security-policy"], "sandbox; default-src 'none'");
    }
    let zip = s
        .http
        .get(s.url(&format!("{DEV}/sessions/{sid}/files/download")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap();
    assert_eq!(zip.headers()["x-content-type-options"], "nosniff");
}
