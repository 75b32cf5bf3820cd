//! A session's artifact files: upload (streamed to the blob store, then recorded by the
//! session's actor), listing, reading, the ZIP of them all, and the sweep of blobs no record
//! points at.

use super::SessionMsg;
use super::exports;
use super::exports::ExportStream;
use super::handle::SessionsHandle;
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::rules;
use crate::views::{ArtifactView, Items};
use fleetops_storage::blobs::PutError;
use fleetops_storage::{Artifact, SessionStatus};
use futures::stream::BoxStream;

impl SessionsHandle {
    /// Deletes artifact blobs no record points at: those a crash left between a blob's write
    /// and its record, or between a record's removal and its blob's. The error paths never
    /// delete a blob a record may still point at; this sweep collects what they leave. A blob
    /// younger than `grace_ms` may belong to an upload still streaming, and is kept. Returns
    /// how many went.
    ///
    /// `store_ahead_ms` moves the object store's clock on for the segment sweep (0 but in
    /// tests, which cannot wait an hour).
    pub async fn collect_orphans(
        &self,
        now_ms: i64,
        grace_ms: i64,
        store_ahead_ms: i64,
    ) -> Result<usize> {
        Ok(self.collect_artifact_orphans(now_ms, grace_ms).await?
            + self.collect_segment_orphans(store_ahead_ms).await?)
    }

    /// Log segments no chunk location points at (and not waiting for deletion): a seal that
    /// crashed between its segment's write and its transaction leaves one. A segment the store
    /// wrote within the last hour may belong to a seal still under way, and is kept: its age is
    /// judged on the object store's own clock (the time it stamped on the segment against the
    /// time it stamps on a probe now), never on the sealing node's, so a node whose clock is
    /// behind cannot have a seal in flight on another collected. Listings come grouped by
    /// session: each session's locations are read once.
    async fn collect_segment_orphans(&self, store_ahead_ms: i64) -> Result<usize> {
        use futures::StreamExt;
        const SEAL_GRACE_MS: i64 = 3_600_000;
        let store_now = self.blobs.clock_ms().await? + store_ahead_ms;
        let prefix = fleetops_storage::sessions::segments::SEGMENT_PREFIX.trim_end_matches('/');
        let mut keys = self.blobs.keys_written(prefix);
        let mut gone = 0;
        let mut current: Option<(u64, std::collections::HashSet<String>)> = None;
        while let Some(key) = keys.next().await {
            let (key, written) = key?;
            let Some(session) = fleetops_storage::sessions::segments::segment_session(&key) else {
                continue;
            };
            if store_now - written < SEAL_GRACE_MS {
                continue;
            }
            if current.as_ref().is_none_or(|c| c.0 != session) {
                let store = self.store.clone();
                let held =
                    crate::off_thread(move || Ok(store.segments_referenced(session)?)).await?;
                current = Some((session, held));
            }
            if current.as_ref().is_some_and(|c| c.1.contains(&key))
                || self.store.segment_doomed(&key)?
            {
                continue;
            }
            if let Err(e) = self.blobs.delete(&key).await {
                tracing::warn!(key, error = %e, "could not delete an orphaned log segment");
                continue;
            }
            gone += 1;
        }
        Ok(gone)
    }

