//! Test runs: their lists, ids, the queue and running index, and the one-off migrations of
//! runs stored by older versions.

use super::*;

/// A project's test runs: whole, by status, by repository (case-insensitive), by commit.
pub(super) fn run_list(project: u64) -> ListId {
    ListId::new("tr").id(project)
}
pub(super) fn run_status_list(project: u64, s: RunStatus) -> ListId {
    ListId::new("trs").id(project).str(s.as_str())
}
pub(super) fn run_repo_list(project: u64, repo: &str) -> ListId {
    ListId::new("trr")
        .id(project)
        .str(&repo.to_ascii_lowercase())
}
pub(super) fn run_commit_list(project: u64, sha: &str) -> ListId {
    ListId::new("trc").id(project).str(sha)
}

impl Listed for TestRun {
    fn entries(&self) -> Vec<Entry> {
        let (p, id) = (self.project_id, self.id);
        vec![
            Entry::at(run_list(p), id, id),
            Entry::at(run_status_list(p, self.status), id, id),
            Entry::at(run_repo_list(p, &self.repository), id, id),
            Entry::at(run_commit_list(p, &self.commit_sha), id, id),
        ]
    }
}

/// Which test runs a list shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunQuery<'a> {
    pub status: Option<RunStatus>,
    pub repository: Option<&'a str>,
    pub commit_sha: Option<&'a str>,
}

/// How many test-run ids [`Store::new_run`] takes from the counter at once.
pub const RUN_ID_BLOCK: u64 = 64;

/// A run about to be made: its id was just taken from the run counter, so nothing is stored
/// under it. Only [`Store::new_run`] makes one, and it cannot be changed afterwards, so
/// [`WebhookBatch::put_new_run`] may skip removing index entries it cannot have.
#[derive(Debug, Clone)]
pub struct NewRun(TestRun);

impl std::ops::Deref for NewRun {
    type Target = TestRun;
    fn deref(&self) -> &TestRun {
        &self.0
    }
}

impl Store {
    /// Makes `run` a new run: its id is the next from the run counter (whatever it held).
    ///
    /// Ids are taken from the counter [`RUN_ID_BLOCK`] at a time (a counter update is a
    /// sled write of its own, and the worker makes a run per delivery): within one open they
    /// rise by one; a restart leaves the rest of the block as a gap, as a failed write does.
    /// The counter is raised before any id of its block is written in a run, and sled keeps
    /// its writes in order, so no id is handed out twice across a crash.
    pub fn new_run(&self, mut run: TestRun) -> Result<NewRun> {
        let mut ids = self
            .inner
            .run_ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ids.is_empty() {
            let first = self.new_ids(Seq::TestRun, RUN_ID_BLOCK)?;
            *ids = first..first.saturating_add(RUN_ID_BLOCK);
        }
        run.id = ids.start;
        ids.start = ids.start.saturating_add(1);
        Ok(NewRun(run))
    }

    pub fn run(&self, project: u64, id: u64) -> Result<Option<TestRun>> {
        self.get(&keys::run(project, id))
    }

    pub fn run_by_key(&self, idempotency_key: &str) -> Result<Option<TestRun>> {
        let Some(v) = self.inner.records.get(keys::run_by_key(idempotency_key))? else {
            return Ok(None);
        };
        match pair(&v) {
            Some((p, id)) => self.run(p, id),
            None => Ok(None),
        }
    }

