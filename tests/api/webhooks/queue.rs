//! The delivery queue: 500 at once, an actor's panic, the dedup window, retention, batches
//! worked in order, the merged log's pages.

use serde_json::{Value, json};

use super::*;

/// Sends twenty pull requests as one batch and waits for each: every one dispatched into a
/// run of its own, the runs made in arrival order. Their run ids, in arrival order.
async fn twenty_prs_each_dispatched_once(s: &Srv) -> Vec<u64> {
    let plan = (1..=20u64)
        .map(|n| ("pull_request", pr("opened", n, &format!("{n:040}"), false)))
        .collect();
    let ids = send_held(s, plan).await;
    let mut run_ids = Vec::new();
    for id in &ids {
        let d = settled(s, id).await;
        assert_eq!(d["outcome"], "dispatched", "{d}");
        run_ids.push(d["test_run_id"].as_u64().expect("a run"));
    }
    let mut sorted = run_ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(run_ids, sorted, "one run each, made in arrival order");
    run_ids
}

/// A server with the repository linked and installed, whose calls wait long enough for a
/// held intake write (the batch tests hold it while their deliveries queue).
async fn installed_for_batches() -> Srv {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.supervision.call_timeout_ms = 30_000;
    })
    .await;
    link(&s, REPO).await;
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    s
}

/// Sends `plan` while the intake's write is held, so it is stored as one batch and reaches
/// the worker together; returns the delivery ids once every one is answered 202.
async fn send_held(s: &Srv, plan: Vec<(&'static str, Value)>) -> Vec<String> {
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let hold = rt.webhooks.inject_write_hold();
    let mut ids = Vec::new();
    let mut tasks = Vec::new();
    for (i, (event, body)) in plan.into_iter().enumerate() {
        let id = uuid::Uuid::new_v4().to_string();
        ids.push(id.clone());
        let bytes = serde_json::to_vec(&body).unwrap();
        let sig = sign(SECRET, &bytes);
        let (http, url) = (s.http.clone(), s.url(&format!("{SCM}/webhooks")));
        tasks.push(tokio::spawn(async move {
            http.post(url)
                .header("X-Host-Event", event)
                .header("X-Host-Delivery", id)
                .header("X-Hub-Signature-256", sig)
                .body(bytes)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
        assert!(eventually(10, || async { rt.webhooks.intake_waiting() == i + 1 }).await);
    }
    hold.release();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 202);
    }
    ids
}

// On a multi-threaded runtime, as the server runs in production: a store call that waits
// for the database then holds one worker, not the whole server.
each_backend!(
    five_hundred_concurrent_deliveries_are_all_accepted_and_processed,
    threads = 4
);
async fn five_hundred_concurrent_deliveries_are_all_accepted_and_processed() {
    let s = webhook_server().await;
    link(&s, REPO).await;
    let mut tasks = Vec::new();
    for n in 0..500u64 {
        let body = serde_json::to_vec(&pr("opened", n + 1, &format!("{n:040}"), false)).unwrap();
        let (http, url) = (s.http.clone(), s.url(&format!("{SCM}/webhooks")));
        tasks.push(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let st = http
                .post(url)
                .header("X-Host-Event", "pull_request")
                .header("X-Host-Delivery", uuid::Uuid::new_v4().to_string())
                .header("X-Hub-Signature-256", sign(SECRET, &body))
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            (st, started.elapsed())
        }));
    }
    for t in tasks {
        let (st, took) = t.await.unwrap();
        assert_eq!(st, 202);
        // A server whose workers all wait on the database answers none of them: ten
        // seconds is far beyond a loaded CI machine's worst answer and far below a stall.
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
    assert!(
        eventually(30, || async {
            runs(&s, "page_size=1").await["total"] == 500
        })
        .await,
        "not every delivery made its run"
    );
    let queued = s
        .get(&format!("{SCM}/deliveries?outcome=queued"), s.key())
        .await;
    assert!(
        eventually(10, || async {
            s.get(
                &format!("{SCM}/deliveries?outcome=dispatched&page_size=1"),
                s.key(),
            )
            .await
            .body["total"]
                == 500
        })
        .await,
        "{}",
        queued.body
    );
}

each_backend!(an_installation_actor_panic_loses_no_delivery);
/// A panic in an installation's actor: it restarts, and deliveries queued behind the fault
/// are all processed, once.
async fn an_installation_actor_panic_loses_no_delivery() {
    let s = webhook_server().await;
    link(&s, REPO).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let mut ids = Vec::new();
    for n in 0..40u64 {
        if n == 10 {
            rt.webhooks.inject_panic(INST).await.unwrap();
        }
        let (id, r) = deliver(
            &s,
            "pull_request",
            &pr("opened", n + 1, &format!("{n:040}"), false),
        )
        .await;
        assert_eq!(r.status, 202);
        ids.push(id);
    }
    for id in &ids {
        assert_eq!(settled(&s, id).await["outcome"], "dispatched");
    }
    assert_eq!(runs(&s, "page_size=1").await["total"], 40);
    assert!(rt.restarts() > 0);
}

each_backend!(delivery_ids_are_remembered_for_the_dedup_window);
/// A delivery id is refused within the dedup window and accepted again after it (the
/// housekeeper frees expired ids); the delivery log keeps the first delivery.
async fn delivery_ids_are_remembered_for_the_dedup_window() {
    let s = start_with(|c| {
        c.scm.webhook_secret = SECRET.into();
        c.scm.dedup_window_seconds = 60;
    })
    .await;
    let body = b"{}".to_vec();
    let id = uuid::Uuid::new_v4().to_string();
    let sig = sign(SECRET, &body);
    assert_eq!(
        raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
            .await
            .status,
        202
    );
    raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
        .await
        .assert_error(401);
    let rt = s.running.as_ref().unwrap().runtime.clone();
    rt.webhooks.expire().await.unwrap();
    // Still inside the window: still refused.
    raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
        .await
        .assert_error(401);
    rt.clock.advance(std::time::Duration::from_secs(61));
    rt.webhooks.expire().await.unwrap();
    assert_eq!(
        raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
            .await
            .status,
        202
    );
    // The dedup window survives a restart.
    raw(&s, Some("ping"), Some(&id), Some(&sig), body.clone())
        .await
        .assert_error(401);
    drop(rt);
    let s = s.restart().await;
    raw(&s, Some("ping"), Some(&id), Some(&sig), body)
        .await
        .assert_error(401);
}

each_backend!(the_delivery_log_forgets_deliveries_after_30_days);
/// The delivery log keeps an accepted delivery 30 days: a day short of it the housekeeper
/// keeps it, past it the housekeeper's pass removes it (404, out of the list and its total).
async fn the_delivery_log_forgets_deliveries_after_30_days() {
    let s = webhook_server().await;
    let (id, r) = deliver(&s, "ping", &json!({"zen": "keep it logically awesome"})).await;
    assert_eq!(r.status, 202, "{}", r.body);
    settled(&s, &id).await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let day = std::time::Duration::from_secs(86_400);
    rt.clock.advance(29 * day);
    rt.housekeep_now();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        s.get(&format!("{SCM}/deliveries/{id}"), s.key())
            .await
            .status,
        200
    );
    rt.clock.advance(2 * day);
    rt.housekeep_now();
    assert!(
        eventually(10, || async {
            s.get(&format!("{SCM}/deliveries/{id}"), s.key())
                .await
                .status
                == 404
        })
        .await,
        "a delivery older than 30 days is still in the log"
    );
    let r = s.get(&format!("{SCM}/deliveries"), s.key()).await;
    assert_eq!(r.body["total"], 0, "{}", r.body);
}

