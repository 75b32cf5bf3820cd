//! A batch of worked deliveries turned into runs (or holds, links, installations) in one
//! write, a delivery whose writes fail taken back alone.

use super::*;

impl DispatcherState {
    /// A run's fields for `d`; its id is taken when it is made (`finish`), so a delivery
    /// that makes none (a duplicate job) takes none.
    pub(super) fn new_run(&self, d: &Delivery, link: &RepoLink, key: String) -> TestRun {
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
    pub(super) fn holder(&self, run: &TestRun) -> Result<Option<TestRun>> {
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
    pub(super) fn make(
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
    pub(super) fn enqueue(
        &self,
        b: &mut WebhookBatch,
        mut d: Delivery,
        mut run: TestRun,
    ) -> Result<Wrote> {
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
    pub(super) fn injected_failure(&mut self) -> Result<()> {
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
    pub(super) fn injected_commit_failure(&mut self) -> fleetops_storage::Result<()> {
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
    pub(super) fn dispatch_one(&mut self, work: &Work) -> Result<()> {
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
    pub(super) fn dispatch_batch(&mut self, works: &[Arc<Work>]) -> Vec<Result<()>> {
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
    pub(super) fn commit_pending(
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
    pub(super) fn dispatch_into(&self, work: &Work, b: &mut WebhookBatch) -> Result<Wrote> {
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
}