    /// A page of a project's runs, newest first, and how many the query shows.
    pub fn runs_page(
        &self,
        project: u64,
        q: RunQuery<'_>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<TestRun>, u64)> {
        let keep = |r: &TestRun| {
            q.status.is_none_or(|s| r.status == s)
                && q.repository
                    .is_none_or(|x| r.repository.eq_ignore_ascii_case(x))
                && q.commit_sha
                    .is_none_or(|x| r.commit_sha.eq_ignore_ascii_case(x))
        };
        let key = |id| keys::run(project, id);
        let mut candidates = Vec::new();
        if let Some(s) = q.status {
            candidates.push(run_status_list(project, s));
        }
        if let Some(r) = q.repository {
            candidates.push(run_repo_list(project, r));
        }
        if let Some(c) = q.commit_sha {
            candidates.push(run_commit_list(project, c));
        }
        Query {
            unlisted: false,
            candidates,
            all: run_list(project),
            lo: 0,
            hi: None,
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    /// The oldest queued run of a project. A queue entry whose run is no longer queued
    /// (read as another process's claim of it committed) is passed over.
    pub fn first_queued(&self, project: u64) -> Result<Option<TestRun>> {
        for kv in self
            .inner
            .records
            .scan_prefix(keys::run_queue_prefix(project))
            .take(64)
        {
            let (k, _) = kv?;
            if let Some(r) = keys::trailing_id(&k)
                .map(|id| self.run(project, id))
                .transpose()?
                .flatten()
                .filter(|r| r.status == RunStatus::Queued)
            {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Every running run, as (project, id).
    pub fn running_runs(&self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(keys::running_prefix()) {
            let (k, v) = kv?;
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) {
                out.push((p, id));
            }
        }
        Ok(out)
    }

    /// The highest `attempt` of any run of `project` of `sha` in `full_name`, whatever event
    /// made it.
    pub fn max_commit_attempt(
        &self,
        project: u64,
        full_name: &str,
        sha: &str,
    ) -> Result<Option<u32>> {
        let mut max = None;
        for kv in self
            .inner
            .records
            .scan_prefix(keys::commit_run_prefix(full_name, sha))
        {
            let (k, v) = kv?;
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) && p == project
                && let Some(r) = self.run(p, id)?
            {
                max = max.max(Some(r.attempt));
            }
        }
        Ok(max)
    }

    /// The runs of `sha` in `full_name` that belong to `project`, newest first, at most
    /// `limit` (the provenance of a capsule built from that commit).
    pub fn commit_runs(
        &self,
        project: u64,
        full_name: &str,
        sha: &str,
        limit: usize,
    ) -> Result<Vec<TestRun>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::commit_run_prefix(full_name, sha))
            .rev()
        {
            let (k, v) = kv?;
            if out.len() >= limit {
                break;
            }
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) && p == project
                && let Some(r) = self.run(p, id)?
            {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Builds the commit index of runs stored before it existed, once per data directory.
    pub fn backfill_commit_runs(&self) -> Result<()> {
        self.once("ix_commit_runs_v1", || {
            let mut batch = crate::engine::Batch::default();
            for kv in self.inner.records.scan_prefix(keys::all_runs_prefix()) {
                let (_, v) = kv?;
                let r: TestRun = codec::decode(&v)?;
                if !r.commit_sha.is_empty() {
                    batch.insert(
                        keys::commit_run(&r.repository, &r.commit_sha, r.id),
                        r.project_id.to_be_bytes().to_vec(),
                    );
                }
            }
            self.inner.records.apply_batch(batch)
        })
    }

    /// Lower-cases the commit of runs stored before commits were lower-cased at parse, once
    /// per data directory: the run, its commit list entry and its idempotency key (whose `@sha` part is the commit), so a redelivery of its event after
    /// the upgrade finds it, a rerequest counts its attempts, and a commit filter lists it.
    /// Where two runs' keys become one, the key index keeps the newer run (as a rerequest
    /// would); a run the index no longer pointed at stays unindexed.
    pub fn lowercase_run_commits(&self) -> Result<usize> {
        const DONE: &str = "runs_commit_lowercase_v1";
        if self.meta_get(DONE)?.is_some() {
            return Ok(0);
        }
        let mut changed = Vec::new();
        for kv in self.inner.records.scan_prefix(keys::all_runs_prefix()) {
            let (_, v) = kv?;
            let r: TestRun = codec::decode(&v)?;
            if r.commit_sha.bytes().any(|b| b.is_ascii_uppercase()) {
                changed.push(r);
            }
        }
        // The key index entries this pass writes, so runs folding into one key see each other.
        let mut slots: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        let mut w = Writes::new();
        for old in &changed {
            let mut r = old.clone();
            r.commit_sha = old.commit_sha.to_ascii_lowercase();
            r.idempotency_key = old.idempotency_key.replacen(
                &format!("@{}", old.commit_sha),
                &format!("@{}", r.commit_sha),
                1,
            );
            // The commit index (`keys::commit_run`) is case-blind already.
            w.put_listed(keys::run(r.project_id, r.id), &r)?;
            let held = self
                .inner
                .records
                .get(keys::run_by_key(&old.idempotency_key))?
                .and_then(|v| pair(&v))
                == Some((old.project_id, old.id));
            if held && r.idempotency_key != old.idempotency_key {
                w.delete(keys::run_by_key(&old.idempotency_key));
                let holder = match slots.get(&r.idempotency_key) {
                    Some(&id) => Some(id),
                    None => self
                        .inner
                        .records
                        .get(keys::run_by_key(&r.idempotency_key))?
                        .and_then(|v| pair(&v))
                        .map(|(_, id)| id),
                };
                if holder.is_none_or(|id| id < r.id) {
                    let mut v = r.project_id.to_be_bytes().to_vec();
                    v.extend_from_slice(&r.id.to_be_bytes());
                    w.0.insert(keys::run_by_key(&r.idempotency_key), v);
                    slots.insert(r.idempotency_key.clone(), r.id);
                }
            }
        }
        if !changed.is_empty() {
            self.apply(w)?;
            // On disk before the marker that says it was done (they are in different trees).
            self.flush_blocking()?;
        }
        self.meta_put(DONE, b"1")?;
        self.flush_blocking()?;
        Ok(changed.len())
    }

    /// The queued and running runs of `project` of a pull request.
    pub fn pr_runs_in_flight(
        &self,
        project: u64,
        full_name: &str,
        number: u64,
    ) -> Result<Vec<TestRun>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::pr_run_prefix(full_name, number))
        {
            let (k, v) = kv?;
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) && p == project
                && let Some(r) = self.run(p, id)?
            {
                out.push(r);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
