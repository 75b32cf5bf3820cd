//! Offboarding: purging a deleted organization's data in the background.
//!
//! Deleting an organization (the DirectoryActor's one batch, `Store::begin_org_deletion`)
//! takes it out of every lookup at once and retires its projects (`Store::project_retired`):
//! from then on every writer refuses them (the projects' and sessions' actors, the dispatcher,
//! upload and download links, device tokens), and the actors that run on timers for them (rule
//! evaluators, notifiers, rollout controllers) stop and are not started again. Writes already
//! let in finish or are dropped within the mailbox deadline, so the purge waits that long
//! (`grace`) and then removes the projects' data a bounded step at a time
//! (`Store::purge_org_step`), each step on disk before the blobs it freed are deleted. A purge
//! survives restarts: the start and every housekeeping pass resume the organizations still
//! marked, one task per organization.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use fleetops_storage::{BlobStore, Store};

/// Stops whatever runs on its own timers for a project (its evaluator, notifier and rollout
/// controllers).
pub(crate) type StopProject = Arc<dyn Fn(u64) + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Offboarding {
    pub store: Store,
    pub blobs: BlobStore,
    pub stop_project: StopProject,
    /// Organizations whose purge task runs now (one each).
    pub running: Arc<DashMap<u64, ()>>,
    /// Records removed per step (`[supervision] purge_records_per_step`).
    pub step: usize,
    /// The pause between steps (`[supervision] purge_pause_ms`).
    pub pause: Duration,
    /// How long a deletion waits before its purge starts: past the longest a call already
    /// queued for one of its actors can wait (`[supervision] call_timeout_ms`), and a second
    /// more, so that every write let in before the deletion is done or dropped by then.
    pub grace: Duration,
}

impl Offboarding {
    /// Starts purging `org` unless a task already does; `settle`: after the grace (a deletion
    /// just made, with writes that may still be in flight).
    pub(crate) fn start(&self, org: u64, settle: bool) {
        if self.running.insert(org, ()).is_some() {
            return;
        }
        if let Ok(projects) = self.store.org_projects(org) {
            for p in projects {
                (self.stop_project)(p.id);
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            // Off the running list however the task ends (a panic too), so that the next
            // housekeeping pass starts it again.
            let _running = Running(this.running.clone(), org);
            if settle {
                tokio::time::sleep(this.grace).await;
            }
            let r = this.purge(org).await;
            if let Err(e) = &r {
                tracing::warn!(org, error = %e, "purging a deleted organization stopped; the next housekeeping pass resumes it");
            }
        });
    }

    /// Resumes every purge still marked (at start and each housekeeping pass).
    pub(crate) fn resume(&self) -> crate::error::Result<()> {
        for org in self.store.orgs_being_deleted()? {
            self.start(org, false);
        }
        Ok(())
    }

    async fn purge(&self, org: u64) -> crate::error::Result<()> {
        let mut removed = 0usize;
        loop {
            let (store, step) = (self.store.clone(), self.step);
            let step = crate::off_thread(move || Ok(store.purge_org_step(org, step)?)).await?;
            // What the step removed is on disk before its blobs go.
            self.store.durable().await?;
            for key in &step.blobs {
                if let Err(e) = self.blobs.delete(key).await {
                    tracing::warn!(org, key, error = %e, "a purged blob was not deleted; the orphan sweep collects it");
                }
            }
            if let Some(pid) = step.project_removed {
                use crate::rules::blob_keys::{CAPSULES, CONFIGURATIONS, LOGS, project_folder};
                for kind in [CAPSULES, CONFIGURATIONS, LOGS] {
                    if let Err(e) = self.blobs.delete_prefix(&project_folder(kind, pid)).await {
                        tracing::warn!(org, pid, error = %e, "a purged project's blobs were not all deleted; the orphan sweep collects them");
                    }
                }
            }
            removed += step.removed;
            if step.done {
                tracing::info!(
                    org,
                    records = removed,
                    "a deleted organization's data is purged"
                );
                return Ok(());
            }
            // Other writers get the store between steps.
            tokio::time::sleep(self.pause).await;
        }
    }
}

/// Takes an organization off the running purges when dropped.
struct Running(Arc<DashMap<u64, ()>>, u64);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.remove(&self.1);
    }
}
