//! The PostgreSQL engine: each tree is a table `fleetops_{tree} (k bytea PRIMARY KEY, v bytea)`,
//! so keys keep sled's byte order (bytea compares bytewise) and every typed operation above
//! runs unchanged. Chosen by `[database] url`.
//!
//! - **Client**: `tokio-postgres` with a `deadpool-postgres` pool, on a runtime of the
//!   engine's own. The store's operations are synchronous; each statement (or transaction
//!   step) runs as a task on that runtime and the caller waits for its answer, so a task is
//!   never cancelled half-way: a caller that goes away leaves the statement to finish, and
//!   a transaction whose closure panics drops its connection (PostgreSQL rolls it back)
//!   rather than returning it to the pool inside an open transaction.
//! - **Durability**: a write is answered once its transaction has committed, with
//!   `synchronous_commit` on (checked at open), so the store's group commit has nothing left
//!   to wait for.
//! - **Atomicity and races**: a batch is one transaction; `update_and_fetch` and
//!   `compare_and_swap` are decided by PostgreSQL (row lock, conditional statement), and a
//!   two-tree transaction runs `SERIALIZABLE`, again from the start on a serialization
//!   failure or deadlock, so two processes on one database never both win.
//! - **Schema**: versioned migrations (`storage/migrations/NNNN_*.sql`) applied at open
//!   inside a transaction holding an advisory lock, so concurrent starts apply each once.
//! - **Unavailability**: a connection or server failure is [`StorageError::Unavailable`]
//!   (503 to clients); the pool reconnects on its own when the server is back.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::{Batch, Bytes, Iter, Tx, TxError, TxFailure, TxFailureKind, TxOutcome, TxTree};
use crate::{Result, StorageError};

/// The migrations, in order; each runs once, in one transaction.
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("../../migrations/0001_trees.sql"))];

/// The tree names a store opens.
const TREES: &[&str] = &["records", "logs", "seq", "meta"];

/// Rows read per page of a scan: small first (most scans stop early), larger after.
const FIRST_PAGE: i64 = 64;
const PAGE: i64 = 1024;

/// How many times a transaction is run again after a serialization failure or a deadlock.
const TX_TRIES: usize = 64;

struct Shared {
    rt: Mutex<Option<tokio::runtime::Runtime>>,
    handle: tokio::runtime::Handle,
    pool: Pool,
    /// How long each commit took (`/metrics` and the benches).
    commits: Arc<crate::timings::Timings>,
    /// The connection holding the one-server lock ([`Pg::hold_for_one_server`]).
    server_lock: Mutex<Option<tokio_postgres::Client>>,
    /// Where the sections' advisory locks are taken ([`Pg::advisory`]).
    config: tokio_postgres::Config,
    /// The connection holding this server's sections' advisory locks: one for them all
    /// (a try-lock never waits on it), opened again when it breaks.
    sections: tokio::sync::Mutex<Option<(Arc<tokio_postgres::Client>, i32)>>,
    /// How long a caller waits for a task's answer before it is 503 (45 s; shorter in tests).
    answer_wait_ms: std::sync::atomic::AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.pool.close();
        // Dropped wherever the store is, an async context included.
        if let Some(rt) = self.rt.lock().unwrap_or_else(|e| e.into_inner()).take() {
            rt.shutdown_background();
        }
    }
}

/// What [`Pg::advisory`] does with an advisory lock: take or give back, exclusive or
/// shared (shared holders exclude only an exclusive one).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Advisory {
    Take,
    Give,
    TakeShared,
    GiveShared,
}