each_backend!(deliveries_queued_together_are_worked_in_batches_in_order);
/// Deliveries queued together are worked in batches, in arrival order: a suspend or a
/// repository's removal between pull requests takes effect exactly between them, and a run of
/// more pull requests than one batch holds is worked whole, each once.
async fn deliveries_queued_together_are_worked_in_batches_in_order() {
    let s = installed_for_batches().await;
    let sha = |n: u64| format!("{n:040}");
    let mut suspend = payload("installation.suspend");
    suspend["installation"]["id"] = json!(INST);
    let mut unsuspend = suspend.clone();
    unsuspend["action"] = json!("unsuspend");
    let mut removed = payload("installation_repositories.removed");
    removed["installation"]["id"] = json!(INST);
    removed["repositories_removed"][0]["full_name"] = json!(REPO);
    let mut added = payload("installation_repositories.added");
    added["installation"]["id"] = json!(INST);
    added["repositories_added"][0]["full_name"] = json!(REPO);
    let mut plan: Vec<(&str, Value)> = vec![
        ("pull_request", pr("opened", 1, &sha(1), false)),
        ("pull_request", pr("opened", 2, &sha(2), false)),
        ("installation", suspend),
        ("pull_request", pr("opened", 3, &sha(3), false)),
        ("installation", unsuspend),
        ("pull_request", pr("opened", 4, &sha(4), false)),
        ("installation_repositories", removed),
        ("pull_request", pr("opened", 5, &sha(5), false)),
        ("installation_repositories", added),
    ];
    for n in 6..=75 {
        plan.push(("pull_request", pr("opened", n, &sha(n), false)));
    }
    // Pull requests that name no installation go to the one holding their repository: the
    // move of the repository to another installation between them decides where each goes.
    let unnamed = |n: u64| {
        let mut p = pr("opened", n, &sha(n), false);
        p.as_object_mut().unwrap().remove("installation");
        p
    };
    let mut moved = payload("installation_repositories.added");
    moved["installation"]["id"] = json!(4242);
    moved["repositories_added"][0]["full_name"] = json!(REPO);
    plan.push(("pull_request", unnamed(76)));
    plan.push(("installation_repositories", moved));
    plan.push(("pull_request", unnamed(77)));
    // Everything queues in the intake's mailbox in the order sent, is stored in one batch,
    // and reaches the worker together.
    let ids = send_held(&s, plan).await;
    for (i, id) in ids.iter().enumerate() {
        let d = settled(&s, id).await;
        match i {
            2 | 4 | 6 | 8 => assert_eq!(d["outcome"], "processed", "{i}: {}", d["reason"]),
            3 => skipped(&d, "installation_suspended"),
            7 => skipped(&d, "repository_removed"),
            80 => assert_eq!(d["outcome"], "processed", "{i}: {}", d["reason"]),
            _ => assert_eq!(d["outcome"], "dispatched", "{i}: {}", d["reason"]),
        }
        match i {
            79 => assert_eq!(d["installation_id"], INST),
            81 => assert_eq!(d["installation_id"], 4242),
            _ => {}
        }
    }
    assert_eq!(runs(&s, "page_size=1").await["total"], 75);
}

