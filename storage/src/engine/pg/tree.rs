//! [`PgTree`]: one tree's table, with paged scans in either direction and the single-key
//! atomic operations decided by PostgreSQL.

use super::*;

/// One tree's table.
#[derive(Clone)]
pub(crate) struct PgTree {
    pub(super) pg: Pg,
    pub(super) table: Arc<str>,
}

/// A tree's writes: the last value of each key (`None`: removed), in key order, so that
/// concurrent writers lock rows in one order and never deadlock on each other.
pub(super) type Writes = std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// Upserts and deletes, each as one statement over arrays.
pub(super) async fn write_all(
    c: &impl deadpool_postgres::GenericClient,
    table: &str,
    writes: Writes,
) -> std::result::Result<(), tokio_postgres::Error> {
    let (mut ks, mut vs, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    for (k, v) in writes {
        match v {
            Some(v) => {
                ks.push(k);
                vs.push(v);
            }
            None => gone.push(k),
        }
    }
    if !ks.is_empty() {
        c.execute(
            &format!(
                "INSERT INTO {table} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
                 ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
            ),
            &[&ks, &vs],
        )
        .await?;
    }
    if !gone.is_empty() {
        c.execute(
            &format!("DELETE FROM {table} WHERE k = ANY($1::bytea[])"),
            &[&gone],
        )
        .await?;
    }
    Ok(())
}

pub(super) fn bound_sql(
    b: &Bound<Vec<u8>>,
    op_incl: &str,
    op_excl: &str,
    n: usize,
) -> Option<String> {
    match b {
        Bound::Included(_) => Some(format!("k {op_incl} ${n}")),
        Bound::Excluded(_) => Some(format!("k {op_excl} ${n}")),
        Bound::Unbounded => None,
    }
}

pub(super) fn bound_key(b: &Bound<Vec<u8>>) -> Option<Vec<u8>> {
    match b {
        Bound::Included(k) | Bound::Excluded(k) => Some(k.clone()),
        Bound::Unbounded => None,
    }
}

/// The smallest key above every key starting with `prefix` (`None`: there is none).
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A scan read a page at a time from either end; what one end has read is cut from the
/// other's range, so the two never meet on a key.
pub(super) struct Scan {
    pub(super) tree: PgTree,
    pub(super) lo: Bound<Vec<u8>>,
    pub(super) hi: Bound<Vec<u8>>,
    pub(super) front: VecDeque<(Bytes, Bytes)>,
    pub(super) back: VecDeque<(Bytes, Bytes)>,
    pub(super) front_pages: u32,
    pub(super) back_pages: u32,
    /// Nothing is left between `lo` and `hi` beyond the buffers.
    pub(super) drained: bool,
    pub(super) failed: bool,
}

impl Scan {
    pub(super) fn fetch(&mut self, forward: bool) -> Result<()> {
        let pages = if forward {
            &mut self.front_pages
        } else {
            &mut self.back_pages
        };
        let limit = if *pages == 0 { FIRST_PAGE } else { PAGE };
        *pages += 1;
        let mut cond = Vec::new();
        let mut args = Vec::new();
        if let Some(c) = bound_sql(&self.lo, ">=", ">", args.len() + 1) {
            cond.push(c);
            args.extend(bound_key(&self.lo));
        }
        if let Some(c) = bound_sql(&self.hi, "<=", "<", args.len() + 1) {
            cond.push(c);
            args.extend(bound_key(&self.hi));
        }
        let sql = format!(
            "SELECT k, v FROM {} {} ORDER BY k {} LIMIT {limit}",
            self.tree.table,
            if cond.is_empty() {
                String::new()
            } else {
                format!("WHERE {}", cond.join(" AND "))
            },
            if forward { "ASC" } else { "DESC" },
        );
        let pool = self.tree.pg.0.pool.clone();
        let rows: Vec<(Vec<u8>, Vec<u8>)> = self.tree.pg.run(async move {
            let c = pool.get().await.map_err(pool_error)?;
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args
                .iter()
                .map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            let rows = c.query(&sql, &params).await.map_err(db_error)?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })?;
        if (rows.len() as i64) < limit {
            self.drained = true;
        }
        if let Some((k, _)) = rows.last() {
            if forward {
                self.lo = Bound::Excluded(k.clone());
            } else {
                self.hi = Bound::Excluded(k.clone());
            }
        }
        let buf = if forward {
            &mut self.front
        } else {
            &mut self.back
        };
        buf.extend(
            rows.into_iter()
                .map(|(k, v)| (Bytes::from(k), Bytes::from(v))),
        );
        Ok(())
    }

    pub(super) fn step(&mut self, forward: bool) -> Option<Result<(Bytes, Bytes)>> {
        if self.failed {
            return None;
        }
        loop {
            let own = if forward {
                self.front.pop_front()
            } else {
                self.back.pop_front()
            };
            if let Some(kv) = own {
                return Some(Ok(kv));
            }
            if self.drained {
                // What the other end read and has not handed out yet comes last.
                let other = if forward {
                    self.back.pop_back()
                } else {
                    self.front.pop_back()
                };
                return other.map(Ok);
            }
            if let Err(e) = self.fetch(forward) {
                self.failed = true;
                return Some(Err(e));
            }
        }
    }
}

impl Iterator for Scan {
    type Item = Result<(Bytes, Bytes)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.step(true)
    }
}

