//! Log ingest: formats, atomicity and limits, numbered batches stored once, gzip bodies bounded
//! once decompressed.

use serde_json::{Value, json};

use super::*;

every_log_store!(ingestion_formats_atomicity_and_limits);
async fn ingestion_formats_atomicity_and_limits() {
    let s = start().await;
    let (d, tok) = device(&s, "rover").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let r = s
        .post(
            &logs,
            &tok,
            json!([
                {"level": "INFO", "message": "boot", "module": "sys", "metadata": {"v": [1, 2]}},
                {"level": "Warning", "message": "low battery"}
            ]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"accepted": 2}));
    let r = ndjson(
        &s,
        sid,
        &tok,
        "{\"level\":\"error\",\"message\":\"a\"}\n\n{\"level\":\"debug\",\"message\":\"b\"}\n"
            .into(),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["accepted"], 2);

    // Metadata nests at most 64 levels, like configurations (JSON and NDJSON alike).
    let nested = |levels: usize| format!("{}1{}", "{\"k\":".repeat(levels), "}".repeat(levels));
    let body = format!(
        "[{{\"level\":\"info\",\"message\":\"ok\",\"metadata\":{}}}]",
        nested(64)
    );
    let r = s
        .raw(
            s.http
                .post(s.url(&logs))
                .bearer_auth(&tok)
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let body = format!(
        "[{{\"level\":\"info\",\"message\":\"ok\"}},{{\"level\":\"info\",\"message\":\"deep\",\"metadata\":{}}}]",
        nested(65)
    );
    let r = s
        .raw(
            s.http
                .post(s.url(&logs))
                .bearer_auth(&tok)
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
    assert!(
        r.assert_error(422).starts_with("entry 1: metadata"),
        "{}",
        r.body
    );
    let r = ndjson(
        &s,
        sid,
        &tok,
        format!(
            "{{\"level\":\"info\",\"message\":\"deep\",\"metadata\":{}}}\n",
            nested(100)
        ),
    )
    .await;
    assert!(
        r.assert_error(422).starts_with("entry 0: metadata"),
        "{}",
        r.body
    );

    // One invalid entry rejects the whole batch, naming its index.
    let r = s
        .post(
            &logs,
            &tok,
            json!([{"level": "info", "message": "ok"}, {"level": "loud", "message": "x"}]),
        )
        .await;
    assert!(r.assert_error(422).starts_with("entry 1"), "{}", r.body);
    let r = s
        .post(
            &logs,
            &tok,
            json!([{"level": "info", "message": "ok"}, {"level": "info"}]),
        )
        .await;
    assert!(r.assert_error(422).starts_with("entry 1"), "{}", r.body);
    let r = s
        .post(
            &logs,
            &tok,
            json!([{"level": "info", "message": "x", "timestamp": "soon"}]),
        )
        .await;
    assert!(r.assert_error(422).contains("timestamp"));
    let r = s
        .post(
            &logs,
            &tok,
            json!([{"level": "info", "message": "x", "metadata": [1]}]),
        )
        .await;
    assert!(r.assert_error(422).contains("metadata"));
    let r = ndjson(
        &s,
        sid,
        &tok,
        "{\"level\":\"info\",\"message\":\"ok\"}\nnot json\n".into(),
    )
    .await;
    assert!(r.assert_error(422).starts_with("entry 1"), "{}", r.body);
    let r = ndjson(
        &s,
        sid,
        &tok,
        "{\"level\":\"info\",\"message\":\"\u{ff}\"}\n".into(),
    )
    .await;
    assert_eq!(r.status, 202, "valid UTF-8 text is fine");
    let bad_utf8 = s
        .raw(
            s.http
                .post(s.url(&logs))
                .bearer_auth(&tok)
                .header("content-type", "application/x-ndjson")
                .body(vec![b'{', 0xff, b'}']),
        )
        .await;
    bad_utf8.assert_error(422);
    s.raw(
        s.http
            .post(s.url(&logs))
            .bearer_auth(&tok)
            .header("content-type", "application/json")
            .body("[{"),
    )
    .await
    .assert_error(400);
    s.post(&logs, &tok, json!({"level": "info"}))
        .await
        .assert_error(422);
    // Limits: 10,000 entries, 8 MiB.
    let many: Vec<Value> = (0..10_001)
        .map(|i| json!({"level": "info", "message": format!("m{i}")}))
        .collect();
    s.post(&logs, &tok, Value::Array(many))
        .await
        .assert_error(413);
    // Counted before any entry is built: too many entries is 413 even when they are not
    // entries at all (413 comes before 422, and 320,000 tiny items in 8 MiB never become
    // 320,000 parsed entries).
    let tiny = format!("[{}{{}}]", "{},".repeat(10_000));
    s.raw(
        s.http
            .post(s.url(&logs))
            .bearer_auth(&tok)
            .header("content-type", "application/json")
            .body(tiny),
    )
    .await
    .assert_error(413);
    let not_entries = format!(
        "{{}}\n{}",
        "{\"level\":\"info\",\"message\":\"m\"}\n".repeat(10_000)
    );
    ndjson(&s, sid, &tok, not_entries).await.assert_error(413);
    let lines: String = (0..10_001)
        .map(|i| format!("{{\"level\":\"info\",\"message\":\"m{i}\"}}\n"))
        .collect();
    ndjson(&s, sid, &tok, lines).await.assert_error(413);
    let huge = json!([{"level": "info", "message": "x".repeat(9 * 1024 * 1024)}]);
    s.post(&logs, &tok, huge).await.assert_error(413);
    // Exactly 10,000 is fine.
    let max: Vec<Value> = (0..10_000)
        .map(|i| json!({"level": "info", "message": format!("m{i}")}))
        .collect();
    assert_eq!(
        s.post(&logs, &tok, Value::Array(max)).await.body["accepted"],
        10_000
    );

    // Nothing from the rejected batches was stored.
    let r = s.get(&format!("{DEV}/sessions/{sid}"), s.key()).await;
    assert_eq!(r.body["metrics"]["log_count"], 2 + 2 + 1 + 1 + 10_000);
    let r = s.get(&format!("{logs}?limit=1"), s.key()).await;
    assert_eq!(r.body["total"], 10_006);
    // Unknown session: 404; another device's token: 403.
    s.post(&format!("{DEV}/sessions/999999/logs"), s.key(), json!([]))
        .await
        .assert_error(404);
    let (_, other) = device(&s, "other").await;
    s.post(&logs, &other, json!([{"level": "info", "message": "x"}]))
        .await
        .assert_error(403);
    // Device tokens cannot read.
    s.get(&logs, &tok).await.assert_error(403);
}

every_log_store!(a_numbered_batch_sent_again_is_stored_once);
/// A numbered batch (`X-Batch-Sequence`) sent again after its answer was lost is answered as
/// accepted and stored once; a number below the last stored is a duplicate too, and a number
/// that is not a whole number from 1 is 422.
async fn a_numbered_batch_sent_again_is_stored_once() {
    let s = start().await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let send = |n: &'static str, msg: &'static str| {
        let (s, logs, tok) = (&s, logs.clone(), tok.clone());
        async move {
            s.raw(
                s.http
                    .post(s.url(&logs))
                    .bearer_auth(&tok)
                    .header("X-Batch-Sequence", n)
                    .json(&json!([{"level": "info", "message": msg}, {"level": "warn", "message": msg}])),
            )
            .await
        }
    };
    let r = send("1", "first").await;
    assert_eq!(r.status, 202);
    assert_eq!(r.body, json!({"accepted": 2}));
    let r = send("1", "first").await;
    assert_eq!(r.status, 202);
    assert_eq!(r.body, json!({"accepted": 2, "duplicate": true}));
    assert_eq!(send("2", "second").await.status, 202);
    let r = send("1", "late").await;
    assert_eq!(r.body["duplicate"], true, "{}", r.body);
    for bad in ["0", "-1", "x", "18446744073709551616"] {
        send(bad, "bad").await.assert_error(422);
    }
    let r = s.get(&logs, s.key()).await;
    assert_eq!(r.body["total"], 4, "{}", r.body);
    let m = messages(&r.body);
    assert_eq!(m, ["first", "first", "second", "second"], "{}", r.body);
}

every_log_store!(a_gzip_compressed_batch_is_taken_and_bounded_once_decompressed);
/// A gzip-compressed batch (`Content-Encoding: gzip`) is stored as if sent plain; one that is
/// not gzip is 400, another coding 400, and one past the batch bound once decompressed 413.
async fn a_gzip_compressed_batch_is_taken_and_bounded_once_decompressed() {
    use std::io::Write;
    let gz = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    };
    let s = start().await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let send = |body: Vec<u8>, coding: &'static str| {
        let (s, logs, tok) = (&s, logs.clone(), tok.clone());
        async move {
            s.raw(
                s.http
                    .post(s.url(&logs))
                    .bearer_auth(&tok)
                    .header("Content-Type", "application/x-ndjson")
                    .header("Content-Encoding", coding)
                    .body(body),
            )
            .await
        }
    };
    let plain =
        b"{\"level\":\"info\",\"message\":\"one\"}\n{\"level\":\"warn\",\"message\":\"two\"}\n";
    let r = send(gz(plain), "gzip").await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"accepted": 2}));
    send(plain.to_vec(), "gzip").await.assert_error(400);
    send(gz(plain), "br").await.assert_error(400);
    // 9 MiB of spaces compress to a few KiB, and are still past the 8 MiB bound.
    send(gz(&vec![b' '; 9 << 20]), "gzip")
        .await
        .assert_error(413);
    let r = s.get(&logs, s.key()).await;
    assert_eq!(messages(&r.body), ["one", "two"]);
}