each_backend!(a_dispatch_failing_mid_batch_is_retried_in_order_without_duplicates);
/// A dispatch that fails in the middle of a batch (as on a failing write) leaves that delivery
/// queued; it and everything after it are worked again one at a time, in order: every
/// delivery is dispatched once, into one run each, and the runs are made in arrival order.
async fn a_dispatch_failing_mid_batch_is_retried_in_order_without_duplicates() {
    let s = installed_for_batches().await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    // The twenty pull requests reach the worker as one batch; the fifth of them fails in
    // the dispatcher.
    let failed = rt.webhooks.inject_dispatch_failure(5);
    let run_ids = twenty_prs_each_dispatched_once(&s).await;
    // The failed attempt's run (its id taken, its writes taken back) left one gap, before
    // the fifth: had its writes been kept, the fifth's run would be the failed attempt's.
    let gaps: Vec<usize> = run_ids
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[1] != w[0] + 1)
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(gaps, vec![4], "{run_ids:?}");
    assert_eq!(runs(&s, "page_size=1").await["total"], 20);
    assert!(
        failed.load(std::sync::atomic::Ordering::SeqCst),
        "the injected failure happened"
    );
}

each_backend!(a_shared_commit_that_fails_leaves_its_deliveries_to_be_worked_again_in_order);
/// A shared batch of outcomes that fails to commit (as on a failing disk) leaves all of its
/// deliveries queued; each is worked again on its own, in order: every delivery is
/// dispatched once, into one run each, made in arrival order, and nothing of the failed
/// batch survives (its runs' ids are gaps).
async fn a_shared_commit_that_fails_leaves_its_deliveries_to_be_worked_again_in_order() {
    let s = installed_for_batches().await;
    let rt = s.running.as_ref().unwrap().runtime.clone();
    let failed = rt.webhooks.inject_commit_failure();
    let run_ids = twenty_prs_each_dispatched_once(&s).await;
    assert!(
        failed.load(std::sync::atomic::Ordering::SeqCst),
        "the injected failure happened"
    );
    // The failed batch had taken ids for its runs, so the runs kept start past a gap.
    let first = run_ids.first().copied().unwrap_or_default();
    let listed = runs(&s, "page_size=100").await;
    assert_eq!(listed["total"], 20, "no run of the failed batch was kept");
    let lowest = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_u64())
        .min()
        .unwrap();
    assert_eq!(lowest, first);
    assert!(
        first > 1,
        "the failed batch's run ids were taken and left unused: {run_ids:?}"
    );
}

