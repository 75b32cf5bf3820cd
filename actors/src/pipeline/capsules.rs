//! Capsules: the upload flow (upload-url, the PUT, confirm), validation in the foreground or
//! the background, lists, details, downloads and deletion, and orphaned uploads collected.

use super::*;

/// What `upload-url` asks for (already parsed by the edge).
#[derive(Debug, Clone)]
pub struct CapsuleRequest {
    pub name: String,
    pub version: String,
    pub description: Option<String>,
    pub capsule_type: String,
    pub file_format: String,
    pub file_size_bytes: u64,
    pub metadata: Option<Box<RawValue>>,
    pub dependencies: Vec<(String, String)>,
    /// `(repository, commit_sha)` the capsule was built from.
    pub source: Option<(String, String)>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct UploadUrl {
    pub capsule_id: u64,
    pub upload_url: String,
    pub expires_in: i64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Dependency {
    pub name: String,
    pub version: String,
}

/// The full capsule record as returned.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CapsuleView {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    pub version: String,
    pub description: Option<String>,
    pub capsule_type: String,
    pub file_format: String,
    pub file_size_bytes: u64,
    pub checksum_sha256: Option<String>,
    pub metadata: Box<RawValue>,
    pub dependencies: Vec<Dependency>,
    pub is_latest: bool,
    pub version_major: u64,
    pub version_minor: u64,
    pub version_patch: u64,
    pub validation_status: fleetops_storage::ValidationStatus,
    pub validation_notes: String,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Capsule> for CapsuleView {
    fn from(c: &Capsule) -> Self {
        Self {
            id: c.id,
            project_id: c.project_id,
            name: c.name.clone(),
            version: c.version.clone(),
            description: c.description.clone(),
            capsule_type: c.capsule_type.clone(),
            file_format: c.upload.file_format.clone(),
            file_size_bytes: c.file_size_bytes,
            checksum_sha256: c.upload.checksum_sha256.clone(),
            metadata: raw_json(&c.metadata_json, "{}"),
            dependencies: c
                .dependencies
                .iter()
                .map(|(n, v)| Dependency {
                    name: n.clone(),
                    version: v.clone(),
                })
                .collect(),
            is_latest: c.is_latest,
            version_major: c.version_major,
            version_minor: c.version_minor,
            version_patch: c.version_patch,
            validation_status: c.upload.validation_status,
            validation_notes: c.upload.validation_notes.clone(),
            created_at: fmt_ms(c.created_at),
            updated_at: fmt_ms(c.updated_at),
        }
    }
}

/// `GET /capsules/{id}`: the record, every version of its name, a download link.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CapsuleDetail {
    #[serde(flatten)]
    pub capsule: CapsuleView,
    pub all_versions: Vec<String>,
    pub download_url: String,
    /// The commit it was built from, as declared at upload-url.
    pub source: Option<crate::provenance::SourceView>,
    /// That commit's test runs in this project, newest first.
    pub test_runs: Vec<crate::provenance::RunRef>,
}

/// An item of `GET /capsules`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CapsuleItem {
    pub id: u64,
    pub name: String,
    pub version: String,
    pub capsule_type: String,
    pub file_size_bytes: u64,
    pub is_latest: bool,
    pub validation_status: fleetops_storage::ValidationStatus,
    pub created_at: String,
}

/// Filters of `GET /capsules`.
#[derive(Debug, Default, Clone)]
pub struct CapsuleFilter {
    pub name: Option<String>,
    pub capsule_type: Option<String>,
    pub latest_only: bool,
}

/// A file behind a download link.
pub struct Download {
    pub filename: String,
    pub content_type: &'static str,
    pub size: u64,
    /// Where its bytes are.
    pub(super) source: DownloadSource,
}

/// A linked file's bytes: a blob, or bytes the service holds (a configuration's effective,
/// merged data).
pub(super) enum DownloadSource {
    Blob(String),
    Inline(bytes::Bytes),
}

/// The link kind of a configuration's effective data (what a device installs).
pub(crate) const EFFECTIVE_CONFIGURATION: &str = "effective-configuration";

pub(crate) use crate::views::raw_json;

/// The outcome of confirm: 200 with the record, or 202 while it validates in the background.
pub enum Confirmed {
    Done(CapsuleView),
    Pending(CapsuleView),
}

