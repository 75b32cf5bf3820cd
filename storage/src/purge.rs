//! Deleting an organization: at once from every lookup, then its data in bounded steps.
//!
//! [`Store::begin_org_deletion`] is one atomic batch: the organization record, its slug and
//! every membership go (so no request reaches it again and the slug is free), its
//! installations are unbound, and a marker (`odel/{org}`) records that its data is still to
//! be purged. [`Store::purge_org_step`] then removes the data of one of its projects at a time,
//! family by family, at most a budget of records a step, each removal through the family's own
//! delete (so list indexes and counters stay exact), and the project record itself last; when
//! no project is left the marker goes. Every step is atomic and may be repeated, so a crash
//! anywhere leaves a purge that the next start resumes ([`Store::orgs_being_deleted`]).
//!
//! What a step removes from the blob store is returned to the caller (the files of the sessions
//! it removed, and the project whose record went last, whose blob folders go whole), which
//! deletes those blobs after the step is on disk (a blob whose record is gone is never read
//! again; a crash before it is deleted leaves an orphan the housekeeper's sweep collects).

use crate::{
    Alert, AlertRule, Capsule, Configuration, Deployment, Device, DeviceGroup, InstallationBinding,
    Integration, Organization, RepoLink, Result, Session, Store, TestRun, Writes, codec, keys,
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
    /// batch. Its installations are unbound (their links of its projects go with the purge).
    pub fn begin_org_deletion(&self, org: &Organization) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::org_deletion(org.id), org)?;
        w.delete(keys::org(org.id));
        w.delete(keys::org_by_slug(&org.slug));
        let members = self.org_members(org.id)?;
        for m in &members {
            w.delete(keys::member(org.id, m.user_id));
            w.delete(keys::user_org(m.user_id, org.id));
        }
        for kv in self
            .inner
            .records
            .scan_prefix(keys::installation_binding_prefix())
        {
            let (k, v) = kv?;
            let mut b: InstallationBinding = codec::decode(&v)?;
            if b.organization_id == Some(org.id) {
                b.organization_id = None;
                b.former.retain(|&o| o != org.id);
                w.put(k.to_vec(), &b)?;
            }
        }
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        for m in &members {
            self.inner.cache.members.forget(&(org.id, m.user_id));
        }
        self.apply(w)?;
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        for m in &members {
            self.inner.cache.members.forget(&(org.id, m.user_id));
        }
        Ok(())
    }

    /// Whether organization `org` is deleted and its data still being purged.
    pub fn org_being_deleted(&self, org: u64) -> Result<bool> {
        Ok(self.inner.records.contains_key(keys::org_deletion(org))?)
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

    /// Removes up to `budget` records of the first family of project `pid` that still has
    /// any; whether it found any (false: only the project record is left).
    fn purge_project_part(
        &self,
        org: u64,
        pid: u64,
        budget: usize,
        step: &mut PurgeStep,
    ) -> Result<bool> {
        // Sessions first: their log chunks are the bulk. A session's chunks go a budget at a
        // time (a long session of small batches has many), then the session with its files.
        let sessions: Vec<Session> = self.first_records(&keys::session_prefix(pid), budget)?;
        if !sessions.is_empty() {
            let mut left = budget;
            for s in &sessions {
                let chunks = self.purge_session_logs(s.id, left)?;
                step.removed += chunks;
                left = left.saturating_sub(chunks);
                if left == 0 {
                    break;
                }
                step.blobs.extend(self.delete_session(s)?);
                step.removed += 1;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
            return Ok(true);
        }
        let deployments: Vec<Deployment> =
            self.first_records(&keys::deployment_prefix(pid), budget)?;
        if !deployments.is_empty() {
            for d in &deployments {
                self.delete_deployment(d)?;
            }
            step.removed += deployments.len();
            return Ok(true);
        }
        let configs: Vec<Configuration> = self.first_records(&keys::config_prefix(pid), budget)?;
        if !configs.is_empty() {
            for c in &configs {
                self.delete_configuration(c)?;
                step.blobs.push(c.upload.blob_key.clone());
            }
            step.removed += configs.len();
            return Ok(true);
        }
        let capsules: Vec<Capsule> = self.first_records(&keys::capsule_prefix(pid), budget)?;
        if !capsules.is_empty() {
            for c in &capsules {
                self.delete_capsule(c, &[])?;
                step.blobs.push(c.upload.blob_key.clone());
            }
            step.removed += capsules.len();
            return Ok(true);
        }
        let alerts: Vec<Alert> = self.first_records(&keys::alert_prefix(pid), budget)?;
        if !alerts.is_empty() {
            let mut w = Writes::new();
            for a in &alerts {
                w.delete_listed::<Alert>(keys::alert(pid, a.id));
                for n in self.alert_notifications(a.id)? {
                    w.delete(keys::notification(a.id, n.id));
                    w.delete(keys::owed_notification(n.id));
                }
                if let Some(t) = a.resolved_at {
                    w.delete(keys::alert_expiry(t, pid, a.id));
                }
            }
            self.apply(w)?;
            step.removed += alerts.len();
            return Ok(true);
        }
        if self.delete_prefix(&keys::condition_prefix(pid), budget, step)? {
            return Ok(true);
        }
        let rules: Vec<AlertRule> = self.first_records(&keys::alert_rule_prefix(pid), budget)?;
        if !rules.is_empty() {
            for r in &rules {
                self.delete_alert_rule(r)?;
            }
            step.removed += rules.len();
            return Ok(true);
        }
        let integrations: Vec<Integration> =
            self.first_records(&keys::integration_prefix(pid), budget)?;
        if !integrations.is_empty() {
            for i in &integrations {
                self.delete_integration(i, &[])?;
            }
            step.removed += integrations.len();
            return Ok(true);
        }
        // Metric samples with their entries in the expiry index.
        let mut w = Writes::new();
        let mut n = 0;
        for k in self
            .inner
            .records
            .scan_prefix(keys::metric_sample_project_prefix(pid))
            .keys()
            .take(budget)
        {
            let k = k?;
            if let Some(x) = keys::metric_sample_expiry_of(&k) {
                w.delete(x);
            }
            w.delete(k.to_vec());
            n += 1;
        }
        if n > 0 {
            self.apply(w)?;
            step.removed += n;
            return Ok(true);
        }
        let devices: Vec<Device> = self.first_records(&keys::device_prefix(pid), budget)?;
        if !devices.is_empty() {
            for d in &devices {
                self.delete_device(d, &[])?;
            }
            step.removed += devices.len();
            return Ok(true);
        }
        let groups: Vec<DeviceGroup> = self.first_records(&keys::group_prefix(pid), budget)?;
        if !groups.is_empty() {
            for g in &groups {
                self.delete_group(g)?;
            }
            step.removed += groups.len();
            return Ok(true);
        }
        let repos: Vec<RepoLink> = self.first_records(&keys::repo_prefix(pid), budget)?;
        if !repos.is_empty() {
            let mut b = crate::scm::ScmBatch::default();
            for r in &repos {
                b.delete_repo(org, r);
            }
            b.commit(self)?;
            step.removed += repos.len();
            return Ok(true);
        }
        let runs: Vec<TestRun> = self.first_records(&keys::run_prefix(pid), budget)?;
        if !runs.is_empty() {
            let mut w = Writes::new();
            for r in &runs {
                delete_run(&mut w, r);
            }
            self.apply(w)?;
            step.removed += runs.len();
            return Ok(true);
        }
        Ok(false)
    }

    /// Removes up to `budget` of session `sid`'s log chunks with their summaries and text
    /// filters; how many keys went (fewer than `budget`: none is left).
    fn purge_session_logs(&self, sid: u64, budget: usize) -> Result<usize> {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for prefix in [
            keys::log_prefix(sid),
            keys::log_summary_prefix(sid),
            keys::log_text_filter_prefix(sid),
        ] {
            for k in self.inner.logs.scan_prefix(prefix).keys().take(budget - n) {
                batch.remove(k?);
                n += 1;
            }
            if n == budget {
                break;
            }
        }
        if n > 0 {
            self.inner.logs.apply_batch(batch)?;
        }
        Ok(n)
    }

    /// Removes up to `budget` keys under `prefix`; whether there were any.
    fn delete_prefix(&self, prefix: &[u8], budget: usize, step: &mut PurgeStep) -> Result<bool> {
        let mut w = Writes::new();
        let mut n = 0;
        for k in self.inner.records.scan_prefix(prefix).keys().take(budget) {
            w.delete(k?.to_vec());
            n += 1;
        }
        if n == 0 {
            return Ok(false);
        }
        self.apply(w)?;
        step.removed += n;
        Ok(true)
    }

    /// The project record and its indexes, once nothing of it is left.
    fn remove_project(&self, org: u64, pid: u64) -> Result<()> {
        let mut w = Writes::new();
        let project = self.project(pid)?;
        w.delete(keys::project(pid));
        w.delete(keys::org_project(org, pid));
        w.delete(keys::project_policy(pid));
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