each_backend!(one_batch_reads_the_runs_its_earlier_deliveries_made);
/// Deliveries worked in one batch see the runs the earlier ones made: a repeat of a pull
/// request's head is a duplicate job, and its close cancels both heads' runs, as if they had
/// come one at a time (the dispatcher commits its shared batch before a delivery that may
/// read what it holds).
async fn one_batch_reads_the_runs_its_earlier_deliveries_made() {
    let s = installed_for_batches().await;
    let (a, b, c) = (
        format!("{:040}", 1),
        format!("{:040}", 2),
        "abcdef".repeat(7)[..40].to_string(),
    );
    // A push of a commit, then a rerequest of its suite spelled in capitals: attempt 2.
    let push_c = push("refs/heads/main", &c);
    let mut rerequest = payload("check_suite.rerequested");
    rerequest["check_suite"]["head_sha"] = json!(c.to_ascii_uppercase());
    rerequest["check_suite"]["head_branch"] = json!("main");
    rerequest["installation"]["id"] = json!(INST);
    rerequest["repository"]["full_name"] = json!(REPO.to_ascii_uppercase());
    let ids = send_held(
        &s,
        vec![
            ("pull_request", pr("opened", 7, &a, false)),
            ("pull_request", pr("opened", 8, &a, false)),
            ("pull_request", pr("opened", 7, &a, false)),
            ("pull_request", pr("synchronize", 7, &b, false)),
            ("pull_request", pr("closed", 7, &b, false)),
            ("pull_request", pr("opened", 9, &b, false)),
            // A close whose head is new: only its number ties it to 10's run.
            (
                "pull_request",
                pr("opened", 10, &format!("{:040}", 3), false),
            ),
            (
                "pull_request",
                pr("closed", 10, &format!("{:040}", 4), false),
            ),
            ("push", push_c),
            ("check_suite", rerequest),
        ],
    )
    .await;
    let mut out = Vec::new();
    for id in &ids {
        let d = settled(&s, id).await;
        out.push((
            d["outcome"].as_str().unwrap().to_string(),
            d["reason"].as_str().map(str::to_string),
        ));
    }
    let dispatched = ("dispatched".to_string(), None);
    let mut expected = vec![dispatched.clone(); 10];
    expected[2] = ("skipped".into(), Some("duplicate_job".into()));
    assert_eq!(out, expected);
    let cancelled = runs(&s, "status=cancelled").await;
    assert_eq!(cancelled["total"], 3, "{cancelled}");
    assert_eq!(runs(&s, "status=queued").await["total"], 4);
    let d = settled(&s, &ids[9]).await;
    let id = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
    assert_eq!(r.body["attempt"], 2, "{}", r.body);
}

each_backend!(the_merged_delivery_log_pages_as_the_whole_list_reads);
/// The superuser's log merges stored deliveries with the rejected ones kept in memory; every
/// page of it, read one window deep into the store, is the same slice of the whole list.
async fn the_merged_delivery_log_pages_as_the_whole_list_reads() {
    let s = webhook_server().await;
    // Stored and rejected deliveries interleaved in time, some in the same millisecond.
    for i in 0..24u32 {
        if i % 3 == 1 {
            let id = uuid::Uuid::new_v4().to_string();
            let r = raw(
                &s,
                Some("push"),
                Some(&id),
                Some("sha256=00"),
                b"{}".to_vec(),
            )
            .await;
            assert_eq!(r.status, 401);
        } else {
            let (_, r) = deliver(&s, "ping", &json!({"zen": i})).await;
            assert_eq!(r.status, 202);
        }
        if i % 4 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
    }
    let whole = s
        .get(&format!("{SCM}/deliveries?page_size=500"), s.key())
        .await;
    assert_eq!(whole.body["total"], 24, "{}", whole.body);
    let whole = whole.body["items"].as_array().unwrap().clone();
    assert_eq!(whole.len(), 24);
    for size in [1usize, 3, 5, 7] {
        let mut paged = Vec::new();
        for page in 1..=24usize.div_ceil(size) + 1 {
            let r = s
                .get(
                    &format!("{SCM}/deliveries?page_size={size}&page={page}"),
                    s.key(),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.body["total"], 24);
            paged.extend(r.body["items"].as_array().unwrap().iter().cloned());
        }
        assert_eq!(paged, whole, "pages of {size}");
    }
}

each_backend!(a_long_event_name_is_ignored_and_logged_short);
/// An event name no subscription could match, however long, is ignored (202) like any
/// other unsubscribed event: its id is claimed, and the log keeps the name cut short (its
/// first 64 characters and "...", as for a rejected delivery).
async fn a_long_event_name_is_ignored_and_logged_short() {
    let s = webhook_server().await;
    let long = "x".repeat(80);
    let (id, r) = deliver(&s, &long, &json!({"zen": 1})).await;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body, json!({"status": "ignored"}));
    let d = s.get(&format!("{SCM}/deliveries/{id}"), s.key()).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body["event"], format!("{}...", "x".repeat(64)));
    assert_eq!(d.body["outcome"], "ignored");
    // Its id is claimed like any correctly signed delivery's.
    let body = serde_json::to_vec(&json!({"zen": 1})).unwrap();
    let sig = sign(SECRET, &body);
    let again = raw(&s, Some(&long), Some(&id), Some(&sig), body).await;
    assert_eq!(again.assert_error(401), "Duplicate delivery");
    // No event at all is still a bad request.
    let body = b"{}".to_vec();
    let sig = sign(SECRET, &body);
    let id = uuid::Uuid::new_v4().to_string();
    raw(&s, None, Some(&id), Some(&sig), body)
        .await
        .assert_error(400);
}
