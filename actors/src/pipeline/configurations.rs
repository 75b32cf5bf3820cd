//! Configurations: the upload flow (as for capsules, files at most 1 MiB), confirm (parse,
//! inherit, check schema and capsule compatibility in the project's actor), list, detail,
//! `explain`, delete.

use fleetops_storage::Configuration;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{PipelineHandle, UploadKind, capsule_name, keys, raw_json};
use crate::clock::{fmt_ms, now_ms};
use crate::error::{Error, Result};
use crate::project::PipelineMsg;
use crate::rules::config_files::{self as configs, MAX_CONFIG_BYTES, SchemaError};
pub use crate::rules::configurations::MAX_DEPTH;
pub(crate) use crate::rules::configurations::{effective_schema, lineage};
use crate::versions::{Constraint, parse_version};
use crate::views::{Page, PageReq};

/// What `configurations/upload-url` asks for (already parsed by the edge).
#[derive(Debug, Clone)]
pub struct ConfigRequest {
    pub name: String,
    pub capsule_id: u64,
    pub version: String,
    pub environment: String,
    pub compatible_capsule_versions: String,
    pub file_format: String,
    pub parent_config_id: Option<u64>,
    pub description: Option<String>,
    pub file_size_bytes: Option<u64>,
    pub validation_schema: Option<Box<RawValue>>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ConfigUploadUrl {
    pub config_id: u64,
    pub upload_url: String,
    pub expires_in: i64,
}

/// The full configuration record as returned.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ConfigurationView {
    pub id: u64,
    pub project_id: u64,
    pub capsule_id: u64,
    pub name: String,
    pub description: Option<String>,
    pub environment: String,
    pub version: String,
    pub compatible_capsule_versions: String,
    pub file_format: String,
    pub file_size_bytes: u64,
    pub checksum_sha256: Option<String>,
    pub parent_config_id: Option<u64>,
    pub override_fields: Box<RawValue>,
    pub config_data: Box<RawValue>,
    pub validation_status: fleetops_storage::ValidationStatus,
    pub validation_notes: String,
    pub validation_schema: Option<Box<RawValue>>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Configuration> for ConfigurationView {
    fn from(c: &Configuration) -> Self {
        Self {
            id: c.id,
            project_id: c.project_id,
            capsule_id: c.capsule_id,
            name: c.name.clone(),
            description: c.description.clone(),
            environment: c.environment.clone(),
            version: c.version.clone(),
            compatible_capsule_versions: c.compatible_capsule_versions.clone(),
            file_format: c.upload.file_format.clone(),
            file_size_bytes: c.upload.uploaded_bytes.or(c.declared_size).unwrap_or(0),
            checksum_sha256: c.upload.checksum_sha256.clone(),
            parent_config_id: c.parent_config_id,
            override_fields: raw_json(&c.override_fields_json, "{}"),
            config_data: raw_json(&c.config_data_json, "{}"),
            validation_status: c.upload.validation_status,
            validation_notes: c.upload.validation_notes.clone(),
            validation_schema: c.validation_schema_json.as_ref().map(|s| raw_json(s, "{}")),
            created_at: fmt_ms(c.created_at),
            updated_at: fmt_ms(c.updated_at),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ConfigurationDetail {
    #[serde(flatten)]
    pub configuration: ConfigurationView,
    pub download_url: String,
}

/// A configuration named in `explain`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ConfigRef {
    pub id: u64,
    pub name: String,
    pub version: String,
}

impl From<&Configuration> for ConfigRef {
    fn from(c: &Configuration) -> Self {
        Self {
            id: c.id,
            name: c.name.clone(),
            version: c.version.clone(),
        }
    }
}

/// One leaf of the effective configuration and who set it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Source {
    pub pointer: String,
    pub value: Value,
    pub set_by: ConfigRef,
}

/// `GET /configurations/{id}/explain`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Explain {
    pub id: u64,
    pub name: String,
    pub version: String,
    pub validation_status: fleetops_storage::ValidationStatus,
    /// The inheritance chain, root first, ending with this configuration.
    pub chain: Vec<ConfigRef>,
    pub config_data: Value,
    pub sources: Vec<Source>,
    /// The configuration whose `validation_schema` applies (own, else the nearest ancestor's).
    pub schema_from: Option<ConfigRef>,
    pub schema_errors: Vec<SchemaError>,
}

/// Filters of `GET /configurations`.
#[derive(Debug, Default, Clone)]
pub struct ConfigFilter {
    pub capsule_id: Option<u64>,
    pub environment: Option<String>,
}

pub(crate) fn environment(s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::unprocessable(
            "environment",
            "must be 1-64 characters of [A-Za-z0-9._-]",
        ))
    }
}

impl PipelineHandle {
    pub(super) fn configuration(&self, pid: u64, id: u64) -> Result<Configuration> {
        self.store
            .configuration(pid, id)?
            .ok_or_else(|| Error::not_found("Configuration"))
    }

