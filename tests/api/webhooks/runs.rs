//! Test runs: their filters, and runners claiming, renewing and completing them.

use serde_json::{Value, json};

use super::*;

each_backend!(test_runs_filter_by_status_commit_and_repository);
async fn test_runs_filter_by_status_commit_and_repository() {
    let (s, _) = installed().await;
    link(&s, "octo-org/octo-repo").await;
    let sha1 = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    let sha2 = "1111111111111111111111111111111111111111";
    for (n, sha) in [(2, sha1), (3, sha2)] {
        assert_eq!(
            run(&s, "pull_request", &pr("opened", n, sha, false)).await["outcome"],
            "dispatched"
        );
    }
    let mut closed = payload("pull_request.closed");
    closed["installation"]["id"] = json!(INST);
    closed["number"] = json!(3);
    closed["pull_request"]["number"] = json!(3);
    assert_eq!(
        run(&s, "pull_request", &closed).await["outcome"],
        "dispatched"
    );
    assert_eq!(
        run(&s, "workflow_run", &payload("workflow_run.completed")).await["outcome"],
        "dispatched"
    );
    let all = runs(&s, "page_size=500").await;
    assert_eq!(all["total"], 3, "{all}");
    let cancelled = runs(&s, "status=cancelled").await;
    assert_eq!(cancelled["total"], 1, "{cancelled}");
    let by_sha = runs(&s, &format!("commit_sha={sha1}")).await;
    assert_eq!(by_sha["total"], 1);
    let by_repo = runs(&s, "repository=octo-org/octo-repo").await;
    assert_eq!(by_repo["total"], 1);
    // A commit id is one commit however it is spelled: a pull request sent in capitals
    // stores it lower-cased, and the filter finds it in either spelling.
    let shouted = "ABCDEF0123456789ABCDEF0123456789ABCDEF01";
    assert_eq!(
        run(&s, "pull_request", &pr("opened", 4, shouted, false)).await["outcome"],
        "dispatched"
    );
    for q in [shouted.to_string(), shouted.to_ascii_lowercase()] {
        let by_sha = runs(&s, &format!("commit_sha={q}")).await;
        assert_eq!(by_sha["total"], 1, "{q}: {by_sha}");
        assert_eq!(
            by_sha["items"][0]["commit_sha"],
            shouted.to_ascii_lowercase()
        );
    }
    // The same pull request and commit spelled in lower case is the same job.
    let again = run(
        &s,
        "pull_request",
        &pr("synchronize", 4, &shouted.to_ascii_lowercase(), false),
    )
    .await;
    assert_eq!(again["reason"], "duplicate_job", "{again}");
}

each_backend!(runners_claim_renew_complete_and_leases_expire);
async fn runners_claim_renew_complete_and_leases_expire() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.runs.lease_seconds = 60;
    })
    .await;
    link(&s, REPO).await;
    for n in 1..=2 {
        let d = run(
            &s,
            "pull_request",
            &pr("opened", n, &format!("{n:040}"), false),
        )
        .await;
        assert_eq!(d["outcome"], "dispatched");
    }
    let claim = format!("{DEV}/test-runs/claim");
    let a = s.post(&claim, s.key(), json!({})).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.body["pull_request_number"], 1);
    assert!(a.body["lease_expires_at"].is_string());
    let a_id = a.body["id"].as_u64().unwrap();
    let b = s.post(&claim, s.key(), json!({})).await;
    assert_eq!(b.body["pull_request_number"], 2);
    let b_id = b.body["id"].as_u64().unwrap();
    let none = s.post(&claim, s.key(), json!({})).await;
    assert_eq!(none.status, 204);
    // Heartbeats keep `a` alive; `b` lapses and returns to the queue with attempt 2. Time
    // moves on the runtime's clock, so no step depends on a sleep being on time.
    let clock = s.running.as_ref().unwrap().runtime.clock.clone();
    let secs = std::time::Duration::from_secs;
    clock.advance(secs(40));
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/heartbeat"),
            s.key(),
            json!({}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // 40 s in, both leases hold (the expiry pass runs every second).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = s.get(&format!("{DEV}/test-runs/{b_id}"), s.key()).await;
    assert_eq!(
        (r.body["status"].clone(), r.body["attempt"].clone()),
        (json!("running"), json!(1))
    );
    // 70 s in: `b`'s lease (to 60 s) has lapsed, `a`'s (renewed to 100 s) holds.
    clock.advance(secs(30));
    assert!(
        eventually(10, || async {
            let r = s.get(&format!("{DEV}/test-runs/{b_id}"), s.key()).await;
            (r.body["status"].clone(), r.body["attempt"].clone()) == (json!("queued"), json!(2))
        })
        .await
    );
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/heartbeat"),
            s.key(),
            json!({}),
        )
        .await;
    assert_eq!(r.body["status"], "running");
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/complete"),
            s.key(),
            json!({"status": "ok"}),
        )
        .await;
    r.assert_error(422);
    let r = s
        .post(
            &format!("{DEV}/test-runs/{a_id}/complete"),
            s.key(),
            json!({"status": "passed", "summary": "12 passed"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["status"], "passed");
    assert_eq!(r.body["summary"], "12 passed");
    assert_eq!(r.body["lease_expires_at"], Value::Null);
    s.post(
        &format!("{DEV}/test-runs/{a_id}/complete"),
        s.key(),
        json!({"status": "failed"}),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/test-runs/{a_id}/heartbeat"),
        s.key(),
        json!({}),
    )
    .await
    .assert_error(409);
    s.get(&format!("{DEV}/test-runs/999999"), s.key())
        .await
        .assert_error(404);
    // A redelivery of a passed run's commit makes no new run.
    let d = run(
        &s,
        "pull_request",
        &pr("opened", 1, &format!("{:040}", 1), false),
    )
    .await;
    skipped(&d, "duplicate_job");
}
