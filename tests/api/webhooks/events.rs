//! Each host event the service handles: installations, repositories, pull requests, pushes,
//! check suites, workflow runs, and the delivery log's filters.

use serde_json::{Value, json};

use super::*;

each_backend!(a_repository_links_once_and_starts_pending);
async fn a_repository_links_once_and_starts_pending() {
    let s = webhook_server().await;
    let repo = link(&s, REPO).await;
    assert_eq!(repo["state"], "pending");
    assert_eq!(
        repo["branch_patterns"],
        json!(["main", "master", "release/*"])
    );
    assert_eq!(repo["include_drafts"], false);
    let rid = repo["id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "pending", "{}", r.body);
    assert_eq!(r.body["installation_id"], Value::Null);
    // A repository links to one project at most.
    s.post(
        &format!("{DEV}/repositories"),
        s.key(),
        json!({"full_name": REPO}),
    )
    .await
    .assert_error(409);
    s.post(
        &format!("{DEV}/repositories"),
        s.key(),
        json!({"full_name": "nope"}),
    )
    .await
    .assert_error(422);
}

each_backend!(installation_created_connects_its_repositories);
async fn installation_created_connects_its_repositories() {
    let s = webhook_server().await;
    let rid = link(&s, REPO).await["id"].as_u64().unwrap();
    let d = run(&s, "installation", &payload("installation.created")).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    assert_eq!(d["installation_id"], INST);
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(inst.body["items"][0]["id"], INST);
    assert_eq!(inst.body["items"][0]["state"], "active");
    assert_eq!(inst.body["items"][0]["account_login"], "Codertocat");
    assert_eq!(inst.body["items"][0]["repositories"], json!([REPO]));
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(
        (r.body["state"].clone(), r.body["installation_id"].clone()),
        (json!("connected"), json!(INST))
    );
    // Listed newest first, as every list is: one made later with a lower host id comes first.
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let mut later = payload("installation.created");
    later["installation"]["id"] = json!(1);
    later["repositories"] = json!([]);
    assert_eq!(
        run(&s, "installation", &later).await["outcome"],
        "processed"
    );
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    let ids: Vec<&Value> = inst.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["id"])
        .collect();
    assert_eq!(ids, vec![&json!(1), &json!(INST)]);
}