/// `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`.
pub fn capsule_name(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_alphanumeric() || (i > 0 && matches!(b, b'.' | b'_' | b'-')));
    if ok {
        Ok(())
    } else {
        Err(Error::unprocessable(
            field,
            "must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}",
        ))
    }
}
impl PipelineHandle {
    pub(super) fn base(&self) -> String {
        self.public_url
            .read()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(super) fn capsule(&self, pid: u64, id: u64) -> Result<Capsule> {
        self.store
            .capsule(pid, id)?
            .ok_or_else(|| Error::not_found("Capsule"))
    }

    /// The organization's turn to reserve `add` more bytes (413 when they would exceed its
    /// tier's storage limit). Held until the record that reserves them is written, so
    /// concurrent uploads to several projects of one organization are counted one at a time.
    pub(super) async fn reserve(
        &self,
        org_id: u64,
        tier: &str,
        add: u64,
    ) -> Result<crate::quota::Turn> {
        let limit = self.quotas.get(tier).copied().unwrap_or(0);
        self.quota.admit(org_id, limit, add).await
    }

    pub async fn upload_url(
        &self,
        org_id: u64,
        tier: &str,
        pid: u64,
        req: CapsuleRequest,
    ) -> Result<UploadUrl> {
        capsule_name("name", &req.name)?;
        let v = parse_version("version", &req.version)?;
        if req.file_size_bytes == 0 {
            return Err(Error::unprocessable(
                "file_size_bytes",
                "must be at least 1",
            ));
        }
        let metadata = match &req.metadata {
            Some(m) if m.get().trim_start().starts_with('{') => m.get().as_bytes().to_vec(),
            Some(m) if m.get().trim() == "null" => b"{}".to_vec(),
            None => b"{}".to_vec(),
            Some(_) => return Err(Error::unprocessable("metadata", "must be an object")),
        };
        for (i, (name, c)) in req.dependencies.iter().enumerate() {
            capsule_name(&format!("dependencies[{i}].name"), name)?;
            Constraint::parse(&format!("dependencies[{i}].version"), c)?;
        }
        if let Some(d) = &req.description
            && d.chars().count() > 2000
        {
            return Err(Error::unprocessable(
                "description",
                "at most 2000 characters",
            ));
        }
        let source = match &req.source {
            Some((repo, sha)) => Some(crate::provenance::checked_source(repo, sha)?),
            None => None,
        };
        let now = now_ms();
        let mut raced = 0;
        let c = loop {
            let turn = Arc::new(self.reserve(org_id, tier, req.file_size_bytes).await?);
            let r = self
                .projects
                .write(pid, |reply| PipelineMsg::CreateCapsule {
                    turn: turn.clone(),
                    source: source.clone(),
                    capsule: Box::new(Capsule {
                        id: 0,
                        project_id: pid,
                        name: req.name.clone(),
                        version: req.version.clone(),
                        version_major: v.major,
                        version_minor: v.minor,
                        version_patch: v.patch,
                        description: req.description.clone(),
                        capsule_type: req.capsule_type.clone(),
                        file_size_bytes: req.file_size_bytes,
                        metadata_json: metadata.clone(),
                        dependencies: req.dependencies.clone(),
                        is_latest: false,
                        upload: self.pending_upload(&req.file_format, now),
                        created_at: now,
                        updated_at: now,
                    }),
                    reply,
                })
                .await;
            if let Some(r) = reservation_written(r, &mut raced) {
                break r?;
            }
        };
        Ok(UploadUrl {
            capsule_id: c.id,
            upload_url: self
                .upload_link(UploadKind::Capsule, pid, c.id, &c.upload)
                .await?,
            expires_in: self.cfg.upload_ttl_seconds,
        })
    }

    pub async fn confirm(&self, pid: u64, id: u64, checksum: String) -> Result<Confirmed> {
        self.capsule(pid, id)?;
        let busy = self.busy(UploadKind::Capsule, id)?;
        let c = self.capsule(pid, id)?;
        if self
            .stored_size(&c.upload.blob_key, c.upload.uploaded_bytes)
            .await?
            .is_none()
        {
            return Err(Error::Conflict(
                "Nothing has been uploaded for this capsule".into(),
            ));
        }
        if c.upload.confirmed {
            return Err(Error::Conflict("Capsule already confirmed".into()));
        }
        if c.file_size_bytes > self.cfg.sync_validation_max_bytes {
            // Durable before the 202: a crash now resumes the validation at start-up.
            self.projects
                .write(pid, |reply| PipelineMsg::ValidationPending {
                    id,
                    checksum: checksum.clone(),
                    reply,
                })
                .await?;
            let mut pending = c.clone();
            self.validate_in_background(pid, id, checksum, busy);
            pending.upload.validation_status = ValidationStatus::Pending;
            return Ok(Confirmed::Pending(CapsuleView::from(&pending)));
        }
        let c = self.validate_and_settle(pid, id, checksum).await?;
        drop(busy);
        Ok(Confirmed::Done(CapsuleView::from(&c)))
    }

    /// Deletes capsule and configuration blobs whose record is gone (a crash between a
    /// record's deletion and its blobs'). A record exists before any of its blobs (their keys
    /// carry its id, and only its signed link writes them) and ids are never reused, so no
    /// grace period is needed. Returns how many went.
    pub async fn collect_orphans(&self) -> Result<usize> {
        use futures::StreamExt;
        let mut gone = 0;
        for kind in [keys::CAPSULES, keys::CONFIGURATIONS] {
            let mut listed = self.blobs.keys(kind);
            let mut last: Option<((u64, u64), bool)> = None;
            while let Some(key) = listed.next().await {
                let key = key?;
                let parts: Vec<&str> = key.split('/').collect();
                let ids = match parts.as_slice() {
                    [_, pid, id] | [_, pid, "sealed", id, ..] => {
                        match (pid.parse::<u64>(), id.parse::<u64>()) {
                            (Ok(p), Ok(i)) => (p, i),
                            _ => continue,
                        }
                    }
                    _ => continue,
                };
                let exists = match last {
                    Some((k, e)) if k == ids => e,
                    _ => {
                        let e = if kind == keys::CAPSULES {
                            self.store.capsule(ids.0, ids.1)?.is_some()
                        } else {
                            self.store.configuration(ids.0, ids.1)?.is_some()
                        };
                        last = Some((ids, e));
                        e
                    }
                };
                if !exists {
                    if let Err(e) = self.blobs.delete(&key).await {
                        tracing::warn!(key, error = %e, "could not delete an orphaned blob");
                        continue;
                    }
                    gone += 1;
                }
            }
        }
        Ok(gone)
    }

    /// The list as JSON. The bytes are kept per (project, filters) and reused while the
    /// project's cached capsule list is the same `Arc` (any capsule write replaces it).
    pub fn list_json(&self, pid: u64, f: &CapsuleFilter) -> Result<bytes::Bytes> {
        let records = self.store.project_capsules(pid)?;
        let key = (
            pid,
            f.name.clone().unwrap_or_default(),
            f.capsule_type.clone().unwrap_or_default(),
            f.latest_only,
        );
        let stamp = Arc::as_ptr(&records) as usize;
        if let Some(hit) = self.list_cache.get(&key)
            && hit.0 == stamp
        {
            return Ok(hit.1.clone());
        }
        let items = Self::items(&records, f);
        let bytes = bytes::Bytes::from(
            serde_json::to_vec(&items).map_err(|e| Error::Internal(e.to_string()))?,
        );
        if self.list_cache.len() >= 1024 {
            self.list_cache.clear();
        }
        // The list's `Arc` is held alongside so its address cannot be reused by another.
        self.list_cache
            .insert(key, (stamp, bytes.clone(), records.clone()));
        Ok(bytes)
    }

    /// The list as items (the console's pipeline page).
    pub fn capsules(&self, pid: u64, f: &CapsuleFilter) -> Result<Vec<CapsuleItem>> {
        Ok(Self::items(&self.store.project_capsules(pid)?, f))
    }

    fn items(records: &[Arc<Capsule>], f: &CapsuleFilter) -> Vec<CapsuleItem> {
        records
            .iter()
            .filter(|c| f.name.as_ref().is_none_or(|n| &c.name == n))
            .filter(|c| f.capsule_type.as_ref().is_none_or(|t| &c.capsule_type == t))
            .filter(|c| !f.latest_only || c.is_latest)
            .map(|c| CapsuleItem {
                id: c.id,
                name: c.name.clone(),
                version: c.version.clone(),
                capsule_type: c.capsule_type.clone(),
                file_size_bytes: c.file_size_bytes,
                is_latest: c.is_latest,
                validation_status: c.upload.validation_status,
                created_at: fmt_ms(c.created_at),
            })
            .collect()
    }

    pub async fn detail(&self, pid: u64, id: u64) -> Result<CapsuleDetail> {
        let c = self.capsule(pid, id)?;
        let mut versions: Vec<Version> = self
            .store
            .project_capsules(pid)?
            .iter()
            .filter(|o| o.name == c.name)
            .map(|o| Version::new(o.version_major, o.version_minor, o.version_patch))
            .collect();
        versions.sort_by(|a, b| b.cmp(a));
        let exp = now_ms() / 1000 + self.cfg.download_ttl_seconds;
        let (source, test_runs) = crate::provenance::source_and_runs(&self.store, pid, c.id)?;
        Ok(CapsuleDetail {
            source,
            test_runs,
            capsule: CapsuleView::from(&c),
            all_versions: versions.iter().map(Version::to_string).collect(),
            download_url: self
                .download_link(UploadKind::Capsule, pid, id, &c.upload.blob_key, exp)
                .await?,
        })
    }

    pub async fn delete(&self, pid: u64, id: u64) -> Result<()> {
        self.remove(UploadKind::Capsule, pid, id, false)
            .await
            .map(|_| ())
    }

    /// 404 unless the record exists (checked before a body is read: 404 comes before
    /// 413/400/422). `kind`: capsule, configuration or deployment.
    pub fn exists(&self, kind: &str, pid: u64, id: u64) -> Result<()> {
        let (found, noun) = match UploadKind::parse(kind) {
            Some(k @ UploadKind::Capsule) => (self.store.capsule(pid, id)?.is_some(), k.noun()),
            Some(k @ UploadKind::Configuration) => {
                (self.store.configuration(pid, id)?.is_some(), k.noun())
            }
            None => (self.store.deployment(pid, id)?.is_some(), "Deployment"),
        };
        if found {
            Ok(())
        } else {
            Err(Error::not_found(noun))
        }
    }
}
