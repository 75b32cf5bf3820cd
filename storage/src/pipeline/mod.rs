//! Capsules, configurations and deployment packages of a project (and rollout results);
//! `rollouts`: a deployment's rollout, robots' progress and reports, the project's policy.

pub mod records;

use std::sync::Arc;

use crate::lists::{Entry, ListId, Listed, Query};
use crate::{
    Capsule, Configuration, Deployment, DeploymentStatus, DeviceResult, Result, Store, Writes, keys,
};

pub mod rollouts;

fn config_list(project: u64) -> ListId {
    ListId::new("cf").id(project)
}
fn config_capsule_list(project: u64, capsule: u64) -> ListId {
    ListId::new("cfc").id(project).id(capsule)
}
fn config_env_list(project: u64, env: &str) -> ListId {
    ListId::new("cfe").id(project).str(env)
}

impl Listed for Configuration {
    fn entries(&self) -> Vec<Entry> {
        let (p, id) = (self.project_id, self.id);
        vec![
            Entry::at(config_list(p), id, id),
            Entry::at(config_capsule_list(p, self.capsule_id), id, id),
            Entry::at(config_env_list(p, &self.environment), id, id),
        ]
    }
}

fn deployment_list(project: u64, status: Option<DeploymentStatus>) -> ListId {
    match status {
        None => ListId::new("dp").id(project),
        Some(s) => ListId::new("dps").id(project).str(s.as_str()),
    }
}

impl Listed for Deployment {
    fn entries(&self) -> Vec<Entry> {
        let (p, id) = (self.project_id, self.id);
        vec![
            Entry::at(deployment_list(p, None), id, id),
            Entry::at(deployment_list(p, Some(self.status)), id, id),
        ]
    }
}

/// What a reservation of an organization's storage was counted under: a write that
/// reserves bytes carries it, and fails with [`QUOTA_RACED`] when another reservation of
/// the organization was written since (by any process), so two processes never both admit
/// bytes that fit only once. The loser counts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaMark {
    org: u64,
    epoch: u64,
}

/// The conflict of a reservation whose count another one's write overtook.
pub const QUOTA_RACED: &str =
    "another reservation of the organization's storage was written meanwhile";

impl Writes {
    /// Makes the write a reservation under `mark` (nothing for `None`).
    fn reserve(&mut self, mark: Option<QuotaMark>) {
        let Some(QuotaMark { org, epoch }) = mark else {
            return;
        };
        self.guard(keys::quota_epoch(org), QUOTA_RACED, move |v| {
            epoch_of(v) == epoch
        });
        self.put_id(keys::quota_epoch(org), epoch.saturating_add(1));
    }
}

fn epoch_of(v: Option<&[u8]>) -> u64 {
    v.and_then(|v| <[u8; 8]>::try_from(v).ok())
        .map_or(0, u64::from_be_bytes)
}

impl Store {
    /// The mark a reservation of `org`'s storage is counted under: read before the count.
    pub fn quota_mark(&self, org: u64) -> Result<QuotaMark> {
        let v = self.inner.records.get(keys::quota_epoch(org))?;
        Ok(QuotaMark {
            org,
            epoch: epoch_of(v.as_deref()),
        })
    }

    pub fn capsule(&self, project: u64, id: u64) -> Result<Option<Capsule>> {
        self.get(&keys::capsule(project, id))
    }

    /// The capsule of that name and version, if any.
    pub fn capsule_by_version(
        &self,
        project: u64,
        name: &str,
        version: &str,
    ) -> Result<Option<Capsule>> {
        match self.get_id(&keys::capsule_by_version(project, name, version))? {
            Some(id) => self.capsule(project, id),
            None => Ok(None),
        }
    }

