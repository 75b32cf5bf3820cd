//! The runners' side of a test run: claims of the oldest queued run, heartbeats that renew
//! its lease, completion, and lapsed leases requeued.

use super::*;

impl DispatcherState {
    pub(super) fn run(&self, project_id: u64, id: u64) -> Result<TestRun> {
        self.store
            .run(project_id, id)?
            .ok_or_else(|| Error::not_found("Test run"))
    }

    /// Writes `r` over `old`; `false` when the store found the run changed since `old` was
    /// read (another process wrote it): the caller decides again on what it holds now.
    pub(super) fn save(&self, old: &TestRun, r: &TestRun) -> Result<bool> {
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
    pub(super) fn decided<T>(&self, step: impl Fn() -> Result<Option<T>>) -> Result<T> {
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
    pub(super) fn claim(&self, project_id: u64) -> Result<Option<TestRun>> {
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

    pub(super) fn heartbeat(&self, project_id: u64, id: u64) -> Result<TestRun> {
        self.decided(|| self.try_heartbeat(project_id, id))
    }

    pub(super) fn try_heartbeat(&self, project_id: u64, id: u64) -> Result<Option<TestRun>> {
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

    pub(super) fn complete(
        &self,
        project_id: u64,
        id: u64,
        status: String,
        summary: Option<String>,
    ) -> Result<TestRun> {
        self.decided(|| self.try_complete(project_id, id, &status, summary.clone()))
    }

    pub(super) fn try_complete(
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
    pub(super) fn live(&self, project_id: u64) -> Result<()> {
        if self.store.project_retired(project_id) {
            return Err(crate::Error::not_found("Project"));
        }
        Ok(())
    }

    pub(super) fn expire_leases(&self) -> Result<()> {
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