/// An advisory lock held by a connection of its own ([`Pg::advisory_wait`]); dropping it
/// closes the connection, which gives the lock back.
pub(crate) struct HeldLock {
    _client: tokio_postgres::Client,
    conn: tokio::task::JoinHandle<std::result::Result<(), tokio_postgres::Error>>,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// A PostgreSQL database holding a store.
#[derive(Clone)]
pub(crate) struct Pg(Arc<Shared>);

fn db_error(e: tokio_postgres::Error) -> StorageError {
    if e.is_closed() || e.as_db_error().is_none() {
        return StorageError::Unavailable(e.to_string());
    }
    match e.code() {
        Some(c)
            if *c == SqlState::ADMIN_SHUTDOWN
                || *c == SqlState::CRASH_SHUTDOWN
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS
                || *c == SqlState::READ_ONLY_SQL_TRANSACTION
                || *c == SqlState::QUERY_CANCELED
                || *c == SqlState::LOCK_NOT_AVAILABLE
                || *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED =>
        {
            // A standby after a failover, a statement past its timeout, or a conflict that
            // kept recurring: the request may be sent again.
            StorageError::Unavailable(e.to_string())
        }
        Some(c) if *c == SqlState::DISK_FULL => {
            StorageError::Io(std::io::Error::from(std::io::ErrorKind::StorageFull))
        }
        _ => StorageError::Database(
            e.as_db_error()
                .map_or_else(|| e.to_string(), |d| d.to_string()),
        ),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> StorageError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => db_error(e),
        other => StorageError::Unavailable(other.to_string()),
    }
}

/// A serialization failure or deadlock: the transaction is run again.
fn retryable(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    })
}

fn table(tree: &str) -> String {
    format!("fleetops_{tree}")
}