    pub async fn config_upload_url(
        &self,
        org_id: u64,
        tier: &str,
        pid: u64,
        req: ConfigRequest,
    ) -> Result<ConfigUploadUrl> {
        if let Some(n) = req.file_size_bytes {
            if n > MAX_CONFIG_BYTES {
                return Err(Error::TooLarge(format!(
                    "Configuration files are at most {MAX_CONFIG_BYTES} bytes"
                )));
            }
            if n == 0 {
                return Err(Error::unprocessable(
                    "file_size_bytes",
                    "must be at least 1",
                ));
            }
        }
        capsule_name("name", &req.name)?;
        let v = parse_version("version", &req.version)?;
        environment(&req.environment)?;
        Constraint::parse(
            "compatible_capsule_versions",
            &req.compatible_capsule_versions,
        )?;
        if !configs::FORMATS.contains(&req.file_format.as_str()) {
            return Err(Error::unprocessable(
                "file_format",
                "must be .json, .yaml, .toml, .ini or .env",
            ));
        }
        if let Some(d) = &req.description
            && d.chars().count() > 2000
        {
            return Err(Error::unprocessable(
                "description",
                "at most 2000 characters",
            ));
        }
        let schema = match &req.validation_schema {
            None => None,
            Some(raw) if raw.get().trim() == "null" => None,
            Some(raw) => {
                let s: Value = serde_json::from_str(raw.get())
                    .map_err(|e| Error::unprocessable("validation_schema", e))?;
                configs::check_schema(&s)
                    .map_err(|e| Error::unprocessable("validation_schema", e))?;
                Some(raw.get().as_bytes().to_vec())
            }
        };
        if self.store.capsule(pid, req.capsule_id)?.is_none() {
            return Err(Error::unprocessable(
                "capsule_id",
                format!("capsule {} does not exist in this project", req.capsule_id),
            ));
        }
        let now = now_ms();
        let mut raced = 0;
        let c = loop {
            let turn = std::sync::Arc::new(
                self.reserve(
                    org_id,
                    tier,
                    req.file_size_bytes.unwrap_or(MAX_CONFIG_BYTES),
                )
                .await?,
            );
            let r = self
                .projects
                .write(pid, |reply| PipelineMsg::CreateConfiguration {
                    turn: turn.clone(),
                    config: Box::new(Configuration {
                        id: 0,
                        project_id: pid,
                        capsule_id: req.capsule_id,
                        name: req.name.clone(),
                        description: req.description.clone(),
                        environment: req.environment.clone(),
                        version: v.to_string(),
                        compatible_capsule_versions: req.compatible_capsule_versions.clone(),
                        declared_size: req.file_size_bytes,
                        parent_config_id: req.parent_config_id,
                        override_fields_json: b"{}".to_vec(),
                        config_data_json: b"{}".to_vec(),
                        validation_schema_json: schema.clone(),
                        upload: self.pending_upload(&req.file_format, now),
                        created_at: now,
                        updated_at: now,
                    }),
                    reply,
                })
                .await;
            if let Some(r) = super::reservation_written(r, &mut raced) {
                break r?;
            }
        };
        Ok(ConfigUploadUrl {
            config_id: c.id,
            upload_url: self
                .upload_link(UploadKind::Configuration, pid, c.id, &c.upload)
                .await?,
            expires_in: self.cfg.upload_ttl_seconds,
        })
    }

