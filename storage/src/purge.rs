//! Deleting an organization: at once from every lookup, then its data in bounded steps.
//!
//! [`Store::begin_org_deletion`] is one atomic batch: the organization record, its slug and
//! every membership go (so no request reaches it again and the slug is free; an installation
//! bound to it reads as unbound from then on), and a marker (`odel/{org}`) records that its
//! data is still to be purged; its projects are retired ([`Store::project_retired`]), which
//! every writer checks. [`Store::purge_org_step`] then removes the data of one of its projects
//! at a time, family by family, at most a budget of records a step, and the project record
//! itself last; when no project is left the marker goes. A listed record goes through its
//! family's own delete (so list indexes and counters stay exact); what no list holds (log
//! chunks, files, device results and history, notifications, conditions, metric samples) is
//! removed raw, a budget at a time, before the record it belongs to. Each write of a step is
//! atomic and a step may be repeated from any point, so a crash anywhere leaves a purge that
//! the next start resumes ([`Store::orgs_being_deleted`]).
//!
//! What a step removes from the blob store is returned to the caller (the files of the sessions
//! it removed, the capsules' and configurations' blobs, and the project whose record went last,
//! whose blob folders go whole), which deletes those blobs after the step is on disk (a blob
//! whose record is gone is never read again; a crash before it is deleted leaves an orphan the
//! housekeeper's sweep collects).

use crate::{
    Alert, AlertRule, Artifact, Capsule, Configuration, Deployment, Device, DeviceGroup,
    DeviceResult, Integration, Organization, RepoLink, Result, Session, Store, TestRun, Writes,
    codec, gate, keys,
};

/// What one purge step did.
#[derive(Debug, Default)]
pub struct PurgeStep {
    /// Blob keys no record refers to any more, to delete from the blob store.
    pub blobs: Vec<String>,
    /// Records removed in this step.
    pub removed: usize,
    /// The project whose last record this step removed: its blob folders go too.
    pub project_removed: Option<u64>,
    /// Nothing of the organization is left (its marker is gone too).
    pub done: bool,
}

