//! The dispatcher's run state machine driven through its mailbox, on a temporary store, with
//! no HTTP and no other actor: claim order, leases renewed and lapsed on a moved clock,
//! completion rules.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::clock::Clock;
use crate::mailbox::ask;

const PROJECT: u64 = 7;

/// A dispatcher over a fresh store holding `n` queued runs of one project, oldest first.
async fn with_queued(
    n: u64,
) -> (
    tempfile::TempDir,
    Store,
    Clock,
    ActorRef<Envelope<DispatcherMsg>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let clock = Clock::default();
    for i in 0..n {
        let run = TestRun {
            id: 0,
            project_id: PROJECT,
            repository: "acme/robot".into(),
            commit_sha: format!("{i:040}"),
            git_ref: "main".into(),
            event: "push".into(),
            pull_request_number: None,
            status: RunStatus::Queued,
            attempt: 1,
            idempotency_key: format!("k{i}"),
            delivery_id: None,
            summary: None,
            urls_json: b"{}".to_vec(),
            lease_expires_at: None,
            created_at: i as i64,
            updated_at: i as i64,
        };
        let mut b = WebhookBatch::default();
        b.put_new_run(&store.new_run(run).unwrap()).unwrap();
        b.commit(&store).unwrap();
    }
    let (a, _) = Actor::spawn(None, JobDispatcher, (store.clone(), 60, clock.clone()))
        .await
        .unwrap();
    (dir, store, clock, a)
}

#[tokio::test]
async fn claims_take_the_oldest_queued_run_once() {
    let (_dir, _store, _clock, a) = with_queued(2).await;
    let first = ask(&a, |reply| DispatcherMsg::Claim {
        project_id: PROJECT,
        reply,
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        (first.status, first.commit_sha.as_str()),
        (RunStatus::Running, "0".repeat(40).as_str())
    );
    assert!(first.lease_expires_at.is_some());
    let second = ask(&a, |reply| DispatcherMsg::Claim {
        project_id: PROJECT,
        reply,
    })
    .await
    .unwrap()
    .unwrap();
    assert_ne!(first.id, second.id);
    let none = ask(&a, |reply| DispatcherMsg::Claim {
        project_id: PROJECT,
        reply,
    })
    .await
    .unwrap();
    assert!(none.is_none());
    a.stop(None);
}

#[tokio::test]
async fn a_lapsed_lease_requeues_the_run_and_a_renewed_one_holds() {
    let (_dir, store, clock, a) = with_queued(2).await;
    let claim = || {
        ask(&a, |reply| DispatcherMsg::Claim {
            project_id: PROJECT,
            reply,
        })
    };
    let kept = claim().await.unwrap().unwrap();
    let lapsing = claim().await.unwrap().unwrap();
    clock.advance(std::time::Duration::from_secs(40));
    let renewed = ask(&a, |reply| DispatcherMsg::Heartbeat {
        project_id: PROJECT,
        id: kept.id,
        reply,
    })
    .await
    .unwrap();
    assert!(renewed.lease_expires_at > kept.lease_expires_at);
    // 70 s in: the lapsing run's lease (60 s) has passed, the renewed one's (100 s) not.
    clock.advance(std::time::Duration::from_secs(30));
    a.cast(Envelope::cast(DispatcherMsg::ExpireLeases)).unwrap();
    // A call after the cast: the mailbox handles the expiry pass first.
    ask(&a, |reply| DispatcherMsg::Claim {
        project_id: 999,
        reply,
    })
    .await
    .unwrap();
    let after = |id| store.run(PROJECT, id).unwrap().unwrap();
    let r = after(lapsing.id);
    assert_eq!(
        (r.status, r.attempt, r.lease_expires_at),
        (RunStatus::Queued, 2, None)
    );
    let r = after(kept.id);
    assert_eq!(r.status, RunStatus::Running);
    // The requeued run is claimed again, as attempt 2.
    let again = claim().await.unwrap().unwrap();
    assert_eq!((again.id, again.attempt), (lapsing.id, 2));
    a.stop(None);
}

#[tokio::test]
async fn completion_takes_passed_or_failed_of_a_running_run_once() {
    let (_dir, _store, _clock, a) = with_queued(1).await;
    let r = ask(&a, |reply| DispatcherMsg::Claim {
        project_id: PROJECT,
        reply,
    })
    .await
    .unwrap()
    .unwrap();
    let complete = |status: &str| {
        let status = status.to_string();
        ask(&a, move |reply| DispatcherMsg::Complete {
            project_id: PROJECT,
            id: r.id,
            status,
            summary: Some("12 passed".into()),
            reply,
        })
    };
    assert!(matches!(complete("ok").await, Err(Error::Unprocessable(_))));
    let done = complete("passed").await.unwrap();
    assert_eq!(
        (done.status, done.lease_expires_at),
        (RunStatus::Passed, None)
    );
    assert!(matches!(complete("failed").await, Err(Error::Conflict(_))));
    let beat = ask(&a, |reply| DispatcherMsg::Heartbeat {
        project_id: PROJECT,
        id: r.id,
        reply,
    })
    .await;
    assert!(matches!(beat, Err(Error::Conflict(_))));
    a.stop(None);
}
