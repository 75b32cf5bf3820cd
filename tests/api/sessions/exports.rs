//! Exports: JSON and CSV, many lines, quoting and neutralized cells, the cap on concurrent
//! streams, a reader that stalls, and one organization's share of the places.

use serde_json::{Value, json};

use super::*;

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
