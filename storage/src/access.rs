//! The steps every typed operation is made of: reads of one record or many, id counters,
//! applying a batch of writes (decided, shared, or under the list lock), scans.

use super::*;

impl Store {
    /// Calls `tell` after every write that changed a cached record (users, API keys,
    /// organizations, projects, memberships, groups, capsules), from the writing thread; it
    /// must not block. Another server that hears of it calls [`Store::forget_cached`]. Set
    /// once.
    pub fn on_cache_forget(&self, tell: Box<dyn Fn() + Send + Sync>) {
        self.inner.cache.on_forget(tell);
    }

    /// Forgets every cached record: another server sharing the database wrote one. Reads
    /// the organizations being deleted again too, so the projects of one deleted on another
    /// server are refused here as well ([`Store::project_retired`]).
    pub fn forget_cached(&self) {
        self.inner.cache.clear();
        if let Err(e) = self.load_retired() {
            tracing::warn!(error = %e, "could not read the organizations being deleted");
        }
    }

    /// Reads the organizations being deleted again (another server may have deleted one).
    pub fn refresh_retired(&self) -> Result<()> {
        self.load_retired()
    }

    /// Whether the database answers now (a read of one key), for readiness.
    pub async fn reachable(&self) -> Result<()> {
        self.inner.meta.get_async(b"readyz").await.map(|_| ())
    }

    /// Waits until everything written before this call is on disk. Concurrent callers share
    /// one fsync (group commit).
    pub async fn durable(&self) -> Result<()> {
        match &self.inner.flusher {
            Some(f) => f.wait().await,
            // Every write returned once committed.
            None => Ok(()),
        }
    }

    /// How long each group-commit fsync (sled) or commit (PostgreSQL) took (for `/metrics`).
    pub fn flush_timings(&self) -> Arc<timings::Timings> {
        match (&self.inner.flusher, &self.inner.db) {
            (Some(f), _) => f.timings.clone(),
            (None, engine::Db::Pg(pg)) => pg.commit_timings(),
            (None, engine::Db::Sled(_)) => Arc::default(),
        }
    }