    /// A project's capsules as stored now, newest first: for a count that decides against
    /// other processes' writes (the organization's quota). The cached list where this
    /// process is the store's only writer; read past the cache on a shared engine.
    pub fn stored_capsules(&self, project: u64) -> Result<Arc<Vec<Arc<Capsule>>>> {
        if !self.on_postgres() {
            return self.project_capsules(project);
        }
        let v: Vec<Capsule> = self.scan_rev(&keys::capsule_prefix(project))?;
        Ok(Arc::new(v.into_iter().map(Arc::new).collect()))
    }

    /// A project's capsules, newest first (cached; every capsule write updates the cached
    /// list in place rather than dropping it, so a burst of writes never rescans).
    pub fn project_capsules(&self, project: u64) -> Result<Arc<Vec<Arc<Capsule>>>> {
        let c = &self.inner.cache.capsules;
        if let Some(v) = c.get(&project) {
            return Ok(v);
        }
        let g = c.generation();
        let v: Vec<Capsule> = self.scan_rev(&keys::capsule_prefix(project))?;
        let v = Arc::new(v.into_iter().map(Arc::new).collect::<Vec<_>>());
        c.put(g, project, v.clone());
        Ok(v)
    }

    /// Applies a batch of capsule changes; then, when the project's list was cached, stores
    /// the updated list (changed records replaced or added, `deleted` removed).
    fn write_capsules(
        &self,
        project: u64,
        w: Writes,
        changed: &[&Capsule],
        deleted: Option<u64>,
    ) -> Result<()> {
        let c = &self.inner.cache.capsules;
        let before = c.get(&project);
        c.forget(&project);
        self.apply(w)?;
        c.forget(&project);
        if let Some(old) = before {
            let g = c.generation();
            let mut list: Vec<Arc<Capsule>> = old
                .iter()
                .filter(|x| Some(x.id) != deleted && !changed.iter().any(|ch| ch.id == x.id))
                .cloned()
                .collect();
            list.extend(changed.iter().map(|ch| Arc::new((*ch).clone())));
            list.sort_by_key(|c| std::cmp::Reverse(c.id));
            c.put(g, project, Arc::new(list));
        }
        Ok(())
    }

    /// Records that a capsule's confirm was answered 202 with `checksum`: its validation is
    /// owed, and is resumed at start-up until its verdict is written.
    pub fn put_pending_validation(&self, project: u64, id: u64, checksum: &str) -> Result<()> {
        self.inner
            .records
            .insert(keys::pending_validation(project, id), checksum.as_bytes())?;
        Ok(())
    }

