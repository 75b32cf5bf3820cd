//! Sessions, log ingestion (JSON and NDJSON, atomic batches, limits), the log query with every
//! filter against a known data set, tags, completion, deletion and tenancy.

use serde_json::{Value, json};

use crate::common::*;

pub async fn device(s: &Srv, name: &str) -> (u64, String) {
    let r = s
        .post(&format!("{DEV}/devices"), s.key(), json!({"name": name}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    )
}

pub async fn session(s: &Srv, device: u64, cred: &str) -> u64 {
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            cred,
            json!({"device_id": device}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

async fn ndjson(s: &Srv, sid: u64, cred: &str, body: String) -> Resp {
    s.raw(
        s.http
            .post(s.url(&format!("{DEV}/sessions/{sid}/logs")))
            .bearer_auth(cred)
            .header("content-type", "application/x-ndjson")
            .body(body),
    )
    .await
}

every_log_store!(create_detail_complete_and_list);
async fn create_detail_complete_and_list() {
    let s = start().await;
    let (d1, tok1) = device(&s, "arm-1").await;
    let (d2, _) = device(&s, "arm-2").await;
    let r = s
        .post(
            &format!("{DEV}/sessions"),
            &tok1,
            json!({"device_id": d1, "tags": ["run:7", "calib", "calib"]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let b = &r.body;
    assert_eq!(b["status"], "active");
    assert_eq!(b["ended_at"], Value::Null);
    assert_eq!(b["device_id"], d1);
    assert_eq!(b["device_name"], "arm-1");
    assert_eq!(b["tags"], json!(["calib", "run:7"]));
    assert_eq!(
        b["metrics"],
        json!({"log_count": 0, "artifact_count": 0, "artifact_size_bytes": 0})
    );
    assert_eq!(b["package"], Value::Null);
    assert_eq!(b["artifact_count"], 0);
    assert!(b["duration_seconds"].as_i64().unwrap() >= 0);
    let s1 = b["id"].as_u64().unwrap();
    // A device token creates sessions only for its own device.
    s.post(&format!("{DEV}/sessions"), &tok1, json!({"device_id": d2}))
        .await
        .assert_error(403);
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": 999_999}),
    )
    .await
    .assert_error(422);
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": d1, "tags": ["bad tag"]}),
    )
    .await
    .assert_error(422);
    s.post(
        &format!("{DEV}/sessions"),
        s.key(),
        json!({"device_id": "x"}),
    )
    .await
    .assert_error(422);
    let s2 = session(&s, d2, s.key()).await;

    // Complete: 200 with ended_at and duration; then 409 for more logs or another completion.
    let r = s
        .post(
            &format!("{DEV}/sessions/{s1}/complete"),
            &tok1,
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "completed");
    assert!(r.body["ended_at"].as_str().unwrap().ends_with('Z'));
    assert!(r.body["duration_seconds"].as_i64().is_some());
    s.post(
        &format!("{DEV}/sessions/{s1}/complete"),
        &tok1,
        json!({"status": "failed"}),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/sessions/{s1}/logs"),
        &tok1,
        json!([{"level": "info", "message": "late"}]),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/sessions/{s2}/complete"),
        s.key(),
        json!({"status": "done"}),
    )
    .await
    .assert_error(422);
    // A device token cannot complete another device's session.
    s.post(
        &format!("{DEV}/sessions/{s2}/complete"),
        &tok1,
        json!({"status": "failed"}),
    )
    .await
    .assert_error(403);

    // List: newest first, filters, pagination.
    let r = s.get(&format!("{DEV}/sessions"), s.key()).await;
    assert_eq!(r.body["total"], 2);
    assert_eq!(r.body["items"][0]["id"], s2);
    assert!(r.body["items"][0].get("metrics").is_none());
    assert_eq!(
        s.get(&format!("{DEV}/sessions?status=completed"), s.key())
            .await
            .body["total"],
        1
    );
    assert_eq!(
        s.get(&format!("{DEV}/sessions?status=active"), s.key())
            .await
            .body["items"][0]["id"],
        s2
    );
    assert_eq!(
        s.get(&format!("{DEV}/sessions?device_id={d1}"), s.key())
            .await
            .body["items"][0]["id"],
        s1
    );
    s.get(&format!("{DEV}/sessions?status=paused"), s.key())
        .await
        .assert_error(422);
    s.get(&format!("{DEV}/sessions?since=yesterday"), s.key())
        .await
        .assert_error(422);
    let r = s
        .get(&format!("{DEV}/sessions?page=2&page_size=1"), s.key())
        .await;
    assert_eq!(r.body["items"][0]["id"], s1);
    assert_eq!(r.body["has_more"], false);
    let future = "2999-01-01T00:00:00Z";
    assert_eq!(
        s.get(&format!("{DEV}/sessions?since={future}"), s.key())
            .await
            .body["total"],
        0
    );
    assert_eq!(
        s.get(&format!("{DEV}/sessions?until={future}"), s.key())
            .await
            .body["total"],
        2
    );
    let started = s.get(&format!("{DEV}/sessions/{s2}"), s.key()).await.body["started_at"]
        .as_str()
        .unwrap()
        .to_string();
    let enc = started.replace(':', "%3A");
    let r = s.get(&format!("{DEV}/sessions?since={enc}"), s.key()).await;
    assert!(
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == s2),
        "since is inclusive"
    );
    let r = s.get(&format!("{DEV}/sessions?until={enc}"), s.key()).await;
    assert!(
        !r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == s2),
        "until is exclusive"
    );
}

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

/// A known data set: timestamps out of arrival order, ties, several modules and levels.
pub async fn seeded(s: &Srv) -> u64 {
    let (d, tok) = device(s, "probe").await;
    let sid = session(s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let batch1 = json!([
        {"timestamp": "2026-03-01T10:00:05.000Z", "level": "warn", "module": "drive", "message": "Motor temperature high", "metadata": {"c": 81}},
        {"timestamp": "2026-03-01T10:00:01.000Z", "level": "info", "module": "nav", "message": "route planned"},
        {"timestamp": "2026-03-01T10:00:03.250Z", "level": "error", "module": "drive", "message": "MOTOR stall"},
    ]);
    let batch2 = json!([
        {"timestamp": "2026-03-01T10:00:03.250Z", "level": "debug", "module": "drive", "message": "motor current 3A"},
        {"timestamp": "2026-03-01T11:00:03+01:00", "level": "warn", "module": "nav", "message": "obstacle"},
        {"timestamp": "2026-03-01T10:00:09.999Z", "level": "INFO", "module": "", "message": "done"},
    ]);
    assert_eq!(s.post(&logs, &tok, batch1).await.status, 202);
    assert_eq!(s.post(&logs, &tok, batch2).await.status, 202);
    // On the sealing backends, what follows reads sealed chunks.
    s.sealed(sid).await;
    sid
}

fn messages(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect()
}

every_log_store!(log_query_filters_against_a_known_data_set);
async fn log_query_filters_against_a_known_data_set() {
    let s = start().await;
    let sid = seeded(&s).await;
    if crate::backend::backend().blobs_on_s3() {
        let keys = s.segment_keys().await;
        assert!(
            keys.iter().any(|k| k.contains(&format!("/{sid}/"))),
            "no segment of session {sid} in the bucket: {keys:?}"
        );
    }
    let q = |query: &str| format!("{DEV}/sessions/{sid}/logs{query}");
    let k = s.key();

    // Everything, ascending by timestamp, ties in arrival order ("MOTOR stall" arrived first).
    let r = s.get(&q(""), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["total"], 6);
    assert_eq!(
        messages(&r.body),
        [
            "route planned",
            "obstacle",
            "MOTOR stall",
            "motor current 3A",
            "Motor temperature high",
            "done"
        ]
    );
    let first = &r.body["items"][4];
    assert_eq!(first["timestamp"], "2026-03-01T10:00:05.000Z");
    assert_eq!(first["level"], "WARN");
    assert_eq!(first["module"], "drive");
    assert_eq!(first["metadata"], json!({"c": 81}));
    assert_eq!(r.body["items"][0]["metadata"], json!({}));
    assert_eq!(
        r.body["items"][1]["timestamp"], "2026-03-01T10:00:03.000Z",
        "offset normalised to Z"
    );

    let cases: Vec<(&str, Vec<&str>, usize)> = vec![
        ("?level=warn", vec!["obstacle", "Motor temperature high"], 2),
        (
            "?level=warn,error",
            vec!["obstacle", "MOTOR stall", "Motor temperature high"],
            3,
        ),
        ("?level=debug", vec!["motor current 3A"], 1),
        (
            "?module=drive",
            vec!["MOTOR stall", "motor current 3A", "Motor temperature high"],
            3,
        ),
        ("?module=", vec!["done"], 1),
        ("?module=nope", vec![], 0),
        (
            "?search=motor",
            vec!["MOTOR stall", "motor current 3A", "Motor temperature high"],
            3,
        ),
        (
            "?search=MoToR&level=warn",
            vec!["Motor temperature high"],
            1,
        ),
        (
            "?search=motor&module=drive&level=error,debug",
            vec!["MOTOR stall", "motor current 3A"],
            2,
        ),
        (
            "?since=2026-03-01T10:00:03.250Z",
            vec![
                "MOTOR stall",
                "motor current 3A",
                "Motor temperature high",
                "done",
            ],
            4,
        ),
        (
            "?until=2026-03-01T10:00:03.250Z",
            vec!["route planned", "obstacle"],
            2,
        ),
        (
            "?since=2026-03-01T10:00:02Z&until=2026-03-01T10:00:06Z&search=motor",
            vec!["MOTOR stall", "motor current 3A", "Motor temperature high"],
            3,
        ),
        ("?limit=2", vec!["route planned", "obstacle"], 6),
        (
            "?limit=2&offset=2",
            vec!["MOTOR stall", "motor current 3A"],
            6,
        ),
        ("?limit=2&offset=5", vec!["done"], 6),
        ("?offset=10", vec![], 6),
        (
            "?search=motor&limit=1&offset=1",
            vec!["motor current 3A"],
            3,
        ),
    ];
    for (query, want, total) in cases {
        let url = q(&query.replace('+', "%2B"));
        let r = s.get(&url, k).await;
        assert_eq!(r.status, 200, "{query}: {}", r.body);
        assert_eq!(messages(&r.body), want, "{query}");
        assert_eq!(r.body["total"], total, "{query}");
    }
    for bad in [
        "?level=loud",
        "?limit=0",
        "?limit=10001",
        "?since=noon",
        "?offset=-1",
        "?limit=x",
        "?offset=999901",
        "?offset=18446744073709551615",
    ] {
        s.get(&q(bad), k).await.assert_error(422);
    }
    assert_eq!(
        s.get(&q("?offset=999901"), k).await.assert_error(422),
        "offset: offset + limit is at most 1000000; page further with since"
    );
    assert_eq!(s.get(&q("?limit=10000"), k).await.status, 200);
    // The deepest page: offset + limit up to `max_result_window` (1,000,000).
    let deepest = s.get(&q("?offset=999900"), k).await;
    assert_eq!(deepest.status, 200, "{}", deepest.body);
    assert_eq!(deepest.body["total"], 6);
}

every_log_store!(tags_delete_and_tenancy);
async fn tags_delete_and_tenancy() {
    let s = start().await;
    let sid = seeded(&s).await;
    let k = s.key();
    let base = format!("{DEV}/sessions/{sid}");
    let r = s
        .post(&format!("{base}/tags"), k, json!({"tag": "field-test"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["tags"], json!(["field-test"]));
    assert_eq!(
        s.post(&format!("{base}/tags"), k, json!({"tag": "field-test"}))
            .await
            .body["tags"],
        json!(["field-test"])
    );
    s.post(&format!("{base}/tags"), k, json!({"tag": ""}))
        .await
        .assert_error(422);
    s.post(&format!("{base}/tags"), k, json!({"tag": "x".repeat(65)}))
        .await
        .assert_error(422);
    s.post(&format!("{base}/tags"), k, json!({"tag": "a/b"}))
        .await
        .assert_error(422);
    let r = s.delete(&format!("{base}/tags/absent"), k).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["tags"], json!(["field-test"]));
    let r = s.delete(&format!("{base}/tags/field-test"), k).await;
    assert_eq!(r.body["tags"], json!([]));
    // Tags can be edited after completion.
    s.post(&format!("{base}/complete"), k, json!({"status": "failed"}))
        .await;
    assert_eq!(
        s.post(&format!("{base}/tags"), k, json!({"tag": "post.mortem"}))
            .await
            .status,
        200
    );

    // Another project's session is 404.
    s.post(
        "/api/v1/organizations/default/projects",
        k,
        json!({"slug": "other"}),
    )
    .await;
    s.get(
        &format!("/api/v1/organizations/default/projects/other/sessions/{sid}"),
        k,
    )
    .await
    .assert_error(404);
    s.get(
        &format!("/api/v1/organizations/default/projects/other/sessions/{sid}/logs"),
        k,
    )
    .await
    .assert_error(404);
    s.delete(
        &format!("/api/v1/organizations/default/projects/other/sessions/{sid}"),
        k,
    )
    .await
    .assert_error(404);

    // Delete for good.
    assert_eq!(s.delete(&base, k).await.status, 204);
    assert_eq!(s.get(&base, k).await.assert_error(404), "Session not found");
    s.get(&format!("{base}/logs"), k).await.assert_error(404);
    s.delete(&base, k).await.assert_error(404);
    assert_eq!(s.get(&format!("{DEV}/sessions"), k).await.body["total"], 0);
}

every_log_store!(deleting_an_active_session_stops_its_ingestion);
async fn deleting_an_active_session_stops_its_ingestion() {
    let s = start().await;
    let (d, tok) = device(&s, "x").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    assert_eq!(
        s.post(&logs, &tok, json!([{"level": "info", "message": "a"}]))
            .await
            .status,
        202
    );
    assert_eq!(
        s.delete(&format!("{DEV}/sessions/{sid}"), s.key())
            .await
            .status,
        204
    );
    s.post(&logs, &tok, json!([{"level": "info", "message": "b"}]))
        .await
        .assert_error(404);
    // The device itself can be deleted; its other sessions keep its name.
    let sid2 = session(&s, d, &tok).await;
    assert_eq!(
        s.delete(&format!("{DEV}/devices/{d}"), s.key())
            .await
            .status,
        204
    );
    let r = s.get(&format!("{DEV}/sessions/{sid2}"), s.key()).await;
    assert_eq!(r.body["device_name"], "x");
}

every_log_store!(export_round_trips_as_json_and_csv);
async fn export_round_trips_as_json_and_csv() {
    let s = start().await;
    let sid = seeded(&s).await;
    let k = s.key();
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let query = s.get(&format!("{logs}?limit=10000"), k).await.body["items"].clone();

    let r = s
        .http
        .get(s.url(&format!("{logs}/export?format=json")))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(
        r.headers()["content-disposition"],
        format!("attachment; filename=\"session-{sid}-logs.json\"")
    );
    let exported: Value = r.json().await.unwrap();
    assert_eq!(exported, query);

    let r = s
        .http
        .get(s.url(&format!("{logs}/export?format=csv")))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    assert_eq!(
        r.headers()["content-disposition"],
        format!("attachment; filename=\"session-{sid}-logs.csv\"")
    );
    let text = r.text().await.unwrap();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    assert_eq!(
        rd.headers().unwrap(),
        vec!["timestamp", "level", "module", "message", "metadata"]
    );
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), query.as_array().unwrap().len());
    for (row, q) in rows.iter().zip(query.as_array().unwrap()) {
        assert_eq!(&row[0], q["timestamp"].as_str().unwrap());
        assert_eq!(&row[1], q["level"].as_str().unwrap());
        assert_eq!(&row[2], q["module"].as_str().unwrap());
        assert_eq!(&row[3], q["message"].as_str().unwrap());
        assert_eq!(
            serde_json::from_str::<Value>(&row[4]).unwrap(),
            q["metadata"]
        );
    }
    // Filters apply to the export too.
    let r = s
        .http
        .get(s.url(&format!(
            "{logs}/export?format=json&level=warn&search=motor"
        )))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(messages(&json!({"items": v})), ["Motor temperature high"]);
    s.get(&format!("{logs}/export?format=xml"), k)
        .await
        .assert_error(422);
    s.get(&format!("{DEV}/sessions/999999/logs/export"), k)
        .await
        .assert_error(404);
}

every_log_store!(export_of_many_lines_with_quoting);
async fn export_of_many_lines_with_quoting() {
    let s = start().await;
    let (d, tok) = device(&s, "bulk").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    for b in 0..3 {
        let batch: Vec<Value> = (0..5000)
            .map(|i| json!({"level": "info", "module": "m,1", "message": format!("line \"{b}\"\n{i}, ok"), "metadata": {"i": i}}))
            .collect();
        assert_eq!(s.post(&logs, &tok, Value::Array(batch)).await.status, 202);
    }
    let text = s
        .http
        .get(s.url(&format!("{logs}/export?format=csv")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 15_000);
    assert_eq!(&rows[0][2], "m,1");
    assert_eq!(&rows[0][3], "line \"0\"\n0, ok");
    let v: Value = s
        .http
        .get(s.url(&format!("{logs}/export")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v.as_array().unwrap().len(), 15_000);
    assert_eq!(v[14_999]["metadata"], json!({"i": 4999}));
}

/// A session of 200,000 lines (about 24 MB of CSV: more than an export's channel and the
/// sockets' buffers hold, so an export nobody reads stays in flight); its logs path.
async fn big_session(s: &Srv) -> String {
    let (d, tok) = device(s, "bulk").await;
    let sid = session(s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let text = "x".repeat(100);
    for _ in 0..20 {
        let batch: Vec<Value> = (0..10_000)
            .map(|i| json!({"level": "info", "message": format!("{text} {i}")}))
            .collect();
        assert_eq!(s.post(&logs, &tok, Value::Array(batch)).await.status, 202);
    }
    logs
}

/// A CSV export of the session at `logs`, its headers read, its body not yet.
async fn csv_export(s: &Srv, logs: &str) -> reqwest::Response {
    s.http
        .get(s.url(&format!("{logs}/export?format=csv")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap()
}

every_log_store!(exports_past_max_streams_are_503_and_a_dropped_one_frees_its_place);
/// Exports hold a blocking thread while they stream, so at most `[sessions] max_streams` run
/// at once (503 with `Retry-After` past it), and one whose reader went away gives its place
/// back.
async fn exports_past_max_streams_are_503_and_a_dropped_one_frees_its_place() {
    let s = start_with(|c| c.sessions.max_streams = 1).await;
    let logs = big_session(&s).await;
    let export = || csv_export(&s, &logs);
    let held = export().await;
    assert_eq!(held.status(), 200);
    let refused = export().await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    drop(held);
    let mut freed = None;
    for _ in 0..250 {
        let r = export().await;
        if r.status() == 200 {
            freed = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let body = freed
        .expect("the dropped export gave its place back")
        .text()
        .await
        .unwrap();
    assert_eq!(body.lines().count(), 200_001, "a header and every line");
}

every_log_store!(an_export_nobody_reads_is_cut_short_and_ends_in_an_error);
/// An export whose reader stops reading is cut short after `stalled_reader_seconds`: its
/// thread and its place are given back, and the reader, when it comes back, gets an error,
/// never a body that ends as if it were whole.
async fn an_export_nobody_reads_is_cut_short_and_ends_in_an_error() {
    let s = start_with(|c| {
        c.sessions.max_streams = 1;
        c.sessions.stalled_reader_seconds = 1;
    })
    .await;
    let logs = big_session(&s).await;
    let export = || csv_export(&s, &logs);
    let stalled = export().await;
    assert_eq!(stalled.status(), 200);
    // Unread past the stall: its place comes back while its reader still holds it.
    let mut freed = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let r = export().await;
        if r.status() == 200 {
            freed = true;
            break;
        }
    }
    assert!(freed, "the stalled export gave its place back");
    // Read now, what it sent is followed by an error, not a clean end.
    assert!(
        stalled.bytes().await.is_err(),
        "a cut-short export must not end cleanly"
    );
}

every_log_store!(idle_sessions_passivate_and_come_back_on_append);
/// Idle session actors passivate: with no appends and no subscribers for
/// `[sessions] idle_seconds` they stop and release their buffers; the next append or
/// subscriber starts them again from storage, with nothing lost.
async fn idle_sessions_passivate_and_come_back_on_append() {
    let s = start_with(|c| c.sessions.idle_seconds = 3).await;
    let (d, tok) = device(&s, "r").await;
    let running = |s: &Srv| {
        let s = s.http.get(s.url("/metrics"));
        async move {
            let m = s.send().await.unwrap().text().await.unwrap();
            m.lines()
                .find_map(|l| l.strip_prefix("fleetops_session_actors_running "))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        }
    };
    // 10,000 open sessions, each with one line (so each started an actor), from 32 clients.
    let made = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (http, base, tok, made) = (s.http.clone(), s.base.clone(), tok.clone(), made.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..(10_000 / 32 + 1) {
                let r: Value = http
                    .post(format!("{base}{DEV}/sessions"))
                    .bearer_auth(&tok)
                    .json(&json!({"device_id": d}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let sid = r["id"].as_u64().unwrap();
                let r = http
                    .post(format!("{base}{DEV}/sessions/{sid}/logs"))
                    .bearer_auth(&tok)
                    .json(&json!([{"level": "info", "message": "first"}]))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                made.lock().unwrap().push(sid);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut ids = made.lock().unwrap().clone();
    ids.sort_unstable();
    assert!(ids.len() >= 10_000);
    assert!(running(&s).await >= 1);
    assert!(
        eventually(30, || async { running(&s).await == 0 }).await,
        "idle session actors stopped"
    );
    // Back on append, counts and replay rebuilt from storage.
    for sid in ids.iter().step_by(ids.len() / 20).take(20) {
        let r = s
            .post(
                &format!("{DEV}/sessions/{sid}/logs"),
                &tok,
                json!([{"level": "info", "message": "second"}]),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.body);
        let l = s.get(&format!("{DEV}/sessions/{sid}/logs"), s.key()).await;
        assert_eq!(l.body["total"], 2, "{}", l.body);
    }
    assert_eq!(running(&s).await, 20);
}

every_log_store!(csv_exports_neutralize_cells_a_spreadsheet_would_run);
/// A device's log line that a spreadsheet would read as a formula is exported to CSV with a
/// leading `'` (module and message alike); the JSON export keeps it as logged.
async fn csv_exports_neutralize_cells_a_spreadsheet_would_run() {
    let s = start().await;
    let (d, tok) = device(&s, "r1").await;
    let sid = session(&s, d, &tok).await;
    let logs = format!("{DEV}/sessions/{sid}/logs");
    let risky = [
        "=HYPERLINK(\"http://x\")",
        "+1",
        "-1+2",
        "@SUM(A1)",
        "\tcmd",
        "\rcmd",
    ];
    let batch: Vec<Value> = risky
        .iter()
        .map(|m| json!({"level": "info", "module": "=mod", "message": m}))
        .chain([json!({"level": "info", "module": "arm", "message": "a = b"})])
        .collect();
    assert_eq!(s.post(&logs, &tok, Value::Array(batch)).await.status, 202);
    let text = s
        .http
        .get(s.url(&format!("{logs}/export?format=csv")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let rows: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), risky.len() + 1);
    for (row, m) in rows.iter().zip(risky) {
        assert_eq!((&row[2], &row[3]), ("'=mod", format!("'{m}").as_str()));
    }
    let last = rows.last().unwrap();
    assert_eq!(
        (&last[2], &last[3]),
        ("arm", "a = b"),
        "other cells as logged"
    );
    let v: Value = s
        .http
        .get(s.url(&format!("{logs}/export?format=json")))
        .bearer_auth(s.key())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v[0]["message"], risky[0]);
    assert_eq!(v[0]["module"], "=mod");
}

every_log_store!(one_organizations_slow_exports_hold_only_its_share_of_the_places);
/// Slow readers of one organization hold at most its share of the export places
/// (`[sessions] max_streams_per_org`): its next export is 503 while another organization's
/// goes through.
async fn one_organizations_slow_exports_hold_only_its_share_of_the_places() {
    let s = start_with(|c| {
        c.sessions.max_streams = 3;
        c.sessions.max_streams_per_org = 2;
    })
    .await;
    let logs = big_session(&s).await;
    let held = [csv_export(&s, &logs).await, csv_export(&s, &logs).await];
    assert!(held.iter().all(|r| r.status() == 200));
    let refused = csv_export(&s, &logs).await;
    assert_eq!(refused.status(), 503, "past the organization's share");
    assert!(refused.headers().contains_key("retry-after"));
    // Another organization's export takes the place left.
    let r = s
        .post("/api/v1/organizations", s.key(), json!({"slug": "acme"}))
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let base = "/api/v1/organizations/acme/projects/p";
    let r = s
        .post(
            "/api/v1/organizations/acme/projects",
            s.key(),
            json!({"slug": "p"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(&format!("{base}/devices"), s.key(), json!({"name": "r"}))
        .await;
    let (d, tok) = (
        r.body["id"].as_u64().unwrap(),
        r.body["device_token"].as_str().unwrap().to_string(),
    );
    let r = s
        .post(&format!("{base}/sessions"), &tok, json!({"device_id": d}))
        .await;
    let sid = r.body["id"].as_u64().unwrap();
    let theirs = format!("{base}/sessions/{sid}/logs");
    let r = s
        .post(&theirs, &tok, json!([{"level": "info", "message": "hi"}]))
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let r = csv_export(&s, &theirs).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap().lines().count(), 2);
    drop(held);
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