impl DoubleEndedIterator for Scan {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.step(false)
    }
}

impl PgTree {
    pub(super) fn pool(&self) -> (Pool, Arc<str>) {
        (self.pg.0.pool.clone(), self.table.clone())
    }

    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.pg.run(self.get_statement(key))
    }

    /// [`PgTree::get`] for a caller on an async task: it waits without holding a thread.
    pub(crate) fn get_async(
        &self,
        key: &[u8],
    ) -> impl Future<Output = Result<Option<Bytes>>> + Send + 'static {
        self.pg.run_async(self.get_statement(key))
    }

    pub(super) fn get_statement(
        &self,
        key: &[u8],
    ) -> impl Future<Output = Result<Option<Bytes>>> + Send + 'static {
        let (pool, t, key) = (self.pg.0.pool.clone(), self.table.clone(), key.to_vec());
        async move {
            let c = pool.get().await.map_err(pool_error)?;
            let row = c
                .query_opt(&format!("SELECT v FROM {t} WHERE k = $1"), &[&key])
                .await
                .map_err(db_error)?;
            Ok(row.map(|r| Bytes::from(r.get::<_, Vec<u8>>(0))))
        }
    }

    pub(crate) fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (pool, t, wanted) = (self.pg.0.pool.clone(), self.table.clone(), keys.to_vec());
        let rows = self.pg.run(async move {
            let c = pool.get().await.map_err(pool_error)?;
            let rows = c
                .query(
                    &format!("SELECT k, v FROM {t} WHERE k = ANY($1)"),
                    &[&wanted],
                )
                .await
                .map_err(db_error)?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
                .collect::<std::collections::HashMap<_, _>>())
        })?;
        Ok(keys
            .iter()
            .map(|k| rows.get(k).cloned().map(Bytes::from))
            .collect())
    }

    pub(crate) fn contains_key(&self, key: &[u8]) -> Result<bool> {
        let (pool, t, key) = (self.pg.0.pool.clone(), self.table.clone(), key.to_vec());
        self.pg.run(async move {
            let c = pool.get().await.map_err(pool_error)?;
            let row = c
                .query_opt(&format!("SELECT 1 FROM {t} WHERE k = $1"), &[&key])
                .await
                .map_err(db_error)?;
            Ok(row.is_some())
        })
    }

    pub(crate) fn range(&self, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Iter {
        Iter::new(Scan {
            tree: self.clone(),
            lo,
            hi,
            front: VecDeque::new(),
            back: VecDeque::new(),
            front_pages: 0,
            back_pages: 0,
            drained: false,
            failed: false,
        })
    }

    pub(crate) fn scan_prefix(&self, prefix: &[u8]) -> Iter {
        let hi = match prefix_end(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        };
        self.range(Bound::Included(prefix.to_vec()), hi)
    }

    pub(crate) fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let mut b = Batch::default();
        b.insert(key, value);
        self.apply_batch(b)
    }

    pub(crate) fn remove(&self, key: &[u8]) -> Result<()> {
        let mut b = Batch::default();
        b.remove(key);
        self.apply_batch(b)
    }

    pub(crate) fn apply_batch(&self, batch: Batch) -> Result<()> {
        let mut last: Writes = Writes::new();
        for (k, v) in batch.0 {
            last.insert(k.to_vec(), v.map(|v| v.to_vec()));
        }
        if last.is_empty() {
            return Ok(());
        }
        let commits = self.pg.0.commits.clone();
        let (pool, t) = self.pool();
        self.pg.run(async move {
            let mut c = pool.get().await.map_err(pool_error)?;
            let started = std::time::Instant::now();
            let tx = c.transaction().await.map_err(db_error)?;
            write_all(&tx, &t, last).await.map_err(db_error)?;
            tx.commit().await.map_err(db_error)?;
            commits.observe(started.elapsed());
            Ok(())
        })
    }

    pub(crate) fn update_and_fetch(
        &self,
        key: &[u8],
        mut f: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<Option<Bytes>> {
        // Read, decide here, write back only if the value is still the one read.
        loop {
            let cur = self.get(key)?;
            let new = f(cur.as_deref());
            if self.compare_and_swap(key, cur.as_deref(), new.as_deref())? {
                return Ok(new.map(Bytes::from));
            }
        }
    }

    pub(crate) fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        let (key, old, new) = (
            key.to_vec(),
            old.map(<[u8]>::to_vec),
            new.map(<[u8]>::to_vec),
        );
        let commits = self.pg.0.commits.clone();
        let (pool, t) = self.pool();
        self.pg.run(async move {
            let c = pool.get().await.map_err(pool_error)?;
            let started = std::time::Instant::now();
            let n = match (old, new) {
                (None, None) => {
                    let row = c
                        .query_opt(&format!("SELECT 1 FROM {t} WHERE k = $1"), &[&key])
                        .await
                        .map_err(db_error)?;
                    return Ok(row.is_none());
                }
                (None, Some(new)) => {
                    c.execute(
                        &format!(
                            "INSERT INTO {t} (k, v) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING"
                        ),
                        &[&key, &new],
                    )
                    .await
                }
                (Some(old), Some(new)) => {
                    c.execute(
                        &format!("UPDATE {t} SET v = $3 WHERE k = $1 AND v = $2"),
                        &[&key, &old, &new],
                    )
                    .await
                }
                (Some(old), None) => {
                    c.execute(
                        &format!("DELETE FROM {t} WHERE k = $1 AND v = $2"),
                        &[&key, &old],
                    )
                    .await
                }
            }
            .map_err(db_error)?;
            commits.observe(started.elapsed());
            Ok(n == 1)
        })
    }

    /// A serializable transaction over this table and `other`'s: reads go to the database
    /// (and see the transaction's own writes, kept here until the commit writes them all).
    pub(crate) fn transaction<A, E>(
        &self,
        other: &PgTree,
        f: impl Fn(&Tx, &Tx) -> Result<A, TxError<E>>,
    ) -> Result<A, TxOutcome<E>> {
        for _ in 0..TX_TRIES {
            let conn = PgTx::begin(&self.pg).map_err(TxOutcome::Storage)?;
            let (a, b) = (
                Side {
                    conn: &conn,
                    table: self.table.clone(),
                    writes: Mutex::default(),
                },
                Side {
                    conn: &conn,
                    table: other.table.clone(),
                    writes: Mutex::default(),
                },
            );
            match f(&Tx(&a), &Tx(&b)) {
                Ok(out) => {
                    let writes = vec![(a.table.clone(), a.take()), (b.table.clone(), b.take())];
                    match conn.commit(writes) {
                        Ok(true) => return Ok(out),
                        Ok(false) => continue,
                        Err(e) => return Err(TxOutcome::Storage(e)),
                    }
                }
                Err(TxError::Abort(e)) => {
                    conn.rollback();
                    return Err(TxOutcome::Abort(e));
                }
                Err(TxError::Engine(TxFailure(TxFailureKind::Retry))) => {
                    conn.rollback();
                    continue;
                }
                Err(TxError::Engine(TxFailure(TxFailureKind::Storage(e)))) => {
                    conn.rollback();
                    return Err(TxOutcome::Storage(e));
                }
                Err(TxError::Engine(TxFailure(TxFailureKind::Sled(_)))) => {
                    conn.rollback();
                    return Err(TxOutcome::Storage(StorageError::Corrupt(
                        "a sled failure inside a PostgreSQL transaction".into(),
                    )));
                }
            }
        }
        Err(TxOutcome::Storage(StorageError::Unavailable(
            "a transaction kept conflicting with others".into(),
        )))
    }
}
