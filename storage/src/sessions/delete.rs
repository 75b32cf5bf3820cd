//! Deleting a session whole, and the sealed segments no session needs any more.

use super::*;

impl Store {
    /// Removes the session record, its counters, every log chunk and every artifact record in
    /// one transaction, so a crash leaves the session either whole or gone. Returns the blob
    /// keys, for the caller to delete afterwards.
    pub fn delete_session(&self, s: &Session) -> Result<Vec<String>> {
        // A seal that commits between the listing of the keys and their removal changes the
        // seal cursor: the removal is refused and the keys listed again (no reader pin, so a
        // delete never waits behind a seal's wait for readers).
        for _ in 0..100 {
            if let Some(blobs) = self.try_delete_session(s)? {
                return Ok(blobs);
            }
        }
        Err(StorageError::Corrupt(
            "session delete kept meeting seals".into(),
        ))
    }

    /// One attempt of [`Store::delete_session`]; `None` if a seal committed meanwhile.
    fn try_delete_session(&self, s: &Session) -> Result<Option<Vec<String>>> {
        let cursor_key = keys::log_seal_cursor(s.id);
        let cursor_before = self.inner.logs.get(&cursor_key)?;
        let artifacts = self.artifacts(s.id)?;
        let artifact_keys: Vec<Vec<u8>> = artifacts
            .iter()
            .map(|a| keys::artifact(s.id, &a.path))
            .collect();
        let chunk_keys: Vec<Bytes> = self
            .inner
            .logs
            .scan_prefix(keys::log_prefix(s.id))
            .keys()
            .chain(
                self.inner
                    .logs
                    .scan_prefix(keys::log_summary_prefix(s.id))
                    .keys(),
            )
            .chain(
                self.inner
                    .logs
                    .scan_prefix(keys::log_text_filter_prefix(s.id))
                    .keys(),
            )
            .collect::<std::result::Result<_, _>>()?;
        // Sealed chunks: their locations go, and their segments onto the to-delete list.
        let mut location_keys = Vec::new();
        let mut segments = std::collections::BTreeSet::new();
        for kv in self.inner.logs.scan_prefix(keys::log_location_prefix(s.id)) {
            let (k, v) = kv?;
            let loc: crate::sessions::segments::ChunkLocation = codec::decode(&v)?;
            segments.insert(loc.segment);
            location_keys.push(k);
        }
        let doomed: Vec<Vec<u8>> = segments.iter().map(|g| keys::doomed_segment(g)).collect();
        let seal_keys = [keys::log_seal_cursor(s.id), keys::log_pending(s.id)];
        let rec = keys::session(s.project_id, s.id);
        let counters = keys::session_counters(s.id);
        let owner = keys::session_project(s.id);
        let batch_seq = keys::session_batch_seq(s.id);
        let gate = self.inner.gate.shared();
        let _g = self.list_guard();
        let relist = crate::lists::plan(
            self,
            &[crate::lists::Relist {
                key: rec.clone(),
                new: None,
                old: crate::lists::old_entries::<Session>,
            }],
        )?;
        let done = self
            .inner
            .logs
            .transaction_held(&self.inner.records, &gate, |logs, records| {
                if logs.get(cursor_key.as_slice())? != cursor_before {
                    return Err(TxError::Abort(true));
                }
                for (k, v) in &relist {
                    match v {
                        Some(v) => records.insert(k.as_slice(), v.as_slice())?,
                        None => records.remove(k.as_slice())?,
                    };
                }
                for k in &chunk_keys {
                    logs.remove(k)?;
                }
                for k in &seal_keys {
                    logs.remove(k.as_slice())?;
                }
                for k in &location_keys {
                    logs.remove(k)?;
                }
                for k in &doomed {
                    logs.insert(k.as_slice(), &[][..])?;
                }
                records.remove(rec.as_slice())?;
                records.remove(counters.as_slice())?;
                records.remove(batch_seq.as_slice())?;
                records.remove(owner.as_slice())?;
                for k in &artifact_keys {
                    records.remove(k.as_slice())?;
                }
                Ok(())
            });
        match done {
            Ok(()) => Ok(Some(
                artifacts
                    .into_iter()
                    .map(|a| a.blob_key)
                    .chain(segments)
                    .collect(),
            )),
            // A seal committed since the keys were listed.
            Err(TxOutcome::Abort(true)) => Ok(None),
            Err(TxOutcome::Abort(false)) => {
                Err(StorageError::Corrupt("session delete aborted".into()))
            }
            Err(TxOutcome::Storage(e)) => Err(e),
        }
    }

    /// Up to `limit` segments of deleted sessions still to be deleted from the blob store.
    pub fn doomed_segments(&self, limit: usize) -> Result<Vec<String>> {
        let prefix = keys::doomed_segment_prefix();
        let mut out = Vec::new();
        for k in self.inner.logs.scan_prefix(&prefix).keys().take(limit) {
            let k = k?;
            out.push(String::from_utf8_lossy(&k[prefix.len()..]).into_owned());
        }
        Ok(out)
    }

    /// Deletes `segment` from the blob store, then from the to-delete list.
    pub fn delete_doomed_segment(&self, segment: &str) -> Result<()> {
        if let Some(segs) = self.inner.segments.get() {
            segs.delete(segment)?;
        }
        // Not flushed: if it comes back after a crash, the delete is repeated.
        self.inner.logs.remove(keys::doomed_segment(segment))?;
        Ok(())
    }

    /// The segments `session`'s chunk locations point at. A segment of the session that is
    /// neither here nor on the to-delete list ([`Store::segment_doomed`]) is an orphan (a seal
    /// that crashed before its transaction, or whose transaction failed).
    pub fn segments_referenced(&self, session: u64) -> Result<std::collections::HashSet<String>> {
        let mut out = std::collections::HashSet::new();
        for kv in self
            .inner
            .logs
            .scan_prefix(keys::log_location_prefix(session))
        {
            let (_, v) = kv?;
            out.insert(codec::decode::<crate::sessions::segments::ChunkLocation>(&v)?.segment);
        }
        Ok(out)
    }

    /// Whether `segment` is on the to-delete list.
    pub fn segment_doomed(&self, segment: &str) -> Result<bool> {
        self.inner.logs.contains_key(keys::doomed_segment(segment))
    }
}
