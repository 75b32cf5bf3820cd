//! JobDispatcher: the single writer of repository links, test runs and their idempotency
//! keys. It resolves a delivery's repository and project, applies the project's policy
//! (branch patterns, drafts), and dispatches, cancels, records or skips with a reason, writing
//! the delivery's outcome in the same batch as the effect. Runners claim, renew and complete
//! runs here too; an expired lease puts a run back in the queue with `attempt` + 1.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fleetops_storage::{
    Delivery, RepoLink, StorageError, Store, TestRun, accounts::Seq, webhooks,
    webhooks::WebhookBatch,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::RepoPatch;
use super::payload::{Payload, matches};
use super::work::{Work, delivery_org, skip, skip_into, still_queued};

use crate::error::{Error, Result};
use crate::mailbox::Envelope;
use fleetops_storage::{DeliveryOutcome, RunStatus};

type Reply<T> = RpcReplyPort<Result<T>>;

pub(crate) enum DispatcherMsg {
    Dispatch {
        work: Arc<Work>,
        reply: Reply<()>,
    },
    /// Several deliveries of one installation, dispatched in order up to the first failure
    /// (one message and one reply for the lot; each still writes its own outcome), answered
    /// one result each for those it dispatched.
    DispatchBatch {
        works: Vec<Arc<Work>>,
        reply: Reply<Vec<Result<()>>>,
    },
    /// Records a skip decided before a delivery reached an installation (unparsable payload).
    Skip {
        delivery: Box<Delivery>,
        reason: &'static str,
        /// The worker's lease (several nodes).
        fence: Option<fleetops_storage::leases::Fence>,
        reply: Reply<()>,
    },
    CreateRepo {
        project_id: u64,
        full_name: String,
        branch_patterns: Vec<String>,
        include_drafts: bool,
        reply: Reply<RepoLink>,
    },
    UpdateRepo {
        project_id: u64,
        id: u64,
        patch: RepoPatch,
        reply: Reply<RepoLink>,
    },
    DeleteRepo {
        project_id: u64,
        id: u64,
        reply: Reply<()>,
    },
    Claim {
        project_id: u64,
        reply: Reply<Option<TestRun>>,
    },
    Heartbeat {
        project_id: u64,
        id: u64,
        reply: Reply<TestRun>,
    },
    Complete {
        project_id: u64,
        id: u64,
        status: String,
        summary: Option<String>,
        reply: Reply<TestRun>,
    },
    /// Timer: requeue runs whose lease has expired.
    ExpireLeases,
    /// Fault injection: the dispatcher panics in its handler (supervision tests).
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Fault injection: the `n`th delivery dispatched from now on (counting from 1) fails
    /// once, as on a failing write, leaving it queued.
    #[cfg(feature = "fault-injection")]
    FailDispatch(u32, Arc<std::sync::atomic::AtomicBool>),
    /// Fault injection: the next shared batch of outcomes fails to commit, as on a failing
    /// disk, leaving its deliveries queued.
    #[cfg(feature = "fault-injection")]
    FailCommit(Arc<std::sync::atomic::AtomicBool>),
}

pub(crate) struct DispatcherActor;