impl Pg {
    /// Connects to `url` (a `postgres://` URL), checks that commits are synchronous, and
    /// applies the migrations this build has that the database lacks.
    pub(crate) fn open(url: &str, max_connections: usize) -> Result<Self> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StorageError::Config(format!("[database] url: {e}")))?;
        // A database that stops answering (a black-holed network) is 503 within seconds,
        // not a request held for TCP's two hours; and the server ends a session whose client
        // vanished within about 25 s, with the advisory locks it held.
        config
            .connect_timeout(Duration::from_secs(5))
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(Duration::from_secs(20))
            .options(
                "-c statement_timeout=30000 -c lock_timeout=10000 \
                 -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3",
            );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fleetops-pg")
            .enable_all()
            .build()?;
        let mgr = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(max_connections.max(2))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StorageError::Config(format!("[database]: {e}")))?;
        let pg = Pg(Arc::new(Shared {
            handle: rt.handle().clone(),
            rt: Mutex::new(Some(rt)),
            pool,
            commits: Arc::default(),
            server_lock: Mutex::new(None),
            config,
            sections: tokio::sync::Mutex::new(None),
            answer_wait_ms: std::sync::atomic::AtomicU64::new(45_000),
        }));
        pg.migrate()?;
        Ok(pg)
    }

    /// Takes the database for this server alone (`among_nodes` false) or for it among the
    /// nodes sharing it (true): a session advisory lock, exclusive or shared, held on a
    /// connection of its own (not the pool's) for as long as the engine is open. So a second
    /// lone server, a lone server beside nodes, and a node beside a lone server are refused
    /// at start with [`StorageError::Locked`] rather than each keeping in memory what the
    /// others write. Released when the engine is dropped or the process ends.
    pub(crate) fn hold_for_one_server(&self, url: &str, among_nodes: bool) -> Result<()> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StorageError::Config(format!("[database] url: {e}")))?;
        let client = self.run(async move {
            let (client, conn) = config.connect(NoTls).await.map_err(db_error)?;
            tokio::spawn(conn);
            let take = |shared: bool| {
                let client = &client;
                async move {
                    let sql = if shared {
                        "SELECT pg_try_advisory_lock_shared(7245118002)"
                    } else {
                        "SELECT pg_try_advisory_lock(7245118002)"
                    };
                    let row = client.query_one(sql, &[]).await.map_err(db_error)?;
                    Ok::<bool, StorageError>(row.get::<_, bool>(0))
                }
            };
            if among_nodes {
                if !take(true).await? {
                    return Err(StorageError::Locked(
                        "the database, held by a fleetops server without [bus] url (a lone \
                         server takes its database alone: stop it, or give it the nodes' [bus] \
                         url, see docs/scaling.md)"
                            .into(),
                    ));
                }
            } else if !take(false).await? {
                // Shared holders are nodes; an exclusive one is another lone server.
                let nodes = take(true).await?;
                return Err(StorageError::Locked(if nodes {
                    "the database, shared by fleetops nodes: this server has no [bus] url \
                     (is FLEETOPS_BUS_URL missing?), and a node without the bus would run \
                     beside them without their sections, fences and cache bounds; give it the \
                     nodes' [bus] url, see docs/scaling.md"
                        .into()
                } else {
                    "the database, held by another fleetops server (several servers on one \
                     database are nodes: give each [bus] url, see docs/scaling.md)"
                        .into()
                }));
            }
            Ok(client)
        })?;
        *self.0.server_lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
        Ok(())
    }

    /// Tries `op` on advisory lock `key` on the sections' connection: whether it was taken
    /// (given back). Never waits for the lock. A session lock stacks, so every take that
    /// answered `true` is given back once. When the connection breaks, every lock on it is
    /// released by PostgreSQL; what was written under one is still fenced by its section's
    /// counter ([`crate::sections`]).
    ///
    /// The statement runs to its end whatever becomes of its caller; a lock taken for a
    /// caller that stopped waiting is given back at once, so no lock outlives its taker.
    pub(crate) fn advisory(
        &self,
        key: i64,
        op: Advisory,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.advisory_task(key, op, move |r| tx.send(r));
        async move {
            match tokio::time::timeout(Duration::from_secs(45), rx).await {
                Ok(Ok(r)) => r,
                _ => Err(StorageError::Unavailable(
                    "the database did not answer in time".into(),
                )),
            }
        }
    }

    /// Waits in PostgreSQL's queue for advisory lock `key`, on a connection of its own, for
    /// at most `within`: the connection, whose session holds the lock until it is dropped
    /// (closing it gives the lock back). Waiters are served in turn, so a server whose tries
    /// keep missing (another server takes the lock again and again) still gets it.
    pub(crate) async fn advisory_wait(
        &self,
        key: i64,
        within: Duration,
    ) -> Result<Option<HeldLock>> {
        let config = self.0.config.clone();
        let task = self.0.handle.spawn(async move {
            let (client, conn) = config.connect(NoTls).await.map_err(db_error)?;
            let conn = tokio::spawn(conn);
            let ms = within.as_millis().max(1).to_string();
            client
                .batch_execute(&format!("SET statement_timeout = {ms}"))
                .await
                .map_err(db_error)?;
            match client
                .query_one("SELECT pg_advisory_lock($1)", &[&key])
                .await
            {
                Ok(_) => Ok(Some(HeldLock {
                    _client: client,
                    conn,
                })),
                // Not granted in time.
                Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
                    conn.abort();
                    Ok(None)
                }
                Err(e) => {
                    conn.abort();
                    Err(db_error(e))
                }
            }
        });
        match tokio::time::timeout(within + Duration::from_secs(10), task).await {
            Ok(Ok(r)) => r,
            _ => Err(StorageError::Unavailable(
                "the database did not answer in time".into(),
            )),
        }
    }

    /// [`Pg::advisory`] for a synchronous caller.
    pub(crate) fn advisory_blocking(&self, key: i64, op: Advisory) -> Result<bool> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.advisory_task(key, op, move |r| tx.send(r).map_err(|e| e.0));
        let limit = Duration::from_millis(
            self.0
                .answer_wait_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let wait = || match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(_) => Err(StorageError::Unavailable(
                "the database did not answer in time".into(),
            )),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }

    /// Runs `op` on the engine's runtime and hands its answer to `answer`, which gives it
    /// back when the caller is gone: then a lock it took is given back.
    fn advisory_task(
        &self,
        key: i64,
        op: Advisory,
        answer: impl FnOnce(Result<bool>) -> std::result::Result<(), Result<bool>> + Send + 'static,
    ) {
        let statement = self.advisory_statement(key, op);
        let give_back = match op {
            Advisory::Take => Some(self.advisory_statement(key, Advisory::Give)),
            Advisory::TakeShared => Some(self.advisory_statement(key, Advisory::GiveShared)),
            Advisory::Give | Advisory::GiveShared => None,
        };
        self.0.handle.spawn(async move {
            let r = statement.await;
            if let Err(Ok(true)) = answer(r)
                && let Some(g) = give_back
            {
                let _ = g.await;
            }
        });
    }

    fn advisory_statement(
        &self,
        key: i64,
        op: Advisory,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let shared = self.0.clone();
        async move {
            let client = {
                let mut slot = shared.sections.lock().await;
                match slot.as_ref() {
                    Some((c, _)) if !c.is_closed() => c.clone(),
                    old => {
                        let old_pid = old.map(|(_, pid)| *pid);
                        let (client, conn) =
                            shared.config.connect(NoTls).await.map_err(db_error)?;
                        tokio::spawn(conn);
                        let pid: i32 = client
                            .query_one("SELECT pg_backend_pid()", &[])
                            .await
                            .map_err(db_error)?
                            .get(0);
                        // The broken connection's session may still be alive on the server
                        // (a half-open TCP connection) holding this server's locks: ended.
                        if let Some(old) = old_pid {
                            let _ = client
                                .query_one("SELECT pg_terminate_backend($1)", &[&old])
                                .await;
                        }
                        let client = Arc::new(client);
                        *slot = Some((client.clone(), pid));
                        client
                    }
                }
            };
            let sql = match op {
                Advisory::Take => "SELECT pg_try_advisory_lock($1)",
                Advisory::Give => "SELECT pg_advisory_unlock($1)",
                Advisory::TakeShared => "SELECT pg_try_advisory_lock_shared($1)",
                Advisory::GiveShared => "SELECT pg_advisory_unlock_shared($1)",
            };
            let row = client.query_one(sql, &[&key]).await.map_err(db_error)?;
            Ok(row.get::<_, bool>(0))
        }
    }

    pub(crate) fn commit_timings(&self) -> Arc<crate::timings::Timings> {
        self.0.commits.clone()
    }

    /// Runs `fut` to completion on the engine's runtime; the caller awaits its answer
    /// without holding a thread. A caller that stops waiting does not cancel it.
    fn run_async<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> impl Future<Output = Result<T>> + Send + 'static {
        let task = self.0.handle.spawn(fut);
        async move {
            // The statement's own timeouts end it well before this, as for `run`.
            match tokio::time::timeout(Duration::from_secs(45), task).await {
                Ok(Ok(out)) => out,
                Ok(Err(_)) => Err(StorageError::Unavailable("the database task ended".into())),
                Err(_) => Err(StorageError::Unavailable(
                    "the database did not answer in time".into(),
                )),
            }
        }
    }

    /// Runs `fut` to completion on the engine's runtime and waits for its answer.
    fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.0.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        // The statement's own timeouts end it well before this; a caller never waits
        // longer for an answer.
        let limit = Duration::from_millis(
            self.0
                .answer_wait_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let wait = || match rx.recv_timeout(limit) {
            Ok(out) => out,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(StorageError::Unavailable(
                "the database did not answer in time".into(),
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(StorageError::Unavailable("the database task ended".into()))
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }

    fn migrate(&self) -> Result<()> {
        let pool = self.0.pool.clone();
        self.run(async move {
            let mut c = pool.get().await.map_err(pool_error)?;
            let setting = c
                .query_one("SHOW synchronous_commit", &[])
                .await
                .map_err(db_error)?;
            let sync: String = setting.get(0);
            if sync == "off" {
                return Err(StorageError::Config(
                    "PostgreSQL has synchronous_commit = off: an answered write could be lost; \
                     turn it on for fleetops' database"
                        .into(),
                ));
            }
            let tx = c.transaction().await.map_err(db_error)?;
            // One starter at a time; the lock ends with the transaction.
            tx.execute("SELECT pg_advisory_xact_lock(7245118001)", &[])
                .await
                .map_err(db_error)?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS fleetops_schema (version integer PRIMARY KEY, \
                 applied_at timestamptz NOT NULL DEFAULT now())",
            )
            .await
            .map_err(db_error)?;
            let have: Option<i32> = tx
                .query_one("SELECT max(version) FROM fleetops_schema", &[])
                .await
                .map_err(db_error)?
                .get(0);
            let have = have.unwrap_or(0);
            let newest = MIGRATIONS.last().map_or(0, |m| m.0);
            if have > newest {
                return Err(StorageError::Config(format!(
                    "the database's schema is version {have}, newer than this build's \
                     {newest}: run the newer fleetops"
                )));
            }
            for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > have) {
                tx.batch_execute(sql).await.map_err(db_error)?;
                tx.execute(
                    "INSERT INTO fleetops_schema (version) VALUES ($1)",
                    &[version],
                )
                .await
                .map_err(db_error)?;
                tracing::info!(version, "database schema migrated");
            }
            tx.commit().await.map_err(db_error)?;
            Ok(())
        })
    }

    pub(crate) fn tree(&self, name: &str) -> Result<PgTree> {
        if !TREES.contains(&name) {
            return Err(StorageError::Config(format!("no tree named {name}")));
        }
        Ok(PgTree {
            pg: self.clone(),
            table: Arc::from(table(name)),
        })
    }

    /// Bytes the store's tables take in the database.
    pub(crate) fn size(&self) -> Result<u64> {
        let pool = self.0.pool.clone();
        self.run(async move {
            let c = pool.get().await.map_err(pool_error)?;
            let mut total = 0i64;
            for t in TREES {
                let row = c
                    .query_one(
                        "SELECT pg_total_relation_size($1::text::regclass)",
                        &[&table(t)],
                    )
                    .await
                    .map_err(db_error)?;
                total += row.get::<_, i64>(0);
            }
            Ok(total.max(0) as u64)
        })
    }
}