    pub fn pending_validation(&self, project: u64, id: u64) -> Result<Option<String>> {
        Ok(self
            .inner
            .records
            .get(keys::pending_validation(project, id))?
            .map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// Every owed validation: (project, capsule, checksum).
    pub fn pending_validations(&self) -> Result<Vec<(u64, u64, String)>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::pending_validation_prefix())
        {
            let (k, v) = kv?;
            let n = k.len();
            let (Some(p), Some(id)) = (
                k.get(n.saturating_sub(17)..n.saturating_sub(9))
                    .and_then(|b| <[u8; 8]>::try_from(b).ok()),
                k.get(n.saturating_sub(8)..)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok()),
            ) else {
                continue;
            };
            out.push((
                u64::from_be_bytes(p),
                u64::from_be_bytes(id),
                String::from_utf8_lossy(&v).into_owned(),
            ));
        }
        Ok(out)
    }

    /// Writes capsules (one changed record and any whose `is_latest` moved) in one batch;
    /// a verdict also settles the validation owed for it.
    pub fn put_capsules(&self, capsules: &[&Capsule]) -> Result<()> {
        let Some(project) = capsules.first().map(|c| c.project_id) else {
            return Ok(());
        };
        let mut w = Writes::new();
        for c in capsules.iter().filter(|c| c.upload.confirmed) {
            w.delete(keys::pending_validation(c.project_id, c.id));
        }
        for c in capsules {
            w.put(keys::capsule(c.project_id, c.id), *c)?;
            w.claim_id(
                keys::capsule_by_version(c.project_id, &c.name, &c.version),
                c.id,
                "A capsule with this name and version already exists",
            );
        }
        self.write_capsules(project, w, capsules, None)
    }

    /// A new capsule and where its code came from, in one batch, reserving its bytes under
    /// `quota`.
    pub fn create_capsule(
        &self,
        c: &Capsule,
        source: Option<&crate::pipeline::rollouts::CapsuleSource>,
        quota: Option<QuotaMark>,
    ) -> Result<()> {
        let mut w = Writes::new();
        w.reserve(quota);
        w.put(keys::capsule(c.project_id, c.id), c)?;
        w.claim_id(
            keys::capsule_by_version(c.project_id, &c.name, &c.version),
            c.id,
            "A capsule with this name and version already exists",
        );
        if let Some(s) = source {
            w.put(keys::capsule_source(c.id), s)?;
        }
        self.write_capsules(c.project_id, w, &[c], None)
    }

    /// Deletes a capsule and rewrites the others of its name whose `is_latest` moved.
    pub fn delete_capsule(&self, c: &Capsule, others: &[&Capsule]) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::pending_validation(c.project_id, c.id));
        w.delete(keys::capsule(c.project_id, c.id));
        w.delete(keys::capsule_by_version(c.project_id, &c.name, &c.version));
        w.delete(keys::capsule_source(c.id));
        for o in others {
            w.put(keys::capsule(o.project_id, o.id), *o)?;
        }
        self.write_capsules(c.project_id, w, others, Some(c.id))
    }

    pub fn configuration(&self, project: u64, id: u64) -> Result<Option<Configuration>> {
        self.get(&keys::config(project, id))
    }

    pub fn configuration_by_version(
        &self,
        project: u64,
        name: &str,
        version: &str,
    ) -> Result<Option<Configuration>> {
        match self.get_id(&keys::config_by_version(project, name, version))? {
            Some(id) => self.configuration(project, id),
            None => Ok(None),
        }
    }

    /// A project's configurations, newest first.
    pub fn project_configurations(&self, project: u64) -> Result<Vec<Configuration>> {
        self.scan_rev(&keys::config_prefix(project))
    }

    /// A page of a project's configurations, newest first, and how many match.
    pub fn configurations_page(
        &self,
        project: u64,
        capsule: Option<u64>,
        environment: Option<&str>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<Configuration>, u64)> {
        let keep = |c: &Configuration| {
            capsule.is_none_or(|id| c.capsule_id == id)
                && environment.is_none_or(|e| c.environment == e)
        };
        let key = |id| keys::config(project, id);
        let mut candidates = Vec::new();
        if let Some(c) = capsule {
            candidates.push(config_capsule_list(project, c));
        }
        if let Some(e) = environment {
            candidates.push(config_env_list(project, e));
        }
        Query {
            unlisted: false,
            candidates,
            all: config_list(project),
            lo: 0,
            hi: None,
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    pub fn put_configuration(&self, c: &Configuration) -> Result<()> {
        self.write_configuration(c, None)
    }

    /// A new configuration, reserving its bytes under `quota`.
    pub fn create_configuration(&self, c: &Configuration, quota: Option<QuotaMark>) -> Result<()> {
        self.write_configuration(c, quota)
    }

    fn write_configuration(&self, c: &Configuration, quota: Option<QuotaMark>) -> Result<()> {
        let mut w = Writes::new();
        w.reserve(quota);
        w.put_listed(keys::config(c.project_id, c.id), c)?;
        w.claim_id(
            keys::config_by_version(c.project_id, &c.name, &c.version),
            c.id,
            "A configuration with this name and version already exists",
        );
        self.apply(w)
    }

    pub fn delete_configuration(&self, c: &Configuration) -> Result<()> {
        let mut w = Writes::new();
        w.delete_listed::<Configuration>(keys::config(c.project_id, c.id));
        w.delete(keys::config_by_version(c.project_id, &c.name, &c.version));
        self.apply(w)
    }

    pub fn deployment(&self, project: u64, id: u64) -> Result<Option<Deployment>> {
        self.get(&keys::deployment(project, id))
    }

    /// A project's deployment packages, newest first.
    pub fn project_deployments(&self, project: u64) -> Result<Vec<Deployment>> {
        self.scan_rev(&keys::deployment_prefix(project))
    }

    /// A page of a project's deployment packages, newest first, and how many match.
    pub fn deployments_page(
        &self,
        project: u64,
        status: Option<DeploymentStatus>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<Deployment>, u64)> {
        let keep = |_: &Deployment| true;
        let key = |id| keys::deployment(project, id);
        Query {
            unlisted: false,
            candidates: status
                .map(|s| deployment_list(project, Some(s)))
                .into_iter()
                .collect(),
            all: deployment_list(project, None),
            lo: 0,
            hi: None,
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    pub fn put_deployment(&self, d: &Deployment) -> Result<()> {
        let mut w = Writes::new();
        w.put_listed(keys::deployment(d.project_id, d.id), d)?;
        self.apply(w)
    }

    /// Deletes a deployment package and its rollout results.
    pub fn delete_deployment(&self, d: &Deployment) -> Result<()> {
        let mut w = Writes::new();
        w.delete_listed::<Deployment>(keys::deployment(d.project_id, d.id));
        for kv in self
            .inner
            .records
            .scan_prefix(keys::device_result_prefix(d.id))
        {
            let (k, v) = kv?;
            let r: DeviceResult = crate::codec::decode(&v)?;
            w.delete(keys::result_by_time(
                d.project_id,
                r.reported_at,
                r.deployment_id,
                r.device_id,
            ));
            w.0.remove(k);
        }
        for k in self.scan_keys(&keys::device_progress_prefix(d.id))? {
            w.0.remove(k);
        }
        for k in self.scan_keys(&keys::device_offer_prefix(d.id))? {
            w.0.remove(k);
        }
        w.delete(keys::rollout(d.id));
        self.apply(w)
    }

    /// The latest result each device reported for a deployment, by device id.
    pub fn device_results(&self, deployment: u64) -> Result<Vec<DeviceResult>> {
        let mut v: Vec<DeviceResult> = self.scan_rev(&keys::device_result_prefix(deployment))?;
        v.reverse();
        Ok(v)
    }

    pub fn device_result(&self, deployment: u64, device: u64) -> Result<Option<DeviceResult>> {
        self.get(&keys::device_result(deployment, device))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::on_each_engine;

    fn capsule(id: u64, version: &str) -> Capsule {
        Capsule {
            id,
            project_id: 1,
            name: "app".into(),
            version: version.into(),
            version_major: 1,
            version_minor: 0,
            version_patch: id,
            description: None,
            capsule_type: "SW".into(),
            file_size_bytes: 1_000,
            metadata_json: b"{}".to_vec(),
            dependencies: Vec::new(),
            is_latest: false,
            upload: crate::UploadState::pending(".tar".into(), 0),
            created_at: 0,
            updated_at: 0,
        }
    }

    /// A reservation counted under a mark another reservation has since moved is refused
    /// with `QUOTA_RACED` (nothing of it written); counted again under the new mark, it is
    /// written.
    fn a_reservation_counted_before_another_was_written_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let mark = store.quota_mark(9).unwrap();
        store
            .create_capsule(&capsule(1, "1.0.1"), None, Some(mark))
            .unwrap();
        let late = store.create_capsule(&capsule(2, "1.0.2"), None, Some(mark));
        assert!(
            matches!(&late, Err(crate::StorageError::Conflict(m)) if m == QUOTA_RACED),
            "{late:?}"
        );
        assert!(
            store.capsule(1, 2).unwrap().is_none(),
            "nothing of it was written"
        );
        let mark = store.quota_mark(9).unwrap();
        store
            .create_capsule(&capsule(2, "1.0.2"), None, Some(mark))
            .unwrap();
        assert_eq!(store.stored_capsules(1).unwrap().len(), 2);
    }
    on_each_engine!(a_reservation_counted_before_another_was_written_is_refused);
}
