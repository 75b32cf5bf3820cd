//! The upload machinery capsules and configurations share: which kind a link or a lock is
//! for, the presigned links, the `PUT`/`GET` of the local backend's own links, the
//! per-object lock of upload and confirm, sealing's tidy-up, and the purge of uploads never
//! confirmed. Each kind keeps its own validation (`mod.rs` for capsules,
//! `configurations.rs`).

use super::{Download, PipelineHandle, keys};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::links::{Link, Purpose};
use crate::project::PipelineMsg;
use crate::rules::config_files::MAX_CONFIG_BYTES;
use fleetops_storage::UploadState;
use fleetops_storage::blobs::PutError;
use futures::StreamExt;
use futures::stream::BoxStream;

pub use crate::rules::blob_keys::UploadKind;

impl PipelineHandle {
    /// The presigned upload URL: the store's own on S3, else a signed fleetops link.
    pub(super) async fn upload_link(
        &self,
        kind: UploadKind,
        pid: u64,
        id: u64,
        upload: &UploadState,
    ) -> Result<String> {
        let ttl = std::time::Duration::from_secs(self.cfg.upload_ttl_seconds.max(1) as u64);
        if let Some(url) = self.blobs.presign(true, &upload.blob_key, ttl).await? {
            return Ok(url);
        }
        let token = self.signer.sign(&Link {
            purpose: Purpose::Upload,
            kind: kind.as_str().into(),
            project_id: pid,
            id,
            exp: upload.upload_expires_at / 1000,
        })?;
        Ok(format!("{}/api/v1/uploads/{token}", self.base()))
    }

    /// The 15-minute download URL, like [`Self::upload_link`].
    pub(super) async fn download_link(
        &self,
        kind: UploadKind,
        pid: u64,
        id: u64,
        blob_key: &str,
        exp_secs: i64,
    ) -> Result<String> {
        let ttl = std::time::Duration::from_secs(self.cfg.download_ttl_seconds.max(1) as u64);
        if let Some(url) = self.blobs.presign(false, blob_key, ttl).await? {
            return Ok(url);
        }
        let token = self.signer.sign(&Link {
            purpose: Purpose::Download,
            kind: kind.as_str().into(),
            project_id: pid,
            id,
            exp: exp_secs,
        })?;
        Ok(format!("{}/api/v1/downloads/{token}", self.base()))
    }

    /// Whether `claimed` differs from the computed `sha` (constant time; case and surrounding
    /// spaces of the claim ignored).
    pub(super) fn checksum_mismatch(sha: &str, claimed: &str) -> bool {
        !crate::secrets::ct_eq(
            sha.as_bytes(),
            claimed.trim().to_ascii_lowercase().as_bytes(),
        )
    }

    /// Streams an upload into the blob store, at most `max` bytes.
    pub(super) async fn put_upload(
        &self,
        key: &str,
        body: BoxStream<'static, std::io::Result<bytes::Bytes>>,
        max: u64,
    ) -> Result<u64> {
        self.blobs
            .put_stream(key, body, max)
            .await
            .map_err(|e| match e {
                PutError::TooLarge(max) => {
                    Error::TooLarge(format!("The upload exceeds the declared {max} bytes"))
                }
                PutError::Body(e) => Error::unreadable_body(&e),
                PutError::Storage(e) => Error::from(e),
            })
    }

    /// The uploaded size: recorded by our own upload link, or (S3, where the client PUTs to
    /// the store directly) asked of the store. `None`: nothing uploaded.
    pub(super) async fn stored_size(
        &self,
        key: &str,
        recorded: Option<u64>,
    ) -> Result<Option<u64>> {
        if self.blobs.presigns() {
            Ok(self.blobs.size(key).await?)
        } else {
            Ok(recorded)
        }
    }

