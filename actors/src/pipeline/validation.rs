//! Validating a confirmed capsule: hashed and its archive checked over a temporary copy
//! (memory flat), in the foreground or, above `sync_validation_max_bytes`, in the background,
//! resumed until its verdict is written; the verdict settled through the project's writer.

use super::*;

/// SHA-256 (hex) and size of a stream, and whether it parses as `format`, with a temporary
/// copy on disk so memory stays flat.
pub(super) async fn hash_and_check(
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

impl PipelineHandle {
    pub(super) fn validate_in_background(
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
    pub(super) async fn validate_and_settle(
        &self,
        pid: u64,
        id: u64,
        checksum: String,
    ) -> Result<Capsule> {
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
    pub(super) async fn check_and_settle(
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
                .write(pid, |reply| PipelineMsg::SettleCapsule {
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
            .write(pid, |reply| PipelineMsg::SettleCapsule {
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
}
