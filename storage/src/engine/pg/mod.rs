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
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("../../../migrations/0001_trees.sql"))];

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

mod advisory;
mod tree;
mod tx;

pub(crate) use advisory::{Advisory, HeldLock};
pub(crate) use tree::PgTree;
use tree::*;
use tx::*;

#[cfg(test)]
mod tests;