    /// Hashes and parses the stored file; the project's actor then inherits, checks and
    /// records the verdict. A checksum mismatch fails the configuration and answers 400.
    ///
    /// On S3 the presigned upload URL stays valid after confirm, so the bytes are sealed: the
    /// file is read once into memory, and those very bytes are hashed, parsed and written
    /// (from memory) to the content key of the configuration's sealed folder, which no URL
    /// targets; the record points there in the same write as the verdict and the upload key
    /// is deleted once that write is durable. A `PUT` to the upload key at any moment cannot
    /// change what was validated. On the local backend the bytes stay where they are (its
    /// upload link refuses a `PUT` once confirmed).
    pub async fn confirm_configuration(
        &self,
        pid: u64,
        id: u64,
        checksum: String,
    ) -> Result<ConfigurationView> {
        self.configuration(pid, id)?;
        let _busy = self.busy(UploadKind::Configuration, id)?;
        let c = self.configuration(pid, id)?;
        if c.upload.confirmed {
            return Err(Error::Conflict("Configuration already confirmed".into()));
        }
        let Some(size) = self
            .stored_size(&c.upload.blob_key, c.upload.uploaded_bytes)
            .await?
        else {
            return Err(Error::Conflict(
                "Nothing has been uploaded for this configuration".into(),
            ));
        };
        if size > MAX_CONFIG_BYTES {
            return Err(Error::TooLarge(format!(
                "Configuration files are at most {MAX_CONFIG_BYTES} bytes"
            )));
        }
        let bytes = bytes::Bytes::from(
            self.read_small(&c.upload.blob_key, MAX_CONFIG_BYTES)
                .await?,
        );
        // The size of the bytes read, which are the ones hashed, parsed and recorded.
        let size = bytes.len() as u64;
        let sha =
            hex::encode(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &bytes).as_ref());
        let mismatch = Self::checksum_mismatch(&sha, &checksum);
        let mut notes = Vec::new();
        if mismatch {
            notes.push("Checksum mismatch".to_string());
        }
        if let Some(d) = c.declared_size
            && d != size
        {
            notes.push(format!("size is {size} bytes, {d} were declared"));
        }
        let seal = self.blobs.presigns();
        let blob_key = if seal {
            let key = keys::content(keys::CONFIGURATIONS, pid, id, &sha);
            self.blobs.put(&key, bytes.clone()).await?;
            Some(key)
        } else {
            None
        };
        let format = c.upload.file_format.clone();
        let parsed = tokio::task::spawn_blocking(move || configs::parse(&format, &bytes))
            .await
            .map_err(|e| Error::Internal(e.to_string()));
        let settled = match parsed {
            Ok(parsed) => {
                self.projects
                    .write(pid, |reply| PipelineMsg::SettleConfiguration {
                        id,
                        checksum: sha.clone(),
                        size,
                        blob_key: blob_key.clone(),
                        parsed: parsed.clone(),
                        notes: notes.clone(),
                        reply,
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        if seal && settled.is_ok() {
            self.tidy_after_verdict(UploadKind::Configuration, pid, id)
                .await;
        }
        let settled = settled?;
        if mismatch {
            return Err(Error::BadRequest("Checksum mismatch".into()));
        }
        Ok(ConfigurationView::from(&settled))
    }

    pub async fn configurations(
        &self,
        pid: u64,
        f: &ConfigFilter,
        page: PageReq,
    ) -> Result<Page<ConfigurationView>> {
        let me = self.clone();
        let f = f.clone();
        crate::off_thread(move || me.configurations_now(pid, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn configurations_now(
        &self,
        pid: u64,
        f: &ConfigFilter,
        page: PageReq,
    ) -> Result<Page<ConfigurationView>> {
        let (configs, total) = self.store.configurations_page(
            pid,
            f.capsule_id,
            f.environment.as_deref(),
            page.skip(),
            page.page_size,
        )?;
        Ok(page.of(configs.iter().map(ConfigurationView::from).collect(), total))
    }

    pub async fn configuration_detail(&self, pid: u64, id: u64) -> Result<ConfigurationDetail> {
        let c = self.configuration(pid, id)?;
        let exp = now_ms() / 1000 + self.cfg.download_ttl_seconds;
        Ok(ConfigurationDetail {
            configuration: ConfigurationView::from(&c),
            download_url: self
                .download_link(UploadKind::Configuration, pid, id, &c.upload.blob_key, exp)
                .await?,
        })
    }

    pub fn explain(&self, pid: u64, id: u64) -> Result<Explain> {
        let c = self.configuration(pid, id)?;
        let chain = match lineage(&self.store, pid, &c)? {
            Ok(chain) => chain,
            Err(why) => return Err(Error::Conflict(why)),
        };
        let data: Value = serde_json::from_slice(&c.config_data_json).unwrap_or_default();
        let overrides: Vec<(ConfigRef, Value)> = chain
            .iter()
            .map(|x| {
                (
                    ConfigRef::from(x),
                    serde_json::from_slice(&x.override_fields_json).unwrap_or_default(),
                )
            })
            .collect();
        // Under deep merge the last configuration of the chain that has a value at a leaf's
        // pointer is the one that set it.
        let sources = configs::leaves(&data)
            .into_iter()
            .filter(|(p, _)| !p.is_empty())
            .filter_map(|(pointer, value)| {
                let by = overrides
                    .iter()
                    .rev()
                    .find(|(_, o)| o.pointer(&pointer).is_some())?;
                Some(Source {
                    pointer,
                    value,
                    set_by: by.0.clone(),
                })
            })
            .collect();
        let (schema_from, schema_errors) = match effective_schema(&chain) {
            Some((from, schema)) => (
                Some(ConfigRef::from(from)),
                configs::violations(&schema, &data).unwrap_or_else(|e| {
                    vec![SchemaError {
                        pointer: String::new(),
                        message: format!("the schema does not compile: {e}"),
                    }]
                }),
            ),
            None => (None, Vec::new()),
        };
        Ok(Explain {
            id: c.id,
            name: c.name.clone(),
            version: c.version.clone(),
            validation_status: c.upload.validation_status,
            chain: chain.iter().map(ConfigRef::from).collect(),
            config_data: data,
            sources,
            schema_from,
            schema_errors,
        })
    }

    pub async fn delete_configuration(&self, pid: u64, id: u64) -> Result<()> {
        self.remove(UploadKind::Configuration, pid, id, false)
            .await
            .map(|_| ())
    }
}