impl Store {
    /// Removes organization `org` from every lookup and marks its data for purging, in one
    /// batch. Installations bound to it read as unbound from then on (the binding records are
    /// their actors' to write; their links of its projects go with the purge).
    pub fn begin_org_deletion(&self, org: &Organization) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::org_deletion(org.id), org)?;
        w.delete(keys::org(org.id));
        w.delete(keys::quota_epoch(org.id));
        w.delete(keys::org_by_slug(&org.slug));
        let members = self.org_members(org.id)?;
        for m in &members {
            w.delete(keys::member(org.id, m.user_id));
            w.delete(keys::user_org(m.user_id, org.id));
        }
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        for m in &members {
            self.inner.cache.members.forget(&(org.id, m.user_id));
        }
        self.apply(w)?;
        self.retire_projects(org.id)?;
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        for m in &members {
            self.inner.cache.members.forget(&(org.id, m.user_id));
        }
        Ok(())
    }

    /// Whether project `pid` belongs to a deleted organization: nothing may be written into
    /// it any more (an in-memory check, cheap enough for every request).
    pub fn project_retired(&self, pid: u64) -> bool {
        self.inner.retired.contains(&pid)
    }

    fn retire_projects(&self, org: u64) -> Result<()> {
        for k in self.scan_keys(&keys::org_project_prefix(org))? {
            if let Some(pid) = keys::trailing_id(&k) {
                self.inner.retired.insert(pid);
            }
        }
        Ok(())
    }

    /// At open: the projects of every organization still being purged.
    pub(crate) fn load_retired(&self) -> Result<()> {
        for org in self.orgs_being_deleted()? {
            self.retire_projects(org)?;
        }
        Ok(())
    }

    /// Whether organization `org` is deleted and its data still being purged.
    pub fn org_being_deleted(&self, org: u64) -> Result<bool> {
        self.inner.records.contains_key(keys::org_deletion(org))
    }

    /// Organizations whose data is still being purged.
    pub fn orgs_being_deleted(&self) -> Result<Vec<u64>> {
        Ok(self
            .scan_keys(&keys::org_deletion_prefix())?
            .iter()
            .filter_map(|k| keys::trailing_id(k))
            .collect())
    }

    /// Removes at most about `budget` records of organization `org` (see the module's
    /// header); repeat until `done`.
    pub fn purge_org_step(&self, org: u64, budget: usize) -> Result<PurgeStep> {
        let budget = budget.max(1);
        let mut step = PurgeStep::default();
        let Some(pid) = self
            .scan_keys(&keys::org_project_prefix(org))?
            .first()
            .and_then(|k| keys::trailing_id(k))
        else {
            let mut w = Writes::new();
            w.delete(keys::org_deletion(org));
            self.apply(w)?;
            step.done = true;
            return Ok(step);
        };
        if !self.purge_project_part(org, pid, budget, &mut step)? {
            self.remove_project(org, pid)?;
            step.removed += 1;
            step.project_removed = Some(pid);
        }
        Ok(step)
    }

    /// The first `n` records under `prefix`.
    fn first_records<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &[u8],
        n: usize,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(prefix).take(n) {
            out.push(codec::decode(&kv?.1)?);
        }
        Ok(out)
    }

    /// Removes up to `budget` records of project `pid`, family by family; whether it found
    /// any (false: only the project record is left).
    ///
    /// The order matters: what acts on its own (owed notifications, alerts, rollouts, test
    /// runs, repository links) goes first, then the bulk (sessions with their logs and files).
    /// A record with an unbounded number of dependents (an alert's notifications, a
    /// deployment's device results, a session's log chunks and files, a device's history)
    /// has them removed a budget at a time before the record itself, so no step exceeds its
    /// budget however large one record grew.
    fn purge_project_part(
        &self,
        org: u64,
        pid: u64,
        budget: usize,
        step: &mut PurgeStep,
    ) -> Result<bool> {
        let mut b = Budget { left: budget };
        self.purge_alerts(pid, &mut b)?;
        if b.left > 0 {
            self.purge_raw(
                &self.inner.records,
                &keys::condition_prefix(pid),
                &mut b,
                none,
            )?;
        }
        if b.left > 0 {
            for r in self.first_records::<AlertRule>(&keys::alert_rule_prefix(pid), b.left)? {
                self.delete_alert_rule(&r)?;
                b.spend(1);
            }
        }
        if b.left > 0 {
            for i in self.first_records::<Integration>(&keys::integration_prefix(pid), b.left)? {
                self.delete_integration(&i, &[])?;
                b.spend(1);
            }
        }
        if b.left > 0 {
            self.purge_deployments(pid, &mut b)?;
        }
        if b.left > 0 {
            let runs: Vec<TestRun> = self.first_records(&keys::run_prefix(pid), b.left)?;
            if !runs.is_empty() {
                let mut w = Writes::new();
                for r in &runs {
                    delete_run(&mut w, r);
                }
                self.apply(w)?;
                b.spend(runs.len());
            }
        }
        if b.left > 0 {
            let repos: Vec<RepoLink> = self.first_records(&keys::repo_prefix(pid), b.left)?;
            if !repos.is_empty() {
                let mut batch = crate::webhooks::WebhookBatch::default();
                for r in &repos {
                    batch.delete_repo(org, r);
                }
                batch.commit(self)?;
                b.spend(repos.len());
            }
        }
        if b.left > 0 {
            self.purge_sessions(pid, &mut b, step)?;
        }
        if b.left > 0 {
            for c in self.first_records::<Configuration>(&keys::config_prefix(pid), b.left)? {
                self.delete_configuration(&c)?;
                step.blobs.push(c.upload.blob_key.clone());
                b.spend(1);
            }
        }
        if b.left > 0 {
            for c in self.first_records::<Capsule>(&keys::capsule_prefix(pid), b.left)? {
                self.delete_capsule(&c, &[])?;
                step.blobs.push(c.upload.blob_key.clone());
                b.spend(1);
            }
        }
        if b.left > 0 {
            // Metric samples with their entries in the expiry index.
            self.purge_raw(
                &self.inner.records,
                &keys::metric_sample_project_prefix(pid),
                &mut b,
                |k, _| Ok(keys::metric_sample_expiry_of(k)),
            )?;
        }
        if b.left > 0 {
            for t in self.enrollment_tokens(pid, b.left)? {
                self.delete_enrollment_token(&t)?;
                b.spend(1);
            }
        }
        if b.left > 0 {
            self.purge_devices(pid, &mut b)?;
        }
        if b.left > 0 {
            for g in self.first_records::<DeviceGroup>(&keys::group_prefix(pid), b.left)? {
                self.delete_group(&g)?;
                b.spend(1);
            }
        }
        step.removed += budget - b.left;
        Ok(b.left < budget)
    }

    /// Alerts, each after its notifications (and their owed entries).
    fn purge_alerts(&self, pid: u64, b: &mut Budget) -> Result<()> {
        let records = &self.inner.records;
        for a in self.first_records::<Alert>(&keys::alert_prefix(pid), b.left)? {
            self.purge_raw(records, &keys::notification_prefix(a.id), b, |k, _| {
                Ok(keys::trailing_id(k).map(keys::owed_notification))
            })?;
            if b.left == 0 {
                return Ok(());
            }
            let mut w = Writes::new();
            w.delete_listed::<Alert>(keys::alert(pid, a.id));
            if let Some(t) = a.resolved_at {
                w.delete(keys::alert_expiry(t, pid, a.id));
            }
            self.apply(w)?;
            b.spend(1);
            if b.left == 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Deployments, each after its device results (with their time index) and progress; the
    /// deployment's own removal takes its rollout.
    fn purge_deployments(&self, pid: u64, b: &mut Budget) -> Result<()> {
        let records = &self.inner.records;
        for d in self.first_records::<Deployment>(&keys::deployment_prefix(pid), b.left)? {
            self.purge_raw(records, &keys::device_result_prefix(d.id), b, |_, v| {
                let r: DeviceResult = codec::decode(v)?;
                Ok(Some(keys::result_by_time(
                    pid,
                    r.reported_at,
                    r.deployment_id,
                    r.device_id,
                )))
            })?;
            if b.left > 0 {
                self.purge_raw(records, &keys::device_progress_prefix(d.id), b, none)?;
            }
            if b.left > 0 {
                self.purge_raw(records, &keys::device_offer_prefix(d.id), b, none)?;
            }
            if b.left == 0 {
                return Ok(());
            }
            self.delete_deployment(&d)?;
            b.spend(1);
            if b.left == 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Sessions, each after its log chunks (with summaries and text filters) and its files
    /// (whose blobs the step returns).
    fn purge_sessions(&self, pid: u64, b: &mut Budget, step: &mut PurgeStep) -> Result<()> {
        for s in self.first_records::<Session>(&keys::session_prefix(pid), b.left)? {
            for prefix in [
                keys::log_prefix(s.id),
                keys::log_summary_prefix(s.id),
                keys::log_text_filter_prefix(s.id),
            ] {
                self.purge_raw(&self.inner.logs, &prefix, b, none)?;
            }
            if b.left > 0 {
                self.purge_raw(
                    &self.inner.records,
                    &keys::artifact_prefix(s.id),
                    b,
                    |_, v| {
                        let a: Artifact = codec::decode(v)?;
                        step.blobs.push(a.blob_key);
                        Ok(None)
                    },
                )?;
            }
            if b.left == 0 {
                return Ok(());
            }
            step.blobs.extend(self.delete_session(&s)?);
            b.spend(1);
            if b.left == 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Devices, each after its history; the device's removal takes its token's entry.
    fn purge_devices(&self, pid: u64, b: &mut Budget) -> Result<()> {
        for d in self.first_records::<Device>(&keys::device_prefix(pid), b.left)? {
            self.purge_raw(
                &self.inner.records,
                &keys::device_history_prefix(d.id),
                b,
                none,
            )?;
            if b.left == 0 {
                return Ok(());
            }
            self.delete_device(&d, &[])?;
            b.spend(1);
            if b.left == 0 {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Removes up to what is left of the budget of `tree`'s keys under `prefix` (none of a
    /// listed family), each with the companion key `also` names from its key and value, in
    /// one batch.
    fn purge_raw(
        &self,
        tree: &gate::Tree,
        prefix: &[u8],
        b: &mut Budget,
        mut also: impl FnMut(&[u8], &[u8]) -> Result<Option<Vec<u8>>>,
    ) -> Result<()> {
        let mut batch = crate::engine::Batch::default();
        let mut n = 0;
        for kv in tree.scan_prefix(prefix).take(b.left) {
            let (k, v) = kv?;
            if let Some(x) = also(&k, &v)? {
                batch.remove(x);
            }
            batch.remove(k);
            n += 1;
        }
        if n > 0 {
            tree.apply_batch(batch)?;
            b.spend(n);
        }
        Ok(())
    }

    /// The project record and its indexes, once nothing of it is left.
    fn remove_project(&self, org: u64, pid: u64) -> Result<()> {
        let mut w = Writes::new();
        let project = self.project(pid)?;
        w.delete(keys::project(pid));
        w.delete(keys::org_project(org, pid));
        w.delete(keys::project_policy(pid));
        w.delete(keys::project_log_retention(pid));
        if let Some(p) = &project {
            w.delete(keys::project_by_slug(org, &p.slug));
            self.inner
                .cache
                .projects_by_slug
                .forget(&(org, p.slug.clone()));
        }
        self.inner.cache.capsules.forget(&pid);
        self.inner.cache.groups.forget(&pid);
        self.apply(w)?;
        if let Some(p) = &project {
            self.inner
                .cache
                .projects_by_slug
                .forget(&(org, p.slug.clone()));
        }
        Ok(())
    }

    /// Whether anything of project `pid` is left (its record, or a record of any family):
    /// what a purge's test checks after it.
    pub fn project_residue(&self, pid: u64) -> Result<Vec<&'static str>> {
        let mut left = Vec::new();
        for (name, prefix) in [
            ("project", keys::project(pid)),
            ("sessions", keys::session_prefix(pid)),
            ("devices", keys::device_prefix(pid)),
            ("enrollment tokens", keys::enrollment_prefix(pid)),
            ("groups", keys::group_prefix(pid)),
            ("capsules", keys::capsule_prefix(pid)),
            ("configurations", keys::config_prefix(pid)),
            ("deployments", keys::deployment_prefix(pid)),
            ("alerts", keys::alert_prefix(pid)),
            ("alert rules", keys::alert_rule_prefix(pid)),
            ("integrations", keys::integration_prefix(pid)),
            ("conditions", keys::condition_prefix(pid)),
            ("metric samples", keys::metric_sample_project_prefix(pid)),
            ("repositories", keys::repo_prefix(pid)),
            ("test runs", keys::run_prefix(pid)),
        ] {
            if self.inner.records.scan_prefix(&prefix).next().is_some() {
                left.push(name);
            }
        }
        Ok(left)
    }
}

impl Store {
    /// Every key of the records and logs trees (logs' prefixed `logs:`), for tests that
    /// check a purge left nothing behind: the keys after it, less those before, should be
    /// none of the purged organization's.
    #[doc(hidden)]
    pub fn key_snapshot(&self) -> Result<std::collections::BTreeSet<Vec<u8>>> {
        let mut out = std::collections::BTreeSet::new();
        for k in self.inner.records.scan_prefix(b"").keys() {
            out.insert(k?.to_vec());
        }
        for k in self.inner.logs.scan_prefix(b"").keys() {
            let mut v = b"logs:".to_vec();
            v.extend_from_slice(&k?);
            out.insert(v);
        }
        Ok(out)
    }
}

/// The family of a key from [`Store::key_snapshot`]: its tag, as `ix-email` or `logs:l`.
#[doc(hidden)]
pub fn key_family(k: &[u8]) -> String {
    let (tree, rest) = match k.strip_prefix(b"logs:") {
        Some(r) => ("logs:", r),
        None => ("", k),
    };
    let rest = rest.strip_prefix(keys::V).unwrap_or(rest);
    let tag = rest.split(|&b| b == b'/').next().unwrap_or_default();
    format!("{tree}{}", String::from_utf8_lossy(tag))
}

/// A run's removal with its indexes: the queue, running and pull-request entries, its commit
/// entry, and the idempotency key's entry while it points at this run.
fn delete_run(w: &mut Writes, r: &TestRun) {
    w.delete_listed::<TestRun>(keys::run(r.project_id, r.id));
    w.delete(keys::run_queue(r.project_id, r.id));
    w.delete(keys::running(r.id));
    if !r.commit_sha.is_empty() {
        w.delete(keys::commit_run(&r.repository, &r.commit_sha, r.id));
    }
    if let Some(n) = r.pull_request_number {
        w.delete(keys::pr_run(&r.repository, n, r.id));
    }
    let mut v = r.project_id.to_be_bytes().to_vec();
    v.extend_from_slice(&r.id.to_be_bytes());
    w.0.remove_if(keys::run_by_key(&r.idempotency_key), v);
}

/// No companion key (for [`Store::purge_raw`]).
fn none(_: &[u8], _: &[u8]) -> Result<Option<Vec<u8>>> {
    Ok(None)
}

/// What is left of a step's budget of records.
struct Budget {
    left: usize,
}

impl Budget {
    fn spend(&mut self, n: usize) {
        self.left = self.left.saturating_sub(n);
    }
}