pub(crate) struct DispatcherState {
    store: Store,
    lease_ms: i64,
    clock: crate::clock::Clock,
    /// Dispatches left before the injected failure, and the flag it sets (tests).
    #[cfg(feature = "fault-injection")]
    fail_in: Option<(u32, Arc<std::sync::atomic::AtomicBool>)>,
    /// The flag the next shared commit sets as it fails (tests).
    #[cfg(feature = "fault-injection")]
    fail_commit: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Actor for DispatcherActor {
    type Msg = Envelope<DispatcherMsg>;
    type State = DispatcherState;
    type Arguments = (Store, i64, crate::clock::Clock);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (store, lease_seconds, clock): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || {
            Envelope::cast(DispatcherMsg::ExpireLeases)
        });
        Ok(DispatcherState {
            store,
            lease_ms: lease_seconds.max(1) * 1000,
            clock,
            #[cfg(feature = "fault-injection")]
            fail_in: None,
            #[cfg(feature = "fault-injection")]
            fail_commit: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        match msg {
            #[cfg(feature = "fault-injection")]
            DispatcherMsg::Panic => panic!("injected fault in the dispatcher"),
            #[cfg(feature = "fault-injection")]
            DispatcherMsg::FailDispatch(n, fired) => st.fail_in = Some((n.max(1), fired)),
            #[cfg(feature = "fault-injection")]
            DispatcherMsg::FailCommit(fired) => st.fail_commit = Some(fired),
            DispatcherMsg::Dispatch { work, reply } => {
                let _ = reply.send(st.dispatch_one(&work));
            }
            DispatcherMsg::DispatchBatch { works, reply } => {
                let _ = reply.send(Ok(st.dispatch_batch(&works)));
            }
            DispatcherMsg::Skip {
                delivery,
                reason,
                fence,
                reply,
            } => {
                let r = match still_queued(&st.store, delivery.seq) {
                    Ok(true) => skip(&st.store, &delivery, reason, fence.as_ref()),
                    other => other.map(|_| ()),
                };
                let _ = reply.send(r);
            }
            DispatcherMsg::CreateRepo {
                project_id,
                full_name,
                branch_patterns,
                include_drafts,
                reply,
            } => {
                let _ = reply.send(st.live(project_id).and_then(|()| {
                    st.create_repo(project_id, full_name, branch_patterns, include_drafts)
                }));
            }
            DispatcherMsg::UpdateRepo {
                project_id,
                id,
                patch,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.update_repo(project_id, id, patch)),
                );
            }
            DispatcherMsg::DeleteRepo {
                project_id,
                id,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.delete_repo(project_id, id)),
                );
            }
            DispatcherMsg::Claim { project_id, reply } => {
                let _ = reply.send(st.live(project_id).and_then(|()| st.claim(project_id)));
            }
            DispatcherMsg::Heartbeat {
                project_id,
                id,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.heartbeat(project_id, id)),
                );
            }
            DispatcherMsg::Complete {
                project_id,
                id,
                status,
                summary,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.complete(project_id, id, status, summary)),
                );
            }
            DispatcherMsg::ExpireLeases => {
                if let Err(e) = st.expire_leases() {
                    tracing::warn!(error = %e, "lease expiry failed");
                }
            }
        }
        Ok(())
    }
}

/// How long a run's read-decide-write is tried again against other processes' writes.
const RACE_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether working a delivery wrote a run (made, cancelled): later deliveries of the same
/// commit or pull request must then read it committed.
type Wrote = bool;

/// What a delivery's run may be found by: its repository with its head commit, and with its
/// pull request number (both lower-cased, as the commit index is). Two deliveries with no tag
/// in common read and write disjoint runs: every run key and index names the commit or the
/// pull request. The commit is taken from the field its event's dispatch reads.
fn conflict_tags(w: &Work) -> Vec<String> {
    let p = &w.payload;
    let repo = p.repo_name().unwrap_or_default().to_ascii_lowercase();
    let pr = p.pull_request.as_ref();
    let sha = match w.delivery.event.as_str() {
        "pull_request" => pr
            .and_then(|x| x.head.as_ref())
            .and_then(|h| h.sha.as_deref()),
        "push" => p.after.as_deref(),
        "check_suite" => p.check_suite.as_ref().and_then(|c| c.head_sha.as_deref()),
        "workflow_run" => p.workflow_run.as_ref().and_then(|c| c.head_sha.as_deref()),
        _ => None,
    };
    let mut tags = Vec::with_capacity(2);
    if let Some(sha) = sha {
        tags.push(format!("{repo}@{}", sha.to_ascii_lowercase()));
    }
    if let Some(n) = p.number.or(pr.and_then(|x| x.number)) {
        tags.push(format!("{repo}#{n}"));
    }
    // With neither, its dispatch reads no run (it is skipped before any such read).
    tags
}