each_backend!(pull_requests_run_once_per_head_commit_with_draft_policy_and_cancel_on_close);
async fn pull_requests_run_once_per_head_commit_with_draft_policy_and_cancel_on_close() {
    let (s, rid) = installed().await;
    // pull_request opened: a run for the head commit.
    let sha1 = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    let d = run(&s, "pull_request", &pr("opened", 2, sha1, false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    assert_eq!(d["project"], "default");
    let run1 = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{run1}"), s.key()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["idempotency_key"], format!("{REPO}@{sha1}#pr2"));
    assert_eq!(r.body["status"], "queued");
    assert_eq!(r.body["attempt"], 1);
    assert_eq!(r.body["event"], "pull_request");
    assert_eq!(r.body["pull_request_number"], 2);
    assert_eq!(r.body["ref"], "changes");
    assert_eq!(r.body["commit_sha"], sha1);
    assert_eq!(r.body["delivery_id"], d["delivery_id"]);
    // Redelivered with a new id, and synchronize of the same commit: no second run.
    for action in ["opened", "synchronize"] {
        let d = run(&s, "pull_request", &pr(action, 2, sha1, false)).await;
        skipped(&d, "duplicate_job");
        assert_eq!(d["test_run_id"], run1);
    }
    // A new head commit runs.
    let sha2 = "1111111111111111111111111111111111111111";
    let d = run(&s, "pull_request", &pr("synchronize", 2, sha2, false)).await;
    assert_eq!(d["outcome"], "dispatched");
    let run2 = d["test_run_id"].as_u64().unwrap();

    // Drafts: excluded by default, included when the repository says so.
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            3,
            "3333333333333333333333333333333333333333",
            true,
        ),
    )
    .await;
    skipped(&d, "draft_excluded");
    let r = s
        .patch(
            &format!("{DEV}/repositories/{rid}"),
            s.key(),
            json!({"include_drafts": true}),
        )
        .await;
    assert_eq!(r.body["include_drafts"], true);
    let d = run(
        &s,
        "pull_request",
        &pr(
            "ready_for_review",
            3,
            "3333333333333333333333333333333333333333",
            true,
        ),
    )
    .await;
    assert_eq!(d["outcome"], "dispatched");
    s.patch(
        &format!("{DEV}/repositories/{rid}"),
        s.key(),
        json!({"include_drafts": false}),
    )
    .await;

    // A runner takes run1; closing the pull request cancels run1 and run2.
    let c = s
        .post(&format!("{DEV}/test-runs/claim"), s.key(), json!({}))
        .await;
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(c.body["id"], run1);
    assert_eq!(c.body["status"], "running");
    let mut closed = payload("pull_request.closed");
    closed["installation"]["id"] = json!(INST);
    let d = run(&s, "pull_request", &closed).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    for id in [run1, run2] {
        let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
        assert_eq!(r.body["status"], "cancelled", "{}", r.body);
    }
    // A cancelled run cannot complete; a reopened pull request runs again.
    let r = s
        .post(
            &format!("{DEV}/test-runs/{run1}/complete"),
            s.key(),
            json!({"status": "passed"}),
        )
        .await;
    r.assert_error(409);
    let d = run(&s, "pull_request", &pr("reopened", 2, sha2, false)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    assert_ne!(d["test_run_id"], run2);
    // An action the service does not handle.
    let d = run(&s, "pull_request", &pr("labeled", 2, sha2, false)).await;
    skipped(&d, "action_ignored");
}

each_backend!(pushes_follow_the_branch_patterns);
async fn pushes_follow_the_branch_patterns() {
    let (s, rid) = installed().await;
    // push: branch policy (main, master, release/*), tags, deletions.
    let d = run(&s, "push", &{
        let mut p = payload("push");
        p["installation"]["id"] = json!(INST);
        p
    })
    .await;
    skipped(&d, "branch_deleted");
    for (git_ref, want) in [
        ("refs/heads/main", None),
        ("refs/heads/release/1.0", None),
        ("refs/heads/release/1/2", Some("branch_not_matched")),
        ("refs/heads/feature", Some("branch_not_matched")),
        ("refs/tags/v1.0.0", Some("branch_not_matched")),
    ] {
        let d = run(
            &s,
            "push",
            &push(git_ref, "4444444444444444444444444444444444444444"),
        )
        .await;
        match want {
            None => {
                assert_eq!(d["outcome"], "dispatched", "{git_ref}: {d}");
                let id = d["test_run_id"].as_u64().unwrap();
                let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
                let branch = git_ref.trim_start_matches("refs/heads/");
                assert_eq!(
                    r.body["idempotency_key"],
                    format!("{REPO}@4444444444444444444444444444444444444444@{branch}")
                );
            }
            Some(reason) => skipped(&d, reason),
        }
    }
    // Patterns can be changed.
    s.patch(
        &format!("{DEV}/repositories/{rid}"),
        s.key(),
        json!({"branch_patterns": ["feat-*"]}),
    )
    .await;
    let d = run(
        &s,
        "push",
        &push(
            "refs/heads/feat-x",
            "5555555555555555555555555555555555555555",
        ),
    )
    .await;
    assert_eq!(d["outcome"], "dispatched");
    let d = run(
        &s,
        "push",
        &push(
            "refs/heads/main",
            "5555555555555555555555555555555555555555",
        ),
    )
    .await;
    skipped(&d, "branch_not_matched");
    s.patch(
        &format!("{DEV}/repositories/{rid}"),
        s.key(),
        json!({"branch_patterns": ["main", "master", "release/*"]}),
    )
    .await;
}

each_backend!(check_suite_rerequests_count_attempts_per_commit);
async fn check_suite_rerequests_count_attempts_per_commit() {
    let (s, _) = installed().await;
    // check_suite: requested keyed like a push; rerequested always runs again, attempt + 1.
    let d = run(&s, "check_suite", &payload("check_suite.requested")).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let cs1 = d["test_run_id"].as_u64().unwrap();
    let d = run(&s, "check_suite", &payload("check_suite.requested")).await;
    skipped(&d, "duplicate_job");
    let mut rr = payload("check_suite.rerequested");
    rr["check_suite"]["head_sha"] =
        payload("check_suite.requested")["check_suite"]["head_sha"].clone();
    rr["check_suite"]["head_branch"] = json!("master");
    let mut attempts = Vec::new();
    for _ in 0..2 {
        let d = run(&s, "check_suite", &rr).await;
        assert_eq!(d["outcome"], "dispatched");
        let id = d["test_run_id"].as_u64().unwrap();
        assert_ne!(id, cs1);
        let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
        attempts.push(r.body["attempt"].as_u64().unwrap());
    }
    assert_eq!(attempts, vec![2, 3]);
    // Runners taking (and so rewriting) the older runs do not move the key back.
    while s
        .post(&format!("{DEV}/test-runs/claim"), s.key(), json!({}))
        .await
        .status
        == 200
    {}
    let d = run(&s, "check_suite", &rr).await;
    let id = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
    assert_eq!(r.body["attempt"], 4);
    // A rerequest counts every run of the commit in the repository, whatever event made it:
    // a push ran 7777... once, so the suite's first rerequest is attempt 2.
    let sha7 = "7777777777777777777777777777777777777777";
    let d = run(&s, "push", &push("refs/heads/main", sha7)).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let mut rr7 = rr.clone();
    rr7["check_suite"]["head_sha"] = json!(sha7);
    rr7["check_suite"]["head_branch"] = json!("feature/seven");
    for want in [2, 3] {
        let d = run(&s, "check_suite", &rr7).await;
        let id = d["test_run_id"].as_u64().unwrap();
        let r = s.get(&format!("{DEV}/test-runs/{id}"), s.key()).await;
        assert_eq!(r.body["attempt"], want, "{}", r.body);
        assert_eq!(r.body["commit_sha"], sha7);
    }
}

each_backend!(workflow_run_completed_records_the_finished_run);
async fn workflow_run_completed_records_the_finished_run() {
    let (s, _) = installed().await;
    // workflow_run completed: the finished run recorded, resolved through its repository
    // (the payload names no installation).
    link(&s, "octo-org/octo-repo").await;
    let d = run(&s, "workflow_run", &payload("workflow_run.completed")).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let wr = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{wr}"), s.key()).await;
    assert_eq!(r.body["status"], "passed");
    assert_eq!(r.body["event"], "workflow_run");
    assert!(
        r.body["idempotency_key"]
            .as_str()
            .unwrap()
            .ends_with("#wr289782451.1")
    );
    assert_eq!(
        r.body["urls"]["artifacts_url"],
        "https://api.github.com/repos/octo-org/octo-repo/actions/runs/289782451/artifacts"
    );
    let d = run(&s, "workflow_run", &payload("workflow_run.completed")).await;
    skipped(&d, "duplicate_job");
    // A cancelled run holds no key; a repeat of its completion is a duplicate all the same.
    let mut cancelled = payload("workflow_run.completed");
    cancelled["workflow_run"]["id"] = json!(289782452);
    cancelled["workflow_run"]["conclusion"] = json!("cancelled");
    let d = run(&s, "workflow_run", &cancelled).await;
    assert_eq!(d["outcome"], "dispatched", "{d}");
    let first = d["test_run_id"].as_u64().unwrap();
    let r = s.get(&format!("{DEV}/test-runs/{first}"), s.key()).await;
    assert_eq!(r.body["status"], "cancelled");
    let d = run(&s, "workflow_run", &cancelled).await;
    skipped(&d, "duplicate_job");
    assert_eq!(d["test_run_id"], first);
}

each_backend!(a_repository_linked_to_no_project_is_skipped);
async fn a_repository_linked_to_no_project_is_skipped() {
    let (s, _) = installed().await;
    // A repository linked to no project.
    let mut p = push(
        "refs/heads/main",
        "6666666666666666666666666666666666666666",
    );
    p["repository"]["full_name"] = json!("someone/else");
    skipped(&run(&s, "push", &p).await, "repository_not_linked");
}

each_backend!(installation_repositories_removed_and_added_move_the_link);
async fn installation_repositories_removed_and_added_move_the_link() {
    let (s, rid) = installed().await;
    // installation_repositories removed / added.
    let mut removed = payload("installation_repositories.removed");
    removed["installation"]["id"] = json!(INST);
    removed["repositories_removed"][0]["full_name"] = json!(REPO);
    let d = run(&s, "installation_repositories", &removed).await;
    assert_eq!(d["outcome"], "processed", "{d}");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "disconnected");
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            7,
            "7777777777777777777777777777777777777777",
            false,
        ),
    )
    .await;
    skipped(&d, "repository_removed");
    let mut added = payload("installation_repositories.added");
    added["repositories_added"][0]["full_name"] = json!(REPO);
    let d = run(&s, "installation_repositories", &added).await;
    assert_eq!(d["outcome"], "processed");
    let r = s.get(&format!("{DEV}/repositories/{rid}"), s.key()).await;
    assert_eq!(r.body["state"], "connected");
}