    /// A small blob whole (configuration files), refusing more than `max` bytes.
    pub(super) async fn read_small(&self, key: &str, max: u64) -> Result<Vec<u8>> {
        let mut s = self.blobs.stream(key, None).await?;
        let mut out = Vec::new();
        while let Some(piece) = s.next().await {
            let piece = piece.map_err(|e| Error::Internal(e.to_string()))?;
            if (out.len() + piece.len()) as u64 > max {
                return Err(Error::TooLarge(format!(
                    "Configuration files are at most {max} bytes"
                )));
            }
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }

    /// `PUT /uploads/{token}`: the bytes, at most the declared size.
    pub async fn upload(
        &self,
        token: &str,
        body: BoxStream<'static, std::io::Result<bytes::Bytes>>,
    ) -> Result<u64> {
        let link = self
            .signer
            .verify(token, Purpose::Upload, now_ms() / 1000)?;
        let kind = UploadKind::parse(&link.kind)
            .ok_or_else(|| Error::BadRequest("Unknown upload kind".into()))?;
        let (pid, id) = (link.project_id, link.id);
        if self.store.project_retired(pid) {
            return Err(Error::not_found(kind.noun()));
        }
        let _slot = self.uploads.take(self.store.org_of_project(pid)?, 1)?;
        let _busy = self.busy(kind, id)?;
        // Read under the lock: a confirm that finished first makes the bytes immutable.
        let (upload, max) = match kind {
            UploadKind::Capsule => {
                let c = self.capsule(pid, id)?;
                (c.upload, c.file_size_bytes)
            }
            UploadKind::Configuration => {
                let c = self.configuration(pid, id)?;
                (c.upload, c.declared_size.unwrap_or(MAX_CONFIG_BYTES))
            }
        };
        if upload.confirmed {
            return Err(Error::Conflict(format!(
                "{} already confirmed; its bytes are immutable",
                kind.noun()
            )));
        }
        let size = self.put_upload(&upload.blob_key, body, max).await?;
        self.projects
            .write(pid, |reply| PipelineMsg::Uploaded {
                kind,
                id,
                size,
                reply,
            })
            .await?;
        Ok(size)
    }

    /// `GET /downloads/{token}`: the file a link names (404 once it is gone).
    pub fn linked_file(&self, token: &str) -> Result<Download> {
        let link = self
            .signer
            .verify(token, Purpose::Download, now_ms() / 1000)?;
        if self.store.project_retired(link.project_id) {
            return Err(Error::not_found("File"));
        }
        if link.kind == super::EFFECTIVE_CONFIGURATION {
            let c = self
                .store
                .configuration(link.project_id, link.id)?
                .ok_or_else(|| Error::not_found("Configuration"))?;
            let bytes = bytes::Bytes::from(c.config_data_json);
            return Ok(Download {
                filename: format!("{}-{}.effective.json", c.name, c.version),
                content_type: "application/json",
                size: bytes.len() as u64,
                source: super::DownloadSource::Inline(bytes),
            });
        }
        let (blob, size, filename, content_type) =
            if UploadKind::parse(&link.kind) == Some(UploadKind::Configuration) {
                let c = self
                    .store
                    .configuration(link.project_id, link.id)?
                    .ok_or_else(|| Error::not_found("Configuration"))?;
                let mime = match c.upload.file_format.as_str() {
                    ".json" => "application/json",
                    ".yaml" => "application/yaml",
                    ".toml" => "application/toml",
                    _ => "text/plain; charset=utf-8",
                };
                let name = format!("{}-{}{}", c.name, c.version, c.upload.file_format);
                (c.upload.blob_key, c.upload.uploaded_bytes, name, mime)
            } else {
                let c = self.capsule(link.project_id, link.id)?;
                let mime = match c.upload.file_format.as_str() {
                    ".zip" => "application/zip",
                    ".tar" => "application/x-tar",
                    _ => "application/gzip",
                };
                let name = format!("{}-{}{}", c.name, c.version, c.upload.file_format);
                (c.upload.blob_key, c.upload.uploaded_bytes, name, mime)
            };
        let Some(size) = size else {
            return Err(Error::not_found("File"));
        };
        Ok(Download {
            filename,
            content_type,
            size,
            source: super::DownloadSource::Blob(blob),
        })
    }

    /// A link to the effective (merged) data of configuration `id`, as JSON: what a device
    /// installs, served by the service itself on every blob backend.
    pub(super) fn effective_config_link(&self, pid: u64, id: u64, exp_secs: i64) -> Result<String> {
        let token = self.signer.sign(&Link {
            purpose: Purpose::Download,
            kind: super::EFFECTIVE_CONFIGURATION.into(),
            project_id: pid,
            id,
            exp: exp_secs,
        })?;
        Ok(format!("{}/api/v1/downloads/{token}", self.base()))
    }

    /// The bytes of a linked file, or of `range` of them (a download resumed).
    pub async fn download_bytes(
        &self,
        d: &Download,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<BoxStream<'static, std::io::Result<bytes::Bytes>>> {
        match &d.source {
            super::DownloadSource::Blob(key) => Ok(self.blobs.stream(key, range).await?),
            super::DownloadSource::Inline(b) => {
                let len = b.len() as u64;
                let r = range.unwrap_or(0..len);
                let part = b.slice(r.start.min(len) as usize..r.end.min(len) as usize);
                Ok(Box::pin(futures::stream::once(async move { Ok(part) })))
            }
        }
    }

    /// Removes capsules and configurations never confirmed whose upload link has expired (the
    /// housekeeper calls this); returns how many went.
    pub async fn purge_expired(&self) -> Result<usize> {
        let now = now_ms();
        let mut purged = 0;
        for org in self.store.all_orgs()? {
            for p in self.store.org_projects(org.id)? {
                let expired = |confirmed: bool, until: i64| !confirmed && until <= now;
                let capsules = self.store.project_capsules(p.id)?;
                let configurations = self.store.project_configurations(p.id)?;
                let stale = capsules
                    .iter()
                    .filter(|c| expired(c.upload.confirmed, c.upload.upload_expires_at))
                    .map(|c| (UploadKind::Capsule, c.id))
                    .chain(
                        configurations
                            .iter()
                            .filter(|c| expired(c.upload.confirmed, c.upload.upload_expires_at))
                            .map(|c| (UploadKind::Configuration, c.id)),
                    );
                for (kind, id) in stale {
                    // Never one whose upload or confirm is under way.
                    let Ok(_busy) = self.busy(kind, id) else {
                        continue;
                    };
                    match self.remove(kind, p.id, id, true).await {
                        Ok(gone) => purged += usize::from(gone),
                        Err(e) => {
                            tracing::warn!(kind = kind.as_str(), id, error = %e, "could not purge an expired upload")
                        }
                    }
                }
            }
        }
        Ok(purged)
    }

    /// After a sealing confirm, its verdict written or not (`current`: the blob key the
    /// durable record holds now, `None` once deleted): every object of the record's sealed
    /// folder that the record does not point at goes (the staging copy; a content copy whose
    /// verdict was not written), and the upload key goes once the record points elsewhere. A
    /// late `PUT` may put an object there again; deleting the record deletes it too.
    pub(crate) async fn tidy_sealed(
        &self,
        kind: UploadKind,
        pid: u64,
        id: u64,
        current: Option<&str>,
    ) {
        match self.blobs.list(&keys::sealed(kind.folder(), pid, id)).await {
            Ok(found) => {
                for k in found.iter().filter(|k| Some(k.as_str()) != current) {
                    if let Err(e) = self.blobs.delete(k).await {
                        tracing::warn!(key = %k, error = %e, "could not delete a sealed copy");
                    }
                }
            }
            Err(e) => tracing::warn!(id, error = %e, "could not list the sealed copies"),
        }
        let upload = keys::upload(kind.folder(), pid, id);
        if current != Some(upload.as_str())
            && let Err(e) = self.blobs.delete(&upload).await
        {
            tracing::warn!(key = %upload, error = %e, "could not delete a sealed upload's key");
        }
    }

    /// Once a sealing confirm's verdict is durable: keeps only what the record points at
    /// (see [`Self::tidy_sealed`]). Never called after another error, when the write may be
    /// applied in memory and not yet on disk and the record may still point at the upload key.
    pub(super) async fn tidy_after_verdict(&self, kind: UploadKind, pid: u64, id: u64) {
        let current = match kind {
            UploadKind::Capsule => self.store.capsule(pid, id).map(|c| c.map(|c| c.upload)),
            UploadKind::Configuration => self
                .store
                .configuration(pid, id)
                .map(|c| c.map(|c| c.upload)),
        };
        match current {
            Ok(now) => {
                let now = now.map(|u| u.blob_key);
                self.tidy_sealed(kind, pid, id, now.as_deref()).await;
            }
            Err(e) => tracing::warn!(id, error = %e, "could not tidy a sealed upload"),
        }
    }

    /// Once a record is durably deleted: its bytes, its upload key (on S3 a late `PUT` may
    /// have put an object there after confirm) and its sealed folder (copies a crash left).
    pub(crate) async fn drop_blobs(&self, kind: UploadKind, pid: u64, id: u64, blob_key: &str) {
        let _ = self.blobs.delete(blob_key).await;
        let upload = keys::upload(kind.folder(), pid, id);
        if upload != blob_key {
            let _ = self.blobs.delete(&upload).await;
        }
        let _ = self
            .blobs
            .delete_prefix(&keys::sealed(kind.folder(), pid, id))
            .await;
    }

    /// Serializes an object's upload and confirm, so the bytes confirm hashes are the bytes
    /// it records; the second comer gets 409.
    pub(crate) fn busy(
        &self,
        kind: UploadKind,
        id: u64,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        let m = self.locks.entry((kind, id)).or_default().clone();
        m.try_lock_owned()
            .map_err(|_| Error::Conflict("An upload or confirm of this file is in progress".into()))
    }

    /// Deletes a capsule or configuration (with `only_expired`, only a never-confirmed upload
    /// whose link has expired, decided by the project's actor), then its blobs once the
    /// record is durably gone; whether it went.
    pub(super) async fn remove(
        &self,
        kind: UploadKind,
        pid: u64,
        id: u64,
        only_expired: bool,
    ) -> Result<bool> {
        let blob = self
            .projects
            .write(pid, |reply| PipelineMsg::DeleteUpload {
                kind,
                id,
                only_expired,
                reply,
            })
            .await?;
        if let Some(b) = &blob {
            self.drop_blobs(kind, pid, id, b).await;
            self.locks.remove(&(kind, id));
        }
        Ok(blob.is_some())
    }

    /// The upload state of a record announced now: pending, its link valid
    /// `upload_ttl_seconds`.
    pub(super) fn pending_upload(
        &self,
        file_format: &str,
        now_ms: i64,
    ) -> fleetops_storage::UploadState {
        fleetops_storage::UploadState::pending(
            file_format.to_string(),
            now_ms + self.cfg.upload_ttl_seconds * 1000,
        )
    }
}