/// Branch patterns: 1-32 of them, each 1-255 bytes without whitespace.
pub(crate) fn check_patterns(p: &[String]) -> Result<()> {
    if p.is_empty() || p.len() > 32 {
        return Err(Error::unprocessable("branch_patterns", "1 to 32 patterns"));
    }
    for x in p {
        if x.is_empty() || x.chars().count() > 255 || x.chars().any(char::is_whitespace) {
            return Err(Error::unprocessable(
                "branch_patterns",
                "each pattern is 1-255 characters without whitespace",
            ));
        }
    }
    Ok(())
}

/// `owner/name` as the host spells repositories.
pub(crate) fn check_full_name(s: &str) -> Result<()> {
    let ok = s.len() <= 200
        && s.split_once('/').is_some_and(|(o, n)| {
            let part = |x: &str| {
                !x.is_empty()
                    && x.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            };
            part(o) && part(n)
        });
    if ok {
        Ok(())
    } else {
        Err(Error::unprocessable("full_name", "must be owner/name"))
    }
}

impl DispatcherState {
    /// A run's fields for `d`; its id is taken when it is made (`finish`), so a delivery
    /// that makes none (a duplicate job) takes none.
    fn new_run(&self, d: &Delivery, link: &RepoLink, key: String) -> TestRun {
        let now = self.clock.now_ms();
        TestRun {
            id: 0,
            project_id: link.project_id,
            repository: link.full_name.clone(),
            commit_sha: String::new(),
            git_ref: String::new(),
            event: d.event.clone(),
            pull_request_number: None,
            status: RunStatus::Queued,
            attempt: 1,
            idempotency_key: key,
            delivery_id: Some(d.delivery_id.clone()),
            summary: None,
            urls_json: b"{}".to_vec(),
            lease_expires_at: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// The run of `run`'s project that holds its idempotency key. The key's index entry
    /// names one run across projects: when it names another project's (the repository's
    /// installation was moved to another organization and back), this project's own holder
    /// is looked for among the commit's runs of this project, and the entry moves to the
    /// new run if there is none.
    fn holder(&self, run: &TestRun) -> Result<Option<TestRun>> {
        match self.store.run_by_key(&run.idempotency_key)? {
            Some(r) if r.project_id == run.project_id => Ok(Some(r)),
            None => Ok(None),
            Some(_) => Ok(self
                .store
                .commit_runs(run.project_id, &run.repository, &run.commit_sha, 100)?
                .into_iter()
                .find(|r| r.idempotency_key == run.idempotency_key && r.holds_key())),
        }
    }

    /// Makes `run` (taking its id) and adds it with the delivery's outcome to `b`.
    /// The run claims its idempotency key (the store fails the batch when a run of the
    /// project holds it by then: the delivery is worked again and finds that run), unless
    /// `moves_key`: a rerequest takes the key over.
    fn make(
        &self,
        b: &mut WebhookBatch,
        mut d: Delivery,
        outcome: DeliveryOutcome,
        run: TestRun,
        moves_key: bool,
    ) -> Result<Wrote> {
        let r = self.store.new_run(run)?;
        if moves_key {
            b.put_rerun(&r)?;
        } else {
            b.put_new_run(&r)?;
        }
        d.test_run_id = Some(r.id);
        d.outcome = outcome;
        b.finish_delivery(&d)?;
        Ok(true)
    }

    /// Queues a run under `key` unless a run already holds it (`duplicate_job`).
    fn enqueue(&self, b: &mut WebhookBatch, mut d: Delivery, mut run: TestRun) -> Result<Wrote> {
        if let Some(existing) = self.holder(&run)? {
            d.test_run_id = Some(existing.id);
            d.outcome = DeliveryOutcome::Skipped;
            d.reason = Some("duplicate_job".into());
            b.finish_delivery(&d)?;
            return Ok(false);
        }
        run.status = RunStatus::Queued;
        self.make(b, d, DeliveryOutcome::Dispatched, run, false)
    }

    /// Fails when a test injected a failure for this dispatch.
    fn injected_failure(&mut self) -> Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some((n, fired)) = self.fail_in.take() {
            if n <= 1 {
                fired.store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(Error::Internal("injected dispatch failure".into()));
            }
            self.fail_in = Some((n - 1, fired));
        }
        Ok(())
    }

    /// Fails when a test injected a failure for the next shared commit.
    fn injected_commit_failure(&mut self) -> fleetops_storage::Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some(fired) = self.fail_commit.take() {
            fired.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(fleetops_storage::StorageError::Io(std::io::Error::other(
                "injected commit failure",
            )));
        }
        Ok(())
    }

