//! The ProjectActor's state changes for configurations: creation, upload, the verdict with
//! its inherited data, deletion.

use super::ProjectState;
use crate::clock::now_ms;
use crate::error::Error;
use crate::error::Result;
use crate::rules::blob_keys as keys;
use crate::rules::config_files as configs;
use crate::rules::configurations::MAX_DEPTH;
use crate::rules::configurations::effective_schema;
use crate::rules::configurations::lineage;
use crate::versions::Constraint;
use fleetops_storage::Configuration;
use fleetops_storage::ValidationStatus;
use fleetops_storage::accounts::Seq;
use serde_json::Map;
use serde_json::Value;

/// The effective configuration (inherited data included) is at most 4 MiB.
const MAX_EFFECTIVE_BYTES: usize = 4 * 1024 * 1024;

fn json(v: &Value) -> Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| Error::Internal(e.to_string()))
}

impl ProjectState {
    pub(super) fn configuration(&self, id: u64) -> Result<Configuration> {
        self.store
            .configuration(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Configuration"))
    }

    pub(super) fn create_configuration(
        &self,
        mut c: Configuration,
        quota: Option<fleetops_storage::pipeline::QuotaMark>,
    ) -> Result<Configuration> {
        if let Some(parent) = c.parent_config_id {
            // Another project's id is not found here: the same 422 as an unknown one.
            let Some(p) = self.store.configuration(self.pid(), parent)? else {
                return Err(Error::unprocessable(
                    "parent_config_id",
                    format!("configuration {parent} does not exist in this project"),
                ));
            };
            match lineage(&self.store, self.pid(), &p)? {
                Ok(chain) if chain.len() < MAX_DEPTH => {}
                Ok(_) => {
                    return Err(Error::unprocessable(
                        "parent_config_id",
                        format!("inheritance chains are at most {MAX_DEPTH} deep"),
                    ));
                }
                Err(why) => return Err(Error::unprocessable("parent_config_id", why)),
            }
        }
        if self.store.capsule(self.pid(), c.capsule_id)?.is_none() {
            return Err(Error::unprocessable(
                "capsule_id",
                format!("capsule {} does not exist in this project", c.capsule_id),
            ));
        }
        if self
            .store
            .configuration_by_version(self.pid(), &c.name, &c.version)?
            .is_some()
        {
            return Err(Error::Conflict(format!(
                "Configuration {} {} already exists",
                c.name, c.version
            )));
        }
        c.id = self.store.new_id(Seq::Configuration)?;
        c.project_id = self.pid();
        c.upload.blob_key = keys::upload(keys::CONFIGURATIONS, self.pid(), c.id);
        self.store.create_configuration(&c, quota)?;
        Ok(c)
    }

    /// Inherits from the parent, checks the schema and the capsule's version, and records
    /// the verdict. A parent still pending is 409 (confirm it first); a failed one fails this.
    pub(super) fn settle_configuration(
        &self,
        id: u64,
        checksum: String,
        size: u64,
        blob_key: Option<String>,
        parsed: std::result::Result<Map<String, Value>, String>,
        mut notes: Vec<String>,
    ) -> Result<Configuration> {
        let mut c = self.configuration(id)?;
        if c.upload.confirmed {
            return Err(Error::Conflict("Configuration already confirmed".into()));
        }
        let overrides = match parsed {
            Ok(m) => Value::Object(m),
            Err(why) => {
                notes.push(why);
                Value::Object(Map::new())
            }
        };
        let mut data = Value::Object(Map::new());
        let chain = match lineage(&self.store, self.pid(), &c)? {
            Ok(chain) => chain,
            Err(why) => {
                notes.push(why);
                vec![c.clone()]
            }
        };
        if let Some(parent) = chain.len().checked_sub(2).and_then(|i| chain.get(i)) {
            match parent.upload.validation_status {
                ValidationStatus::Passed => {
                    match serde_json::from_slice(&parent.config_data_json) {
                        Ok(v) => data = v,
                        Err(e) => notes.push(format!(
                            "parent configuration {} could not be read: {e}",
                            parent.id
                        )),
                    }
                }
                ValidationStatus::Failed => notes.push(format!(
                    "parent configuration {} ({} {}) failed validation",
                    parent.id, parent.name, parent.version
                )),
                ValidationStatus::Pending => {
                    return Err(Error::Conflict(format!(
                        "Parent configuration {} ({} {}) is not validated yet; confirm it first",
                        parent.id, parent.name, parent.version
                    )));
                }
            }
        }
        configs::merge(&mut data, &overrides);
        let data_json = json(&data)?;
        if data_json.len() > MAX_EFFECTIVE_BYTES {
            notes.push(format!(
                "the effective configuration is {} bytes; at most {MAX_EFFECTIVE_BYTES}",
                data_json.len()
            ));
            data = Value::Object(Map::new());
        }
        match self.store.capsule(self.pid(), c.capsule_id)? {
            None => notes.push(format!("capsule {} no longer exists", c.capsule_id)),
            Some(cap) => {
                let v =
                    semver::Version::new(cap.version_major, cap.version_minor, cap.version_patch);
                let fits = Constraint::parse(
                    "compatible_capsule_versions",
                    &c.compatible_capsule_versions,
                )
                .is_ok_and(|k| k.matches(&v));
                if !fits {
                    notes.push(format!(
                        "capsule {} {} does not match compatible_capsule_versions {}",
                        cap.name, cap.version, c.compatible_capsule_versions
                    ));
                }
            }
        }
        if let Some((from, schema)) = effective_schema(&chain) {
            match configs::violations(&schema, &data) {
                Ok(errs) if errs.is_empty() => {}
                Ok(errs) => notes.push(configs::schema_notes(&errs)),
                Err(e) => notes.push(format!(
                    "the validation_schema of configuration {} does not compile: {e}",
                    from.id
                )),
            }
        }
        let passed = notes.is_empty();
        c.upload.checksum_sha256 = Some(checksum);
        c.upload.uploaded_bytes = Some(size);
        if let Some(k) = blob_key {
            c.upload.blob_key = k;
        }
        c.override_fields_json = json(&overrides)?;
        c.config_data_json = json(&data)?;
        c.upload.validation_status = if passed {
            ValidationStatus::Passed
        } else {
            ValidationStatus::Failed
        };
        c.upload.validation_notes = if passed {
            "ok".into()
        } else {
            notes.join("; ")
        };
        c.upload.confirmed = true;
        c.updated_at = now_ms();
        self.store.put_configuration(&c)?;
        Ok(c)
    }

    /// Replies with the blob key to delete once durable.
    pub(super) fn delete_configuration(
        &self,
        id: u64,
        only_expired: bool,
    ) -> Result<Option<String>> {
        let c = self.configuration(id)?;
        if only_expired && (c.upload.confirmed || c.upload.upload_expires_at > now_ms()) {
            return Ok(None);
        }
        if let Some(d) = self
            .store
            .project_deployments(self.pid())?
            .into_iter()
            .find(|d| d.configuration_id == Some(id))
        {
            return Err(Error::Conflict(format!(
                "Configuration {} {} is used by deployment {} ({})",
                c.name, c.version, d.id, d.name
            )));
        }
        if let Some(child) = self
            .store
            .project_configurations(self.pid())?
            .into_iter()
            .find(|x| x.parent_config_id == Some(id))
        {
            return Err(Error::Conflict(format!(
                "Configuration {} {} is the parent of configuration {} ({} {})",
                c.name, c.version, child.id, child.name, child.version
            )));
        }
        self.store.delete_configuration(&c)?;
        Ok(Some(c.upload.blob_key))
    }
}