each_backend!(suspended_and_deleted_installations_skip_their_events);
async fn suspended_and_deleted_installations_skip_their_events() {
    let (s, _) = installed().await;
    // suspend / unsuspend / deleted.
    let mut suspend = payload("installation.suspend");
    suspend["installation"]["id"] = json!(INST);
    assert_eq!(
        run(&s, "installation", &suspend).await["outcome"],
        "processed"
    );
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            8,
            "8888888888888888888888888888888888888888",
            false,
        ),
    )
    .await;
    skipped(&d, "installation_suspended");
    let mut unsuspend = suspend.clone();
    unsuspend["action"] = json!("unsuspend");
    assert_eq!(
        run(&s, "installation", &unsuspend).await["outcome"],
        "processed"
    );
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            8,
            "8888888888888888888888888888888888888888",
            false,
        ),
    )
    .await;
    assert_eq!(d["outcome"], "dispatched");
    let mut other = suspend.clone();
    other["action"] = json!("new_permissions_accepted");
    skipped(&run(&s, "installation", &other).await, "action_ignored");
    let mut deleted = payload("installation.deleted");
    deleted["installation"]["id"] = json!(INST);
    deleted["repositories"] = json!([{"full_name": REPO}]);
    assert_eq!(
        run(&s, "installation", &deleted).await["outcome"],
        "processed"
    );
    let inst = s.get(&format!("{SCM}/installations"), s.key()).await;
    assert_eq!(inst.body["items"][0]["state"], "deleted");
    let d = run(
        &s,
        "pull_request",
        &pr(
            "opened",
            9,
            "9999999999999999999999999999999999999999",
            false,
        ),
    )
    .await;
    skipped(&d, "installation_deleted");
}

