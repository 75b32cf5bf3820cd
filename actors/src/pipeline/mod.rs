//! [`PipelineHandle`]: the deployment pipeline, from an uploaded capsule to what a robot runs.
//! Capsules here; configurations, deployment packages, phased rollouts, the device update API
//! and the upload machinery capsules and configurations share in their own modules
//! (`configurations`, `deployments`, `rollouts`, `updates`, `uploads`).
//!
//! The upload flow: `upload-url` checks the request, takes the organization's quota turn with
//! the declared size reserved (`quota`), creates the record and answers a signed upload link;
//! the bytes are PUT to that link (at most the declared size); `confirm` computes SHA-256 over
//! the stored bytes, checks the archive and the dependencies, and settles `passed`/`failed`
//! and `is_latest`. Above `sync_validation_max_bytes` confirm answers 202 and validates in the
//! background; the owed validation is written durably before the 202 and resumed at start-up
//! and by the housekeeper (`resume_validations`) until its verdict is written.
//!
//! Invariants a change must keep:
//! - Writes go through the project's actor (single writer of `is_latest`, uniqueness,
//!   references and transitions); this handle writes no record itself.
//! - Hashing and archive checks run on a blocking thread over a temporary copy, memory flat;
//!   an archive's check reads a bounded amount of decompressed bytes and entries
//!   (`archives`).
//! - Confirmed bytes never change. On the local backend the upload and download links are
//!   fleetops' own signed tokens (`/api/v1/uploads/{token}`, `/api/v1/downloads/{token}`); a
//!   `PUT` there shares the object's lock with confirm and is refused once confirmed. On S3
//!   they are the store's own presigned URLs, which cannot be revoked, so a capsule's confirm
//!   copies the upload to a staging key no URL targets, validates that copy and seals it under
//!   its content key (see [`keys`]); the record's `blob_key` moves in the verdict's write, and
//!   the upload key is deleted only once that write is durable.
//!
//! Tested through the real server (`tests/api/capsules.rs`, `configurations.rs`,
//! `deployments.rs`, `rollouts.rs`, `updates.rs`), against moto for S3 (`tests/api/s3.rs`),
//! and by the crash harness, which kills the server with a validation owed.

pub mod configurations;
pub mod deployments;
pub mod rollouts;
pub mod updates;
mod uploads;

pub use uploads::UploadKind;

use std::io::Write;
use std::sync::Arc;

use fleetops_storage::{BlobStore, Capsule, Store};
use futures::StreamExt;
use futures::stream::BoxStream;
use semver::Version;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::archives;
use crate::clock::{fmt_ms, now_ms};
use crate::error::{Error, Result};
use crate::links::Signer;
use crate::project::ProjectMsg;
use crate::project::handle::ProjectsHandle;
use crate::versions::{Constraint, parse_version};
use fleetops_storage::ValidationStatus;

pub use crate::config::PipelineConfig;
pub(crate) use crate::rules::blob_keys as keys;

/// The upload/confirm lock of one capsule or configuration.
pub(crate) type ObjectLock = Arc<tokio::sync::Mutex<()>>;

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
    source: DownloadSource,
}

