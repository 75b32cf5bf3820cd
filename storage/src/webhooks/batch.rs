//! [`WebhookBatch`]: the family's one atomic write, so a delivery's outcome is written together
//! with its effect (an installation, a hold, a run, a link) and a crash replays it whole or
//! not at all.

use super::*;

/// Changes applied together by [`WebhookBatch::commit`].
pub struct WebhookBatch(Writes);

impl Default for WebhookBatch {
    fn default() -> Self {
        Self(Writes::new())
    }
}

impl WebhookBatch {
    /// Records a delivery's outcome: out of the queue (the list of queued deliveries), into
    /// its project's log.
    /// Decided by the store: the write fails with a conflict unless the delivery is still
    /// queued when it is applied, so a delivery is worked once however many workers read it.
    pub fn finish_delivery(&mut self, d: &Delivery) -> Result<()> {
        self.0.guard(
            keys::delivery(d.seq),
            "the delivery was already worked",
            |v| {
                v.and_then(|v| codec::decode::<Delivery>(v).ok())
                    .is_some_and(|d| d.outcome == DeliveryOutcome::Queued)
            },
        );
        self.0.put_listed(keys::delivery(d.seq), d)
    }

    pub fn put_installation(&mut self, i: &Installation) -> Result<()> {
        self.0.put(keys::installation(i.id), i)
    }

    pub fn put_binding(&mut self, installation: u64, b: &InstallationBinding) -> Result<()> {
        self.0.put(keys::installation_binding(installation), b)
    }

    pub fn put_hold(&mut self, full_name: &str, h: &RepoHold) -> Result<()> {
        self.0.put(keys::repo_hold(full_name), h)
    }

    /// Writes a run made now. Its id is new ([`Store::new_run`] takes it), so it has no
    /// index entries yet and none is removed: each removal is a tree descent in sled's
    /// batch, paid per delivery.
    ///
    /// Decided by the store: a run holding an idempotency key claims it, and the write fails
    /// with a conflict when a run of the same project holds the key by then (another
    /// project's entry is taken over, as when a repository moved between organizations).
    pub fn put_new_run(&mut self, r: &NewRun) -> Result<()> {
        if r.holds_key() {
            let pid = r.project_id.to_be_bytes();
            self.0.guard(
                keys::run_by_key(&r.idempotency_key),
                "the idempotency key is held by another run",
                move |v| v.is_none_or(|v| v.get(..8) != Some(&pid[..])),
            );
        }
        self.write_run(None, r)
    }

    /// Writes a new run that takes its idempotency key over from whatever run holds it (a
    /// rerequested check suite).
    pub fn put_rerun(&mut self, r: &NewRun) -> Result<()> {
        self.write_run(None, r)
    }

    /// Writes a changed run and keeps its indexes (queue, running, idempotency key, pull
    /// request) in step with its status. `old` is the run as its writer read it: the write
    /// fails with a conflict (decided by the store) when the run changed meanwhile, so two
    /// runners never claim one run and a lease's expiry never undoes a completion.
    pub fn put_run(&mut self, old: &TestRun, r: &TestRun) -> Result<()> {
        self.0.guard_record(
            keys::run(r.project_id, r.id),
            old,
            "the test run changed meanwhile",
        );
        self.write_run(Some(old), r)
    }

    fn write_run(&mut self, old: Option<&TestRun>, r: &TestRun) -> Result<()> {
        self.0.put_listed(keys::run(r.project_id, r.id), r)?;
        let pid = r.project_id.to_be_bytes().to_vec();
        let stored = old.is_some();
        if r.status == RunStatus::Queued {
            self.0
                .0
                .insert(keys::run_queue(r.project_id, r.id), Vec::new());
        } else if stored {
            self.0.delete(keys::run_queue(r.project_id, r.id));
        }
        if r.status == RunStatus::Running {
            self.0.0.insert(keys::running(r.id), pid.clone());
        } else if stored {
            self.0.delete(keys::running(r.id));
        }
        // The key index is set when a run is made (a rerequested check suite moves it to
        // the new run, so later changes of an older run must not move it back).
        if r.holds_key() {
            if old.is_none() {
                let mut v = pid.clone();
                v.extend_from_slice(&r.id.to_be_bytes());
                self.0.0.insert(keys::run_by_key(&r.idempotency_key), v);
            }
        } else if old.is_some_and(|o| o.holds_key()) {
            // Only while the index still points here: the commit migration's fold can hand
            // an in-flight run's key to a newer run (and a change that moves keys later must
            // not have a cancel take the newer run's entry).
            let mut v = pid.clone();
            v.extend_from_slice(&r.id.to_be_bytes());
            self.0.0.remove_if(keys::run_by_key(&r.idempotency_key), v);
        }
        if !r.commit_sha.is_empty() {
            self.0.0.insert(
                keys::commit_run(&r.repository, &r.commit_sha, r.id),
                pid.clone(),
            );
        }
        if let Some(n) = r.pull_request_number {
            if r.in_flight() {
                self.0.0.insert(keys::pr_run(&r.repository, n, r.id), pid);
            } else if stored {
                self.0.delete(keys::pr_run(&r.repository, n, r.id));
            }
        }
        Ok(())
    }

    /// Writes a link of a project of organization `org`, indexed by its name in `org`. The
    /// name is claimed inside the write: when another link holds it (another server linked
    /// it first), the commit fails with [`crate::StorageError::Conflict`]`(`[`REPO_NAME_TAKEN`]`)`.
    pub fn put_repo(&mut self, org: u64, r: &RepoLink) -> Result<()> {
        self.0.put(keys::repo(r.project_id, r.id), r)?;
        self.0.claim(
            keys::repo_by_name(org, &r.full_name),
            pair_bytes(r),
            REPO_NAME_TAKEN,
        );
        Ok(())
    }

    pub fn delete_repo(&mut self, org: u64, r: &RepoLink) {
        self.0.delete(keys::repo(r.project_id, r.id));
        self.0.delete(keys::repo_by_name(org, &r.full_name));
    }

    pub fn commit(self, store: &Store) -> Result<()> {
        store.apply(self.0)
    }

    /// Makes the whole batch fail with [`crate::StorageError::Conflict`]`("lease")` unless
    /// `fence`'s lease is still held as it was taken (the webhook worker's, several nodes).
    pub fn fence(&mut self, fence: &crate::leases::Fence) {
        self.0.fence(fence);
    }

    /// How far the batch has got, to take back one delivery's writes when it fails halfway.
    pub fn mark(&self) -> crate::WritesMark {
        self.0.mark()
    }

    /// Takes back every change made since `m`.
    pub fn rollback(&mut self, m: crate::WritesMark) {
        self.0.rollback(m);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