/// One tree's table.
#[derive(Clone)]
pub(crate) struct PgTree {
    pg: Pg,
    table: Arc<str>,
}

/// A tree's writes: the last value of each key (`None`: removed), in key order, so that
/// concurrent writers lock rows in one order and never deadlock on each other.
type Writes = std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// Upserts and deletes, each as one statement over arrays.
async fn write_all(
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

fn bound_sql(b: &Bound<Vec<u8>>, op_incl: &str, op_excl: &str, n: usize) -> Option<String> {
    match b {
        Bound::Included(_) => Some(format!("k {op_incl} ${n}")),
        Bound::Excluded(_) => Some(format!("k {op_excl} ${n}")),
        Bound::Unbounded => None,
    }
}

fn bound_key(b: &Bound<Vec<u8>>) -> Option<Vec<u8>> {
    match b {
        Bound::Included(k) | Bound::Excluded(k) => Some(k.clone()),
        Bound::Unbounded => None,
    }
}

/// The smallest key above every key starting with `prefix` (`None`: there is none).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
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
struct Scan {
    tree: PgTree,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    front: VecDeque<(Bytes, Bytes)>,
    back: VecDeque<(Bytes, Bytes)>,
    front_pages: u32,
    back_pages: u32,
    /// Nothing is left between `lo` and `hi` beyond the buffers.
    drained: bool,
    failed: bool,
}

impl Scan {
    fn fetch(&mut self, forward: bool) -> Result<()> {
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

    fn step(&mut self, forward: bool) -> Option<Result<(Bytes, Bytes)>> {
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
    fn pool(&self) -> (Pool, Arc<str>) {
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

    fn get_statement(
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

/// A pooled connection inside an open transaction. Dropped anywhere (a caller that stopped
/// waiting leaves the task's answer, and this with it, unclaimed; a closure that panicked),
/// it is closed, never returned to the pool still inside the transaction, where the next
/// autocommit statement would run in it and be lost with it. [`InTx::release`] gives it back
/// once its transaction ended.
struct InTx(Option<deadpool_postgres::Object>);

impl InTx {
    /// Back to the pool: its transaction committed or rolled back.
    fn release(mut self) {
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
static BEGIN_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A connection inside `BEGIN ISOLATION LEVEL SERIALIZABLE`, given back to the pool only
/// after its commit or rollback ([`InTx`]).
struct PgTx {
    pg: Pg,
    client: Mutex<Option<InTx>>,
}

impl PgTx {
    fn begin(pg: &Pg) -> Result<Self> {
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

    fn take(&self) -> Option<InTx> {
        self.client.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn put_back(&self, c: InTx) {
        *self.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// Reads one key inside the transaction; `Retry` on a serialization failure.
    fn get(&self, table: &str, key: &[u8]) -> Result<Option<Bytes>, TxFailure> {
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
    fn get_many(
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
    fn commit(&self, writes: Vec<(Arc<str>, Writes)>) -> Result<bool> {
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

    fn rollback(&self) {
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
struct Side<'a> {
    conn: &'a PgTx,
    table: Arc<str>,
    writes: Mutex<Writes>,
}

impl Side<'_> {
    fn take(&self) -> Writes {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A caller that stops waiting while its transaction's `BEGIN` is under way (the answer
    /// comes after the deadline) leaves no connection inside that transaction in the pool:
    /// every connection the pool hands out afterwards runs its statements in autocommit.
    #[test]
    fn a_transaction_its_caller_gave_up_on_never_returns_to_the_pool() {
        crate::testing::on(crate::testing::Engine::Postgres, || {
            let dir = tempfile::tempdir().unwrap();
            let url = crate::testing::database(dir.path()).url;
            let pg = Pg::open(&url, 2).unwrap();
            let t = pg.tree("records").unwrap();
            pg.0.answer_wait_ms
                .store(300, std::sync::atomic::Ordering::SeqCst);
            BEGIN_DELAY_MS.store(1_000, std::sync::atomic::Ordering::SeqCst);
            let out = t.transaction(&t, |_, _| Ok::<(), TxError<()>>(()));
            match out {
                Err(TxOutcome::Storage(StorageError::Unavailable(_))) => {}
                Ok(()) => panic!("answered in time"),
                Err(TxOutcome::Storage(e)) => panic!("{e}"),
                Err(_) => panic!("aborted"),
            }
            BEGIN_DELAY_MS.store(0, std::sync::atomic::Ordering::SeqCst);
            pg.0.answer_wait_ms
                .store(45_000, std::sync::atomic::Ordering::SeqCst);
            // The abandoned task finishes its begin, and its answer goes unclaimed.
            std::thread::sleep(Duration::from_millis(1_500));
            // Both of the pool's connections at once: neither is inside a transaction (in
            // one, `now()` would be the old BEGIN's time).
            let pool = pg.0.pool.clone();
            let stale = pg
                .run(async move {
                    let a = pool.get().await.map_err(pool_error)?;
                    let b = pool.get().await.map_err(pool_error)?;
                    let mut stale = 0;
                    for c in [&a, &b] {
                        let r = c
                            .query_one(
                                "SELECT now() < statement_timestamp() - interval '500 ms'",
                                &[],
                            )
                            .await
                            .map_err(db_error)?;
                        stale += usize::from(r.get::<_, bool>(0));
                    }
                    Ok(stale)
                })
                .unwrap();
            assert_eq!(
                stale, 0,
                "a pooled connection is still inside the transaction"
            );
        });
    }

    #[test]
    fn a_prefix_ends_past_every_key_that_starts_with_it() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }
}
