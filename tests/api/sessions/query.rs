//! Log queries against a known data set: levels, modules, search, time bounds and paging.

use serde_json::json;

use super::*;

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