    /// Works one delivery and writes its outcome in a batch of its own.
    fn dispatch_one(&mut self, work: &Work) -> Result<()> {
        self.injected_failure()?;
        let mut b = work.batch();
        self.dispatch_into(work, &mut b)?;
        if b.is_empty() {
            return Ok(());
        }
        Ok(b.commit(&self.store)?)
    }

    /// Works deliveries in order into shared sled batches (a sled batch costs a write of
    /// its log buffer, so one per delivery was most of the worker's cost), up to the first
    /// failure: what follows it is not worked before it is (the caller works it again on
    /// its own). Before a delivery that may read a run an earlier one in the pending batch
    /// wrote (the same commit or pull request of the same repository), the pending batch is
    /// committed, so every read sees what came before it. A failed commit fails every
    /// delivery in it (they stay queued).
    fn dispatch_batch(&mut self, works: &[Arc<Work>]) -> Vec<Result<()>> {
        let mut done: Vec<Result<()>> = Vec::with_capacity(works.len());
        // Read together by one worker under one lease: one fence for them all.
        let fence = works.first().and_then(|w| w.fence.clone());
        let mut b = WebhookBatch::default();
        let mut pending = 0;
        let mut written: HashSet<String> = HashSet::new();
        for w in works {
            let tags = conflict_tags(w);
            if tags.iter().any(|t| written.contains(t)) {
                if !self.commit_pending(&mut b, &mut done, pending, fence.as_ref()) {
                    return done;
                }
                pending = 0;
                written.clear();
            }
            let mark = b.mark();
            // An injected failure comes after the delivery's writes, as a failing write
            // would, so they must be taken back.
            let r = self
                .dispatch_into(w, &mut b)
                .and_then(|wrote| self.injected_failure().map(|()| wrote));
            match r {
                Ok(wrote) => {
                    done.push(Ok(()));
                    pending += 1;
                    if wrote {
                        written.extend(tags);
                    }
                }
                Err(e) => {
                    // Its own writes are taken back; the ones before it are kept.
                    b.rollback(mark);
                    if self.commit_pending(&mut b, &mut done, pending, fence.as_ref()) {
                        done.push(Err(e));
                    }
                    return done;
                }
            }
        }
        self.commit_pending(&mut b, &mut done, pending, fence.as_ref());
        done
    }

