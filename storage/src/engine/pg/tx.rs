//! Two-tree transactions: a connection inside `BEGIN ISOLATION LEVEL SERIALIZABLE` that is
//! never returned to the pool still inside it ([`InTx`]), and each tree's side of it.

use super::*;

/// A pooled connection inside an open transaction. Dropped anywhere (a caller that stopped
/// waiting leaves the task's answer, and this with it, unclaimed; a closure that panicked),
/// it is closed, never returned to the pool still inside the transaction, where the next
/// autocommit statement would run in it and be lost with it. [`InTx::release`] gives it back
/// once its transaction ended.
pub(super) struct InTx(Option<deadpool_postgres::Object>);

impl InTx {
    /// Back to the pool: its transaction committed or rolled back.
    pub(super) fn release(mut self) {
        drop(self.0.take());
    }
}

impl std::ops::Deref for InTx {
    type Target = deadpool_postgres::Object;
    fn deref(&self) -> &Self::Target {
        // Set from construction until `release` or `drop` consume it.
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("an InTx is used after its release"))
    }
}

impl Drop for InTx {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(deadpool_postgres::Object::take(c));
        }
    }
}

/// Test hook: how long the begin of a transaction is held after its `BEGIN` (as a database
/// that answers late would), in milliseconds.
#[cfg(test)]
pub(super) static BEGIN_DELAY_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// A connection inside `BEGIN ISOLATION LEVEL SERIALIZABLE`, given back to the pool only
/// after its commit or rollback ([`InTx`]).
pub(super) struct PgTx {
    pub(super) pg: Pg,
    pub(super) client: Mutex<Option<InTx>>,
}

impl PgTx {
    pub(super) fn begin(pg: &Pg) -> Result<Self> {
        let pool = pg.0.pool.clone();
        let client = pg.run(async move {
            let c = InTx(Some(pool.get().await.map_err(pool_error)?));
            c.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                .await
                .map_err(db_error)?;
            #[cfg(test)]
            {
                let ms = BEGIN_DELAY_MS.load(std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            Ok(c)
        })?;
        Ok(Self {
            pg: pg.clone(),
            client: Mutex::new(Some(client)),
        })
    }

    pub(super) fn take(&self) -> Option<InTx> {
        self.client.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(super) fn put_back(&self, c: InTx) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// Reads one key inside the transaction; `Retry` on a serialization failure.
    pub(super) fn get(&self, table: &str, key: &[u8]) -> Result<Option<Bytes>, TxFailure> {
        let Some(c) = self.take() else {
            return Err(TxFailure(TxFailureKind::Storage(
                StorageError::Unavailable("the transaction's connection is gone".into()),
            )));
        };
        let sql = format!("SELECT v FROM {table} WHERE k = $1");
        let key = key.to_vec();
        let (c, out) = self
            .pg
            .run(async move {
                let r = c.query_opt(&sql, &[&key]).await;
                Ok((c, r))
            })
            .map_err(|e| TxFailure(TxFailureKind::Storage(e)))?;
        self.put_back(c);
        match out {
            Ok(row) => Ok(row.map(|r| Bytes::from(r.get::<_, Vec<u8>>(0)))),
            Err(e) if retryable(&e) => Err(TxFailure(TxFailureKind::Retry)),
            Err(e) => Err(TxFailure(TxFailureKind::Storage(db_error(e)))),
        }
    }

    /// The rows of `keys` that exist, read inside the transaction in one statement.
    pub(super) fn get_many(
        &self,
        table: &str,
        keys: Vec<Vec<u8>>,
    ) -> Result<std::collections::HashMap<Vec<u8>, Bytes>, TxFailure> {
        if keys.is_empty() {
            return Ok(Default::default());
        }
        let Some(c) = self.take() else {
            return Err(TxFailure(TxFailureKind::Storage(
                StorageError::Unavailable("the transaction's connection is gone".into()),
            )));
        };
        let sql = format!("SELECT k, v FROM {table} WHERE k = ANY($1)");
        let (c, out) = self
            .pg
            .run(async move {
                let r = c.query(&sql, &[&keys]).await;
                Ok((c, r))
            })
            .map_err(|e| TxFailure(TxFailureKind::Storage(e)))?;
        self.put_back(c);
        match out {
            Ok(rows) => Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, Vec<u8>>(0), Bytes::from(r.get::<_, Vec<u8>>(1))))
                .collect()),
            Err(e) if retryable(&e) => Err(TxFailure(TxFailureKind::Retry)),
            Err(e) => Err(TxFailure(TxFailureKind::Storage(db_error(e)))),
        }
    }

    /// Writes everything and commits: `Ok(false)` when it must be run again.
    pub(super) fn commit(&self, writes: Vec<(Arc<str>, Writes)>) -> Result<bool> {
        let Some(c) = self.take() else {
            return Err(StorageError::Unavailable(
                "the transaction's connection is gone".into(),
            ));
        };
        let commits = self.pg.0.commits.clone();
        self.pg.run(async move {
            let started = std::time::Instant::now();
            let out = async {
                for (table, w) in writes {
                    write_all(&*c, &table, w).await?;
                }
                c.batch_execute("COMMIT").await
            }
            .await;
            match out {
                Ok(()) => {
                    commits.observe(started.elapsed());
                    c.release();
                    Ok(true)
                }
                Err(e) if retryable(&e) => {
                    if c.batch_execute("ROLLBACK").await.is_ok() {
                        c.release();
                    }
                    Ok(false)
                }
                // Whether it committed is unknown; the connection is not reused (dropped).
                Err(e) => Err(db_error(e)),
            }
        })
    }

    pub(super) fn rollback(&self) {
        if let Some(c) = self.take() {
            let _ = self.pg.run(async move {
                if c.batch_execute("ROLLBACK").await.is_ok() {
                    c.release();
                }
                Ok(())
            });
        }
    }
}

/// One table inside a [`PgTx`], with its writes kept until the commit.
pub(super) struct Side<'a> {
    pub(super) conn: &'a PgTx,
    pub(super) table: Arc<str>,
    pub(super) writes: Mutex<Writes>,
}

impl Side<'_> {
    pub(super) fn take(&self) -> Writes {
        std::mem::take(&mut *self.writes.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl TxTree for Side<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, TxFailure> {
        if let Some(v) = self
            .writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            return Ok(v.clone().map(Bytes::from));
        }
        self.conn.get(&self.table, key)
    }
    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, TxFailure> {
        let mut out: Vec<Option<Option<Bytes>>> = {
            let writes = self.writes.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter()
                .map(|k| writes.get(k).map(|v| v.clone().map(Bytes::from)))
                .collect()
        };
        let missing: Vec<Vec<u8>> = keys
            .iter()
            .zip(&out)
            .filter(|(_, o)| o.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        let found = self.conn.get_many(&self.table, missing)?;
        for (k, o) in keys.iter().zip(out.iter_mut()) {
            if o.is_none() {
                *o = Some(found.get(k).cloned());
            }
        }
        Ok(out.into_iter().map(Option::flatten).collect())
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), TxFailure> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_vec(), Some(value.to_vec()));
        Ok(())
    }
    fn remove(&self, key: &[u8]) -> Result<(), TxFailure> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_vec(), None);
        Ok(())
    }
}