/// A linked file's bytes: a blob, or bytes the service holds (a configuration's effective,
/// merged data).
enum DownloadSource {
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

#[derive(Clone)]
pub struct PipelineHandle {
    pub(crate) projects: ProjectsHandle,
    pub(crate) store: Store,
    pub(crate) blobs: BlobStore,
    pub(crate) signer: Arc<Signer>,
    pub(crate) public_url: Arc<std::sync::RwLock<String>>,
    /// Storage limit per tier name.
    pub(crate) quotas: Arc<std::collections::HashMap<String, u64>>,
    /// One writer per organization checks and reserves storage.
    pub(crate) quota: crate::quota::QuotaHandle,
    pub(crate) cfg: PipelineConfig,
    pub(crate) tmp_dir: Option<std::path::PathBuf>,
    /// Streamed uploads running now, shared with the sessions' artifacts (one pool, each
    /// organization's share).
    pub(crate) uploads: crate::shares::Shares,
    /// Per-object locks of upload and confirm.
    pub(crate) locks: Arc<dashmap::DashMap<(UploadKind, u64), ObjectLock>>,
    /// Rollout results as the project actors publish them, for the alert evaluator.
    pub(crate) rollouts: crate::events::Outbox<deployments::RolloutEvent>,
    /// Which package each device should run, cached (shared with the project actors).
    pub(crate) assignments: Arc<crate::assignments::Assignments>,
    /// One controller per phased rollout under way.
    pub(crate) controllers: crate::keyed::Keyed<crate::rollout::RolloutActor>,
    /// Tells the other nodes to start a rollout's controller too (the one holding its lease
    /// decides; the others stand by to take over).
    pub(crate) bus: crate::bus::Bus,
    #[cfg(feature = "fault-injection")]
    pub(crate) rollout_stop_holds: crate::rollout::StopHolds,
    /// Serialized lists: (project, name, type, latest_only) -> (list identity, JSON, list).
    #[allow(clippy::type_complexity)]
    pub(crate) list_cache: Arc<
        dashmap::DashMap<
            (u64, String, String, bool),
            (usize, bytes::Bytes, Arc<Vec<Arc<Capsule>>>),
        >,
    >,
}

/// A reservation's write as the caller answers it; `None` when it lost to another process's
/// reservation of the same organization, so its count must be made again. Each loss is the
/// other's progress; past 32 in a row the caller is answered 503 to try again.
pub(crate) fn reservation_written<T>(r: Result<T>, raced: &mut u32) -> Option<Result<T>> {
    match r {
        Err(Error::Conflict(m)) if m == fleetops_storage::pipeline::QUOTA_RACED => {
            *raced += 1;
            (*raced >= 32).then_some(Err(Error::Unavailable {
                retry_after_secs: 1,
            }))
        }
        r => Some(r),
    }
}

impl PipelineHandle {
    fn base(&self) -> String {
        self.public_url
            .read()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    fn capsule(&self, pid: u64, id: u64) -> Result<Capsule> {
        self.store
            .capsule(pid, id)?
            .ok_or_else(|| Error::not_found("Capsule"))
    }

    /// The organization's turn to reserve `add` more bytes (413 when they would exceed its
    /// tier's storage limit). Held until the record that reserves them is written, so
    /// concurrent uploads to several projects of one organization are counted one at a time.
    async fn reserve(&self, org_id: u64, tier: &str, add: u64) -> Result<crate::quota::Turn> {
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
                .write(pid, |reply| ProjectMsg::CreateCapsule {
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
                .write(pid, |reply| ProjectMsg::ValidationPending {
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

    fn validate_in_background(
        &self,
        pid: u64,
        id: u64,
        checksum: String,
        busy: tokio::sync::OwnedMutexGuard<()>,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            let _busy = busy;
            if let Err(e) = me.validate_and_settle(pid, id, checksum).await {
                tracing::warn!(capsule = id, error = %e, "background validation failed");
            }
        });
    }

    /// Resumes the validations a crash, a stop or a failure interrupted (confirms answered
    /// 202 whose verdict was not written): at start-up and on each housekeeping pass. One
    /// under way holds its capsule's lock and is skipped.
    pub fn resume_validations(&self) -> Result<usize> {
        let owed = self.store.pending_validations()?;
        let n = owed.len();
        for (pid, id, checksum) in owed {
            match self.busy(UploadKind::Capsule, id) {
                Ok(busy) => self.validate_in_background(pid, id, checksum, busy),
                Err(_) => continue,
            }
        }
        Ok(n)
    }

    /// Hashes and checks the stored bytes, then records the verdict. A checksum mismatch
    /// fails the capsule and answers 400.
    ///
    /// On S3 the presigned upload URL cannot be revoked and stays valid after confirm, so the
    /// bytes are sealed first: the upload key is copied server-side to a staging key of the
    /// capsule's sealed folder, which no URL targets (one `CopyObject` copies one consistent
    /// version of its source), and everything after reads that copy. So the bytes hashed and
    /// checked are exactly the bytes then copied to the content key and recorded: a `PUT` to
    /// the upload key at any moment (before, while or after they are hashed) cannot change
    /// them. The record's `blob_key` moves to the content key in the same write as the
    /// verdict, and the upload key is deleted only once that write is durable.
    ///
    /// On the local backend the upload link is fleetops' own, shares the capsule's lock with
    /// confirm and refuses a `PUT` once confirmed (409), so the bytes are validated in place.
    async fn validate_and_settle(&self, pid: u64, id: u64, checksum: String) -> Result<Capsule> {
        let c = self.capsule(pid, id)?;
        if c.upload.confirmed {
            // Never reached (confirm checks under the lock, and an owed validation is
            // cleared with the verdict); kept so a settled record's bytes are never touched.
            return Err(Error::Conflict("Capsule already confirmed".into()));
        }
        if !self.blobs.presigns() {
            return self
                .check_and_settle(&c, &c.upload.blob_key, checksum, false)
                .await;
        }
        let staging = keys::staging(keys::CAPSULES, pid, id);
        if !self.blobs.copy(&c.upload.blob_key, &staging).await? {
            return Err(Error::Conflict(
                "Nothing has been uploaded for this capsule".into(),
            ));
        }
        let settled = self.check_and_settle(&c, &staging, checksum, true).await;
        // A checksum mismatch is a written verdict too.
        if matches!(settled, Ok(_) | Err(Error::BadRequest(_))) {
            self.tidy_after_verdict(UploadKind::Capsule, pid, id).await;
        }
        settled
    }

    /// Validates the bytes of `source` (the record's own key, or on S3 its staging copy) and
    /// writes the verdict; with `seal`, the validated copy is first copied to its content key
    /// and the record points there.
    async fn check_and_settle(
        &self,
        c: &Capsule,
        source: &str,
        checksum: String,
        seal: bool,
    ) -> Result<Capsule> {
        let (pid, id) = (c.project_id, c.id);
        // On S3 the client PUT to the store directly, with no cap: an object larger than
        // declared fails at once (and is removed) instead of being hashed.
        if let Some(stored) = self.stored_size(source, c.upload.uploaded_bytes).await?
            && stored > c.file_size_bytes
        {
            let notes = format!(
                "size is {stored} bytes, {} were declared",
                c.file_size_bytes
            );
            let verdict = self
                .projects
                .write(pid, |reply| ProjectMsg::SettleCapsule {
                    id,
                    size: stored,
                    checksum: String::new(),
                    passed: false,
                    notes: notes.clone(),
                    blob_key: None,
                    reply,
                })
                .await;
            // The failed record still points at the object: it goes with the record.
            return verdict;
        }
        let stream = self.blobs.stream(source, None).await?;
        let (sha, size, archive) = hash_and_check(
            stream,
            c.upload.file_format.clone(),
            self.tmp_dir.as_deref(),
        )
        .await?;
        let mismatch = Self::checksum_mismatch(&sha, &checksum);
        let mut notes = Vec::new();
        if mismatch {
            notes.push("Checksum mismatch".to_string());
        }
        if size != c.file_size_bytes {
            notes.push(format!(
                "size is {size} bytes, {} were declared",
                c.file_size_bytes
            ));
        }
        if let Err(why) = archive {
            notes.push(why);
        }
        for (name, constraint) in &c.dependencies {
            let Ok(req) = Constraint::parse("dependency", constraint) else {
                notes.push(format!("dependency {name} {constraint}: not a constraint"));
                continue;
            };
            let found = self.store.project_capsules(pid)?.iter().any(|d| {
                d.name == *name
                    && d.upload.validation_status == ValidationStatus::Passed
                    && req.matches(&Version::new(
                        d.version_major,
                        d.version_minor,
                        d.version_patch,
                    ))
            });
            if !found {
                notes.push(format!(
                    "dependency {name} {constraint}: no passed version matches"
                ));
            }
        }
        let passed = notes.is_empty();
        let blob_key = if seal {
            // `source` is the staging copy: nothing else writes it, so this copies the bytes
            // just hashed.
            let key = keys::content(keys::CAPSULES, pid, id, &sha);
            if !self.blobs.copy(source, &key).await? {
                return Err(Error::Internal(
                    "the staged copy of the upload disappeared".into(),
                ));
            }
            Some(key)
        } else {
            None
        };
        let verdict = self
            .projects
            .write(pid, |reply| ProjectMsg::SettleCapsule {
                id,
                size,
                checksum: sha.clone(),
                passed,
                notes: notes.join("; "),
                blob_key: blob_key.clone(),
                reply,
            })
            .await?;
        if mismatch {
            return Err(Error::BadRequest("Checksum mismatch".into()));
        }
        Ok(verdict)
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

/// SHA-256 (hex) and size of a stream, and whether it parses as `format`, with a temporary
/// copy on disk so memory stays flat.
async fn hash_and_check(
    mut stream: BoxStream<'static, std::io::Result<bytes::Bytes>>,
    format: String,
    dir: Option<&std::path::Path>,
) -> Result<(String, u64, std::result::Result<usize, String>)> {
    let io = |e: std::io::Error| Error::Internal(e.to_string());
    let tmp = match dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(io)?;
            tempfile::NamedTempFile::new_in(d).map_err(io)?
        }
        None => tempfile::NamedTempFile::new().map_err(io)?,
    };
    let mut file = tmp.reopen().map_err(io)?;
    let mut hasher = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    let mut size = 0u64;
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(io)?;
        hasher.update(&piece);
        size += piece.len() as u64;
        file.write_all(&piece).map_err(io)?;
    }
    file.flush().map_err(io)?;
    let sha = hex::encode(hasher.finish().as_ref());
    let path = tmp.path().to_path_buf();
    let archive = tokio::task::spawn_blocking(move || {
        let _keep = tmp;
        match std::fs::File::open(&path) {
            Ok(f) => archives::validate(
                &format,
                std::io::BufReader::new(f),
                archives::Caps::for_archive(size),
            ),
            Err(e) => Err(format!("could not read the upload back: {e}")),
        }
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?;
    Ok((sha, size, archive))
}