    /// Commits `b`, which holds the last `pending` entries of `done`; on failure those become
    /// errors. Whether it was written.
    ///
    /// The first of them carries the storage error itself, so its kind is what a caller
    /// sees (a failing flush is `Unavailable`, anything else is not retried forever); the
    /// others say they shared its batch (the error is one value and cannot be copied).
    fn commit_pending(
        &mut self,
        b: &mut WebhookBatch,
        done: &mut [Result<()>],
        pending: usize,
        fence: Option<&fleetops_storage::leases::Fence>,
    ) -> bool {
        let mut batch = std::mem::take(b);
        if pending == 0 || batch.is_empty() {
            return true;
        }
        if let Some(f) = fence {
            batch.fence(f);
        }
        match self
            .injected_commit_failure()
            .and_then(|()| batch.commit(&self.store))
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, deliveries = pending, "a batch of delivery outcomes failed");
                let from = done.len().saturating_sub(pending);
                let shared = format!("the batch of outcomes it was written with failed: {e}");
                let first = Error::from(e);
                let same = |first: &Error| match first {
                    Error::Unavailable { retry_after_secs } => Error::Unavailable {
                        retry_after_secs: *retry_after_secs,
                    },
                    _ => Error::Internal(shared.clone()),
                };
                for r in done.iter_mut().skip(from + 1) {
                    *r = Err(same(&first));
                }
                if let Some(r) = done.get_mut(from) {
                    *r = Err(first);
                }
                false
            }
        }
    }

    /// Works one delivery, adding its outcome and effects to `b` (nothing when it is no longer
    /// queued); whether it wrote a run. Every read it makes is of committed state: the
    /// caller commits `b` first when an earlier delivery in it wrote a run this one may read
    /// (`conflict_tags`).
    fn dispatch_into(&self, work: &Work, b: &mut WebhookBatch) -> Result<Wrote> {
        if !still_queued(&self.store, work.delivery.seq)? {
            return Ok(false);
        }
        let p: &Payload = &work.payload;
        let mut d = work.delivery.clone();
        let Some(name) = p.repo_name() else {
            return skip_into(b, &d, "invalid_payload");
        };
        d.repository = Some(name.to_string());
        let Some(org) = delivery_org(&self.store, d.installation_id.unwrap_or(0))? else {
            // Named no installation, and none holds its repository: nothing links it in an
            // organization it can be resolved to (several exist).
            let reason = match d.installation_id {
                Some(_) => "installation_unbound",
                None => "repository_not_linked",
            };
            return skip_into(b, &d, reason);
        };
        let Some(link) = self
            .store
            .repo_by_name(org, name)?
            // A link of a deleted organization's project, not yet purged.
            .filter(|l| !self.store.project_retired(l.project_id))
        else {
            return skip_into(b, &d, "repository_not_linked");
        };
        d.project_id = Some(link.project_id);
        if self.store.repo_hold(name)?.is_some_and(|h| !h.current) {
            return skip_into(b, &d, "repository_removed");
        }
        let action = p.action.as_deref().unwrap_or("");
        let full = link.full_name.clone();
        match d.event.as_str() {
            "pull_request" => match action {
                "opened" | "synchronize" | "reopened" | "ready_for_review" => {
                    let pr = p.pull_request.as_ref();
                    let number = p.number.or(pr.and_then(|x| x.number));
                    let head = pr.and_then(|x| x.head.as_ref());
                    let (Some(n), Some(sha), Some(branch)) = (
                        number,
                        head.and_then(|h| h.sha.clone()),
                        head.and_then(|h| h.git_ref.clone()),
                    ) else {
                        return skip_into(b, &d, "invalid_payload");
                    };
                    if pr.and_then(|x| x.draft).unwrap_or(false) && !link.include_drafts {
                        return skip_into(b, &d, "draft_excluded");
                    }
                    let mut r = self.new_run(&d, &link, format!("{full}@{sha}#pr{n}"));
                    r.commit_sha = sha;
                    r.git_ref = branch;
                    r.pull_request_number = Some(n);
                    self.enqueue(b, d, r)
                }
                "closed" => {
                    let Some(n) = p.number.or(p.pull_request.as_ref().and_then(|x| x.number))
                    else {
                        return skip_into(b, &d, "invalid_payload");
                    };
                    let runs = self.store.pr_runs_in_flight(link.project_id, &full, n)?;
                    let now = self.clock.now_ms();
                    for old in &runs {
                        let mut r = old.clone();
                        r.status = RunStatus::Cancelled;
                        r.lease_expires_at = None;
                        r.updated_at = now;
                        b.put_run(old, &r)?;
                    }
                    d.test_run_id = runs.first().map(|r| r.id);
                    d.outcome = if runs.is_empty() {
                        DeliveryOutcome::Processed
                    } else {
                        DeliveryOutcome::Dispatched
                    };
                    b.finish_delivery(&d)?;
                    Ok(!runs.is_empty())
                }
                _ => skip_into(b, &d, "action_ignored"),
            },
            "push" => {
                if p.deleted.unwrap_or(false) {
                    return skip_into(b, &d, "branch_deleted");
                }
                let Some(git_ref) = p.git_ref.as_deref() else {
                    return skip_into(b, &d, "invalid_payload");
                };
                let Some(branch) = git_ref.strip_prefix("refs/heads/") else {
                    return skip_into(b, &d, "branch_not_matched");
                };
                if !link.branch_patterns.iter().any(|pt| matches(pt, branch)) {
                    return skip_into(b, &d, "branch_not_matched");
                }
                let Some(sha) = p.after.clone() else {
                    return skip_into(b, &d, "invalid_payload");
                };
                let mut r = self.new_run(&d, &link, format!("{full}@{sha}@{branch}"));
                r.commit_sha = sha;
                r.git_ref = branch.to_string();
                self.enqueue(b, d, r)
            }
            "check_suite" => {
                let cs = p.check_suite.as_ref();
                let Some(sha) = cs.and_then(|c| c.head_sha.clone()) else {
                    return skip_into(b, &d, "invalid_payload");
                };
                let branch = cs.and_then(|c| c.head_branch.clone()).unwrap_or_default();
                let key = format!("{full}@{sha}@{branch}");
                match action {
                    "requested" => {
                        if !link.branch_patterns.iter().any(|pt| matches(pt, &branch)) {
                            return skip_into(b, &d, "branch_not_matched");
                        }
                        let mut r = self.new_run(&d, &link, key);
                        r.commit_sha = sha;
                        r.git_ref = branch;
                        self.enqueue(b, d, r)
                    }
                    "rerequested" => {
                        // Always a new attempt of that commit, one more than any run of it
                        // in this repository (whatever event made them); the key moves to
                        // the new run.
                        let previous =
                            self.store
                                .max_commit_attempt(link.project_id, &full, &sha)?;
                        let mut r = self.new_run(&d, &link, key);
                        r.commit_sha = sha;
                        r.git_ref = branch;
                        r.attempt = previous.map_or(1, |a| a.saturating_add(1));
                        self.make(b, d, DeliveryOutcome::Dispatched, r, true)
                    }
                    _ => skip_into(b, &d, "action_ignored"),
                }
            }
            "workflow_run" => {
                if action != "completed" {
                    return skip_into(b, &d, "action_ignored");
                }
                let Some(w) = p.workflow_run.as_ref() else {
                    return skip_into(b, &d, "invalid_payload");
                };
                let (Some(id), Some(sha)) = (w.id, w.head_sha.clone()) else {
                    return skip_into(b, &d, "invalid_payload");
                };
                let attempt = w.run_attempt.unwrap_or(1);
                let mut r = self.new_run(&d, &link, format!("{full}@{sha}#wr{id}.{attempt}"));
                r.commit_sha = sha;
                r.git_ref = w.head_branch.clone().unwrap_or_default();
                r.attempt = u32::try_from(attempt).unwrap_or(u32::MAX);
                let conclusion = w.conclusion.clone().unwrap_or_default();
                r.summary = Some(format!("workflow run {id} concluded {conclusion}"));
                r.urls_json = serde_json::to_vec(&serde_json::json!({
                    "html_url": w.html_url, "logs_url": w.logs_url, "artifacts_url": w.artifacts_url,
                }))
                .map_err(|e| Error::Internal(e.to_string()))?;
                if let Some(existing) = self.holder(&r)? {
                    d.test_run_id = Some(existing.id);
                    return skip_into(b, &d, "duplicate_job");
                }
                r.status = match conclusion.as_str() {
                    "success" => RunStatus::Passed,
                    "cancelled" => RunStatus::Cancelled,
                    _ => RunStatus::Failed,
                };
                // A cancelled run holds no key (so it has no index entry): a repeat of its
                // completion is found among the commit's runs instead.
                if r.status == RunStatus::Cancelled
                    && let Some(existing) = self
                        .store
                        .commit_runs(link.project_id, &full, &r.commit_sha, 100)?
                        .into_iter()
                        .find(|x| x.idempotency_key == r.idempotency_key)
                {
                    d.test_run_id = Some(existing.id);
                    return skip_into(b, &d, "duplicate_job");
                }
                self.make(b, d, DeliveryOutcome::Dispatched, r, false)
            }
            _ => skip_into(b, &d, "event_ignored"),
        }
    }

    fn create_repo(
        &self,
        project_id: u64,
        full_name: String,
        branch_patterns: Vec<String>,
        include_drafts: bool,
    ) -> Result<RepoLink> {
        check_full_name(&full_name)?;
        check_patterns(&branch_patterns)?;
        let org = self.org_of(project_id)?;
        // One project per repository within an organization; other organizations' links
        // neither conflict nor show.
        let taken = |l: RepoLink| {
            Error::Conflict(if l.project_id == project_id {
                format!(
                    "Repository {} is already linked to this project",
                    l.full_name
                )
            } else {
                format!(
                    "Repository {} is already linked to another project",
                    l.full_name
                )
            })
        };
        if let Some(l) = self.store.repo_by_name(org, &full_name)? {
            return Err(taken(l));
        }
        let now = self.clock.now_ms();
        let r = RepoLink {
            id: self.store.new_id(Seq::Repository)?,
            project_id,
            full_name,
            branch_patterns,
            include_drafts,
            created_at: now,
            updated_at: now,
        };
        let mut b = WebhookBatch::default();
        b.put_repo(org, &r)?;
        match b.commit(&self.store) {
            Ok(()) => Ok(r),
            // Another server linked it since the read above.
            Err(StorageError::Conflict(w)) if w == webhooks::REPO_NAME_TAKEN => {
                match self.store.repo_by_name(org, &r.full_name)? {
                    Some(l) => Err(taken(l)),
                    None => Err(Error::Unavailable {
                        retry_after_secs: 1,
                    }),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The organization of `project_id`.
    fn org_of(&self, project_id: u64) -> Result<u64> {
        Ok(self
            .store
            .project(project_id)?
            .ok_or_else(|| Error::not_found("Project"))?
            .org_id)
    }

    fn repo(&self, project_id: u64, id: u64) -> Result<RepoLink> {
        self.store
            .repo(project_id, id)?
            .ok_or_else(|| Error::not_found("Repository"))
    }

    fn update_repo(&self, project_id: u64, id: u64, patch: RepoPatch) -> Result<RepoLink> {
        let mut r = self.repo(project_id, id)?;
        if let Some(p) = patch.branch_patterns {
            check_patterns(&p)?;
            r.branch_patterns = p;
        }
        if let Some(d) = patch.include_drafts {
            r.include_drafts = d;
        }
        r.updated_at = self.clock.now_ms();
        let mut b = WebhookBatch::default();
        b.put_repo(self.org_of(project_id)?, &r)?;
        b.commit(&self.store)?;
        Ok(r)
    }

    fn delete_repo(&self, project_id: u64, id: u64) -> Result<()> {
        let r = self.repo(project_id, id)?;
        let mut b = WebhookBatch::default();
        b.delete_repo(self.org_of(project_id)?, &r);
        Ok(b.commit(&self.store)?)
    }

    fn run(&self, project_id: u64, id: u64) -> Result<TestRun> {
        self.store
            .run(project_id, id)?
            .ok_or_else(|| Error::not_found("Test run"))
    }

    /// Writes `r` over `old`; `false` when the store found the run changed since `old` was
    /// read (another process wrote it): the caller decides again on what it holds now.
    fn save(&self, old: &TestRun, r: &TestRun) -> Result<bool> {
        let mut b = WebhookBatch::default();
        b.put_run(old, r)?;
        match b.commit(&self.store) {
            Ok(()) => Ok(true),
            Err(fleetops_storage::StorageError::Conflict(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Runs a read-decide-write of a run until its write finds the run as read. Each lost
    /// race means another process's write landed, so this ends; bounded in time all the
    /// same (503 past it).
    fn decided<T>(&self, step: impl Fn() -> Result<Option<T>>) -> Result<T> {
        let until = std::time::Instant::now() + RACE_FOR;
        loop {
            if let Some(t) = step()? {
                return Ok(t);
            }
            if std::time::Instant::now() >= until {
                return Err(Error::Unavailable {
                    retry_after_secs: 1,
                });
            }
        }
    }

    /// Takes the project's oldest queued run. Two runners (on two processes) never take
    /// the same run: the store decides the write, and the loser takes the next one.
    fn claim(&self, project_id: u64) -> Result<Option<TestRun>> {
        self.decided(|| {
            let Some(old) = self.store.first_queued(project_id)? else {
                return Ok(Some(None));
            };
            // The queue's entry was read before the run: another process may have taken
            // it in between (its entry then leaves the queue; read again).
            if old.status != RunStatus::Queued {
                return Ok(None);
            }
            let now = self.clock.now_ms();
            let mut r = old.clone();
            r.status = RunStatus::Running;
            r.lease_expires_at = Some(now + self.lease_ms);
            r.updated_at = now;
            Ok(self.save(&old, &r)?.then_some(Some(r)))
        })
    }

    fn heartbeat(&self, project_id: u64, id: u64) -> Result<TestRun> {
        self.decided(|| self.try_heartbeat(project_id, id))
    }

    fn try_heartbeat(&self, project_id: u64, id: u64) -> Result<Option<TestRun>> {
        let old = self.run(project_id, id)?;
        if old.status != RunStatus::Running {
            return Err(Error::Conflict(format!(
                "Test run is {}; only a running run holds a lease",
                old.status
            )));
        }
        let now = self.clock.now_ms();
        let mut r = old.clone();
        r.lease_expires_at = Some(now + self.lease_ms);
        r.updated_at = now;
        Ok(self.save(&old, &r)?.then_some(r))
    }

    fn complete(
        &self,
        project_id: u64,
        id: u64,
        status: String,
        summary: Option<String>,
    ) -> Result<TestRun> {
        self.decided(|| self.try_complete(project_id, id, &status, summary.clone()))
    }

    fn try_complete(
        &self,
        project_id: u64,
        id: u64,
        status: &str,
        summary: Option<String>,
    ) -> Result<Option<TestRun>> {
        let old = self.run(project_id, id)?;
        let status = match RunStatus::parse(status) {
            Some(s @ (RunStatus::Passed | RunStatus::Failed)) => s,
            _ => return Err(Error::unprocessable("status", "must be passed or failed")),
        };
        if summary.as_ref().is_some_and(|s| s.chars().count() > 10_000) {
            return Err(Error::unprocessable("summary", "at most 10,000 characters"));
        }
        if old.status != RunStatus::Running {
            return Err(Error::Conflict(format!(
                "Test run is {}; only a running run can be completed",
                old.status
            )));
        }
        let mut r = old.clone();
        r.status = status;
        r.summary = summary.or(r.summary);
        r.lease_expires_at = None;
        r.updated_at = self.clock.now_ms();
        Ok(self.save(&old, &r)?.then_some(r))
    }

    /// Refuses a project whose organization was deleted after the request got past its
    /// lookup (checked as the request is taken on, so nothing is written into it).
    fn live(&self, project_id: u64) -> Result<()> {
        if self.store.project_retired(project_id) {
            return Err(crate::Error::not_found("Project"));
        }
        Ok(())
    }

    fn expire_leases(&self) -> Result<()> {
        let now = self.clock.now_ms();
        for (p, id) in self.store.running_runs()? {
            if self.store.project_retired(p) {
                continue;
            }
            let Some(old) = self.store.run(p, id)? else {
                continue;
            };
            if old.lease_expires_at.is_some_and(|t| t <= now) {
                let mut r = old.clone();
                r.status = RunStatus::Queued;
                r.attempt = r.attempt.saturating_add(1);
                r.lease_expires_at = None;
                r.updated_at = now;
                // Lost to a heartbeat or a completion meanwhile: that write stands.
                self.save(&old, &r)?;
            }
        }
        Ok(())
    }
}

/// The dispatcher's run state machine driven through its mailbox, on a temporary store, with
/// no HTTP and no other actor: claim order, leases renewed and lapsed on a moved clock,
/// completion rules.
#[cfg(test)]
mod tests {
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
        let (a, _) = Actor::spawn(None, DispatcherActor, (store.clone(), 60, clock.clone()))
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
}