    /// The store's trees with their names, for copies of the whole store (backups,
    /// migrations).
    pub(super) fn named_trees(&self) -> [(&'static str, &gate::Tree); 4] {
        [
            ("records", &self.inner.records),
            ("logs", &self.inner.logs),
            ("seq", &self.inner.seq),
            ("meta", &self.inner.meta),
        ]
    }

    /// Whether the records live in PostgreSQL.
    pub fn on_postgres(&self) -> bool {
        matches!(self.inner.db, engine::Db::Pg(_))
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Synchronous flush for shutdown and offline commands.
    pub fn flush_blocking(&self) -> Result<()> {
        self.inner.db.flush()
    }

    /// Bytes free to this process on the data directory's file system.
    pub fn free_bytes(&self) -> Result<u64> {
        let st = rustix::fs::statvfs(&self.inner.dir).map_err(std::io::Error::from)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// Bytes sled uses on disk, for the space figures in the benches.
    pub fn size_on_disk(&self) -> Result<u64> {
        self.inner.db.size_on_disk()
    }

    pub(super) fn next_id(&self, counter: &str) -> Result<u64> {
        self.next_ids(counter, 1)
    }

    /// Advances `counter` by `n`; returns the first of the `n` ids.
    pub(super) fn next_ids(&self, counter: &str, n: u64) -> Result<u64> {
        let v = self.inner.seq.update_and_fetch(counter.as_bytes(), |old| {
            let cur = old
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            Some(cur.saturating_add(n.max(1)).to_be_bytes().to_vec())
        })?;
        v.and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
            .map(u64::from_be_bytes)
            .map(|last| last.saturating_sub(n.max(1) - 1))
            .ok_or_else(|| StorageError::Corrupt(format!("counter {counter}")))
    }

    pub(super) fn get<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        match self.inner.records.get(key)? {
            Some(v) => codec::decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// [`Store::get`] for a caller on an async task (a request's handler): on PostgreSQL the
    /// round trip is awaited, so no runtime thread is held while the database answers.
    pub(super) async fn get_async<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>> {
        match self.inner.records.get_async(key).await? {
            Some(v) => codec::decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The records at `keys` that exist, in order: one read (one round trip on a network
    /// database) for a page of records.
    pub(super) fn get_many<T: serde::de::DeserializeOwned>(
        &self,
        keys: &[Vec<u8>],
    ) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(keys.len());
        for v in self.inner.records.get_many(keys)?.into_iter().flatten() {
            out.push(codec::decode(&v)?);
        }
        Ok(out)
    }

    pub(super) fn get_id(&self, key: &[u8]) -> Result<Option<u64>> {
        Ok(self
            .inner
            .records
            .get(key)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes))
    }

    pub(super) fn apply(&self, w: Writes) -> Result<()> {
        if self.on_postgres() {
            return self.apply_shared(w);
        }
        let Writes(ops, relist) = w;
        let mut batch = ops.into_batch(self)?;
        if relist.is_empty() {
            self.inner.records.apply_batch(batch)?;
            return Ok(());
        }
        let gate = self.inner.gate.shared();
        let _g = self.list_guard();
        for (k, v) in lists::plan(self, &relist)? {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        self.inner.records.apply_batch_held(batch, &gate)?;
        Ok(())
    }

    /// [`Store::apply`] on an engine other processes write too: the conditional removals,
    /// claims, list entries and counters are read and decided inside one serializable
    /// transaction with the write (run again from the start when another writer's commit
    /// conflicts), so concurrent writers neither both win a claim nor lose a count.
    pub(super) fn apply_shared(&self, w: Writes) -> Result<()> {
        let lists = !w.1.is_empty();
        self.apply_decided(lists, |_| Ok((w.clone(), ())))
    }

    /// On a shared engine: applies the writes `decide` makes from what it reads, inside one
    /// serializable transaction with those reads; `decide` runs again when another writer's
    /// commit conflicts. For a decision that must not fail a whole batch (which of several
    /// deliveries claims its id). `lists`: whether the writes may change lists (this
    /// process's list writers then take turns, as on the embedded store, so only another
    /// process's commit makes the transaction run again).
    pub(super) fn apply_decided<T>(
        &self,
        lists: bool,
        decide: impl Fn(&Reads) -> TxResult<(Writes, T)>,
    ) -> Result<T> {
        use engine::TxOutcome;
        let gate = self.inner.gate.shared();
        let _lists = lists.then(|| self.list_guard());
        // Inside a section's `run` (on this thread): fenced by its counter.
        let section = sections::current();
        let next = std::sync::Mutex::new(None);
        let out = self.inner.records.transaction_held(
            &self.inner.logs,
            &gate,
            |records, _| -> TxResult<T> {
                let read = |k: &[u8]| records.get(k).map_err(engine::TxError::from);
                let many = |ks: &[Vec<u8>]| records.get_many(ks).map_err(engine::TxError::from);
                let (mut w, t) = decide(&Reads { many: &many })?;
                if let Some(section) = &section {
                    let n = sections::fence(&mut w, section)?;
                    *next.lock().unwrap_or_else(|e| e.into_inner()) = Some(n);
                }
                let Writes(ops, relist) = w;
                let mut writes = ops.resolve(read)?;
                if !relist.is_empty() {
                    for (k, v) in lists::plan_by(&relist, read)? {
                        writes.push((k.into(), v.map(Into::into)));
                    }
                }
                for (k, v) in writes {
                    match v {
                        Some(v) => records.insert(&k, &v)?,
                        None => records.remove(&k)?,
                    }
                }
                Ok(t)
            },
        );
        match out {
            Ok(t) => {
                if let Some(n) = next.into_inner().unwrap_or_else(|e| e.into_inner()) {
                    sections::moved(n);
                }
                Ok(t)
            }
            Err(TxOutcome::Abort(StorageError::Conflict(what))) if what == sections::FENCED => {
                Err(StorageError::Unavailable(
                    "another server wrote these records meanwhile; nothing was written".into(),
                ))
            }
            Err(TxOutcome::Abort(e) | TxOutcome::Storage(e)) => Err(e),
        }
    }

    pub(super) fn list_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .list_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records under `prefix`, newest (highest key) first.
    pub(super) fn scan_rev<T: serde::de::DeserializeOwned>(&self, prefix: &[u8]) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(prefix).rev() {
            let (_, v) = kv?;
            out.push(codec::decode(&v)?);
        }
        Ok(out)
    }

    pub(super) fn scan_keys(&self, prefix: &[u8]) -> Result<Vec<engine::Bytes>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(prefix) {
            out.push(kv?.0);
        }
        Ok(out)
    }
}
