//! The ProjectActor's state changes for capsules: creation, upload, the verdict, which
//! version is latest, deletion, and what refers to one.

use super::ProjectState;
use crate::clock::now_ms;
use crate::error::Error;
use crate::error::Result;
use crate::rules::blob_keys::UploadKind;
use fleetops_storage::Capsule;
use fleetops_storage::ValidationStatus;
use fleetops_storage::accounts::Seq;

impl ProjectState {
    pub(super) fn capsule(&self, id: u64) -> Result<Capsule> {
        self.store
            .capsule(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Capsule"))
    }

    pub(super) fn create_capsule(
        &self,
        mut c: Capsule,
        source: Option<fleetops_storage::pipeline::rollouts::CapsuleSource>,
        quota: Option<fleetops_storage::pipeline::QuotaMark>,
    ) -> Result<Capsule> {
        if self
            .store
            .capsule_by_version(self.pid(), &c.name, &c.version)?
            .is_some()
        {
            return Err(Error::Conflict(format!(
                "Capsule {} {} already exists",
                c.name, c.version
            )));
        }
        c.id = self.store.new_id(Seq::Capsule)?;
        c.project_id = self.pid();
        c.upload.blob_key =
            crate::rules::blob_keys::upload(crate::rules::blob_keys::CAPSULES, self.pid(), c.id);
        self.store.create_capsule(&c, source.as_ref(), quota)?;
        Ok(c)
    }

    /// Records the size of stored bytes, for either kind; refused once confirmed (the bytes
    /// a verdict vouches for never change).
    pub(super) fn uploaded(&self, kind: UploadKind, id: u64, size: u64) -> Result<()> {
        let refuse = || {
            Err(Error::Conflict(format!(
                "{} already confirmed; its bytes are immutable",
                kind.noun()
            )))
        };
        let now = now_ms();
        match kind {
            UploadKind::Capsule => {
                let mut c = self.capsule(id)?;
                if c.upload.confirmed {
                    return refuse();
                }
                c.upload.uploaded_bytes = Some(size);
                c.updated_at = now;
                Ok(self.store.put_capsules(&[&c])?)
            }
            UploadKind::Configuration => {
                let mut c = self.configuration(id)?;
                if c.upload.confirmed {
                    return refuse();
                }
                c.upload.uploaded_bytes = Some(size);
                c.updated_at = now;
                Ok(self.store.put_configuration(&c)?)
            }
        }
    }

    /// The capsules of `name` whose `is_latest` must be rewritten (the highest passed version
    /// is latest), given the changed one or without the deleted one; the changed one is always
    /// among them.
    pub(super) fn relatest(
        &self,
        name: &str,
        changed: Option<&Capsule>,
        deleted: Option<u64>,
    ) -> Result<Vec<Capsule>> {
        let mut all: Vec<Capsule> = self
            .store
            .project_capsules(self.pid())?
            .iter()
            .filter(|c| c.name == name && Some(c.id) != deleted)
            .map(|c| match changed {
                Some(ch) if ch.id == c.id => ch.clone(),
                _ => (**c).clone(),
            })
            .collect();
        let best = all
            .iter()
            .filter(|c| c.upload.validation_status == ValidationStatus::Passed)
            .max_by_key(|c| (c.version_major, c.version_minor, c.version_patch))
            .map(|c| c.id);
        let mut moved = Vec::new();
        for c in all.iter_mut() {
            let latest = Some(c.id) == best;
            if c.is_latest != latest || changed.is_some_and(|ch| ch.id == c.id) {
                c.is_latest = latest;
                moved.push(c.clone());
            }
        }
        Ok(moved)
    }

    pub(super) fn settle_capsule(
        &self,
        id: u64,
        size: u64,
        checksum: String,
        passed: bool,
        notes: String,
        blob_key: Option<String>,
    ) -> Result<Capsule> {
        let mut c = self.capsule(id)?;
        if c.upload.confirmed {
            return Err(Error::Conflict("Capsule already confirmed".into()));
        }
        if let Some(k) = blob_key {
            c.upload.blob_key = k;
        }
        c.upload.checksum_sha256 = Some(checksum);
        c.upload.uploaded_bytes = Some(size);
        c.upload.validation_status = if passed {
            ValidationStatus::Passed
        } else {
            ValidationStatus::Failed
        };
        c.upload.validation_notes = if passed { "ok".into() } else { notes };
        c.upload.confirmed = true;
        c.updated_at = now_ms();
        let moved = self.relatest(&c.name, Some(&c), None)?;
        let refs: Vec<&Capsule> = moved.iter().collect();
        self.store.put_capsules(&refs)?;
        Ok(moved.into_iter().find(|m| m.id == id).unwrap_or(c))
    }

    pub(super) fn validation_pending(&self, id: u64, checksum: &str) -> Result<()> {
        let c = self.capsule(id)?;
        if c.upload.confirmed {
            return Err(Error::Conflict("Capsule already confirmed".into()));
        }
        Ok(self
            .store
            .put_pending_validation(self.pid(), id, checksum)?)
    }

    pub(super) fn delete_capsule(&self, id: u64, only_expired: bool) -> Result<Option<String>> {
        let c = self.capsule(id)?;
        // The housekeeper never takes a capsule whose confirm was answered 202: its
        // validation is owed and finishes (or resumes after a restart).
        if only_expired
            && (c.upload.confirmed
                || c.upload.upload_expires_at > now_ms()
                || self.store.pending_validation(self.pid(), id)?.is_some())
        {
            return Ok(None);
        }
        if let Some(why) = self.capsule_in_use(id)? {
            return Err(Error::Conflict(format!(
                "Capsule {} {} is in use: {why}",
                c.name, c.version
            )));
        }
        let v = semver::Version::new(c.version_major, c.version_minor, c.version_patch);
        for o in self.store.project_capsules(self.pid())?.iter() {
            if o.id == c.id {
                continue;
            }
            for (name, constraint) in &o.dependencies {
                if *name == c.name
                    && crate::versions::Constraint::parse("dependency", constraint)
                        .is_ok_and(|k| k.matches(&v))
                {
                    return Err(Error::Conflict(format!(
                        "Capsule {} {} is a dependency of {} {}",
                        c.name, c.version, o.name, o.version
                    )));
                }
            }
        }
        let moved = self.relatest(&c.name, None, Some(c.id))?;
        let refs: Vec<&Capsule> = moved.iter().collect();
        self.store.delete_capsule(&c, &refs)?;
        Ok(Some(c.upload.blob_key))
    }

    /// 409 while a configuration or deployment package refers to the capsule.
    pub(super) fn capsule_in_use(&self, id: u64) -> Result<Option<String>> {
        if let Some(cf) = self
            .store
            .project_configurations(self.pid())?
            .into_iter()
            .find(|x| x.capsule_id == id)
        {
            return Ok(Some(format!(
                "configuration {} ({} {}) is linked to it",
                cf.id, cf.name, cf.version
            )));
        }
        if let Some(d) = self
            .store
            .project_deployments(self.pid())?
            .into_iter()
            .find(|d| d.capsule_id == id)
        {
            return Ok(Some(format!("deployment {} ({}) uses it", d.id, d.name)));
        }
        Ok(None)
    }
}