    async fn collect_artifact_orphans(&self, now_ms: i64, grace_ms: i64) -> Result<usize> {
        use futures::StreamExt;
        let mut keys = self.blobs.keys("artifacts");
        // Listings come grouped by session: one session's records at a time.
        let mut current: Option<(u64, bool, std::collections::HashSet<String>)> = None;
        let mut gone = 0;
        while let Some(key) = keys.next().await {
            let key = key?;
            let mut parts = key.split('/');
            let (Some("artifacts"), Some(sid), Some(name), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Ok(sid) = sid.parse::<u64>() else {
                continue;
            };
            if current.as_ref().is_none_or(|c| c.0 != sid) {
                let exists = self.store.session_by_id(sid)?.is_some();
                let held = self
                    .store
                    .artifacts(sid)?
                    .into_iter()
                    .map(|a| a.blob_key)
                    .collect();
                current = Some((sid, exists, held));
            }
            let Some((_, exists, held)) = &current else {
                continue;
            };
            if held.contains(&key) {
                continue;
            }
            // Not a key of ours (a backend's temporary file of a write in flight): left alone.
            let Ok(made_by) = uuid::Uuid::parse_str(name) else {
                continue;
            };
            // Keys made before v7 carry no time; no upload of theirs can still be running.
            let young = made_by.get_timestamp().is_some_and(|t| {
                let (secs, nanos) = t.to_unix();
                let made = secs as i64 * 1000 + i64::from(nanos / 1_000_000);
                now_ms - made < grace_ms
            });
            if *exists && young {
                continue;
            }
            // One blob that cannot be deleted now does not stop the sweep; the next retries.
            if let Err(e) = self.blobs.delete(&key).await {
                tracing::warn!(key, error = %e, "could not delete an orphaned blob");
                continue;
            }
            gone += 1;
        }
        Ok(gone)
    }

    /// Stores an artifact streamed from the request body (replacing the same path), answered
    /// once the bytes and the record are durable.
    pub async fn put_artifact(
        &self,
        pid: u64,
        id: u64,
        path: String,
        content_type: Option<String>,
        body: BoxStream<'static, std::io::Result<bytes::Bytes>>,
    ) -> Result<ArtifactView> {
        let s = self.record(pid, id)?;
        rules::artifact_path(&path)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        let content_type = content_type
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| {
                mime_guess::from_path(&path)
                    .first_or_octet_stream()
                    .essence_str()
                    .to_string()
            });
        let _slot = self.uploads.take(self.store.org_of_project(pid)?, 1)?;
        // Time-ordered (v7), so the orphan sweep can tell an upload still in flight by age.
        let blob_key = format!("artifacts/{id}/{}", uuid::Uuid::now_v7());
        let size = self
            .blobs
            .put_stream(&blob_key, body, self.cfg.max_artifact_bytes)
            .await
            .map_err(|e| match e {
                PutError::TooLarge(max) => {
                    Error::TooLarge(format!("An artifact is at most {max} bytes"))
                }
                PutError::Body(e) => Error::unreadable_body(&e),
                PutError::Storage(e) => Error::from(e),
            })?;
        let a = Artifact {
            session_id: id,
            path,
            size_bytes: size,
            content_type,
            blob_key: blob_key.clone(),
            created_at: now_ms(),
        };
        let view = ArtifactView::from(&a);
        let replaced = match self
            .actors
            .call(id, |reply| SessionMsg::PutArtifact(a.clone(), reply))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Refused or never taken on (503): the record does not point at the blob. The
                // actor may also have died after writing it (500): then the record is the
                // truth, and the blob it points at stays.
                let kept = matches!(
                    self.store.artifact(id, &a.path),
                    Ok(Some(ref r)) if r.blob_key == blob_key
                );
                if !kept {
                    let _ = self.blobs.delete(&blob_key).await;
                }
                return Err(e);
            }
        };
        self.store.durable().await?;
        if let Some(old) = replaced {
            let _ = self.blobs.delete(&old).await;
        }
        Ok(view)
    }

    pub fn artifacts(&self, pid: u64, id: u64) -> Result<Items<ArtifactView>> {
        self.record(pid, id)?;
        Ok(Items {
            items: self
                .store
                .artifacts(id)?
                .iter()
                .map(ArtifactView::from)
                .collect(),
        })
    }

    /// One artifact's record (404 "Artifact not found").
    pub fn artifact(&self, pid: u64, id: u64, path: &str) -> Result<Artifact> {
        self.record(pid, id)?;
        self.store
            .artifact(id, path)?
            .ok_or_else(|| Error::not_found("Artifact"))
    }

    /// The bytes of an artifact, or of `range` of it.
    pub async fn artifact_bytes(
        &self,
        a: &Artifact,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<BoxStream<'static, std::io::Result<bytes::Bytes>>> {
        Ok(self.blobs.stream(&a.blob_key, range).await?)
    }

    /// Every artifact of the session as one ZIP, streamed (each file is copied through in
    /// pieces on a blocking thread; memory stays flat).
    pub fn zip(&self, pid: u64, id: u64) -> Result<ExportStream> {
        self.record(pid, id)?;
        let artifacts = self.store.artifacts(id)?;
        let permit = self.stream_permit(pid)?;
        let (tx, stream) = exports::Pieces::new(self.stall());
        let blobs = self.blobs.clone();
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            if let Err(e) = exports::zip_into(&rt, &blobs, &artifacts, &tx) {
                tx.send(Err(std::io::Error::other(e.to_string())));
            }
        });
        Ok(stream)
    }
}