each_backend!(the_delivery_log_filters_by_reason_and_outcome);
async fn the_delivery_log_filters_by_reason_and_outcome() {
    let (s, _) = installed().await;
    let sha1 = "ec26c3e57ca3a959ca5aad62de7213c562f8c821";
    assert_eq!(
        run(&s, "pull_request", &pr("opened", 2, sha1, false)).await["outcome"],
        "dispatched"
    );
    // Four duplicate jobs, then one other skip.
    for action in ["opened", "synchronize", "opened", "synchronize"] {
        skipped(
            &run(&s, "pull_request", &pr(action, 2, sha1, false)).await,
            "duplicate_job",
        );
    }
    skipped(
        &run(&s, "pull_request", &pr("labeled", 2, sha1, false)).await,
        "action_ignored",
    );
    // The project's delivery log: filters, and the single view with the payload.
    let l = s
        .get(
            &format!("{DEV}/webhook-deliveries?reason=duplicate_job"),
            s.key(),
        )
        .await;
    assert_eq!(l.status, 200);
    assert_eq!(l.body["total"], 4, "{}", l.body);
    let one = l.body["items"][0]["delivery_id"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s
        .get(&format!("{DEV}/webhook-deliveries/{one}"), s.key())
        .await;
    assert_eq!(d.status, 200);
    assert!(d.body["payload"].is_object());
    let l = s
        .get(
            &format!("{DEV}/webhook-deliveries?outcome=skipped&page_size=2"),
            s.key(),
        )
        .await;
    assert_eq!(l.body["items"].as_array().unwrap().len(), 2);
    s.get(&format!("{DEV}/webhook-deliveries?outcome=nope"), s.key())
        .await
        .assert_error(422);
}
