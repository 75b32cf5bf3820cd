//! Persistence for fleetops: typed records and indexes on a key-value engine (`engine`:
//! sled, embedded, by default; PostgreSQL with `[database] url`), webhook payloads in
//! append-only segment files beside sled (`spool`; on PostgreSQL they are records), blobs
//! through `object_store` (local files or S3).
//!
//! Owns every key layout (`keys`) and codec (`codec`); nothing outside this crate sees an
//! engine's type. The rest of the code calls typed operations (`accounts`, `devices`,
//! `sessions`, `pipeline`, `scm`, ...), written once for both engines and passing the same
//! tests. Four trees: `records` (every record with its secondary indexes and list entries,
//! so a record and what points at it are one atomic batch), `logs` (log chunks, kept apart so
//! record scans stay small), `seq` (id counters; a gap after a crash is harmless) and `meta`
//! (values generated once, and markers).
//!
//! Invariants a change must keep:
//! - Durability: sled fsyncs on its own only every ~500 ms, so every acknowledged write is
//!   followed by [`Store::durable`], a group commit shared by all writers waiting at that
//!   moment. Webhook deliveries are the exception: on sled an intake batch is durable once
//!   its payloads and its journal record are fsynced in the payload log, and [`Store::open`]
//!   replays that journal for whatever sled lost. On PostgreSQL every write returns once its
//!   transaction committed (payloads included), and `durable` has nothing left to wait for.
//! - Uniqueness and state transitions are decided by the single-writer actors before they
//!   write; a write here is one atomic batch. What two processes on one database could both
//!   get past their actors' checks is decided here: a write's claims on unique keys
//!   (`Writes::claim`) and its guards on what a key holds (`Writes::guard`: a delivery still
//!   queued, a run as its writer read it, an idempotency key free, the organization's quota
//!   mark unmoved) fail it whole with [`StorageError::Conflict`]; a delivery's id is claimed
//!   per delivery ([`Store::claim_deliveries`]). On PostgreSQL every write is one
//!   serializable transaction with its list counters. Any other storage error is a 5xx (503
//!   while the database is unreachable).
//! - A listed record's list entries and counters (`lists`) are written in the record's own
//!   batch, under one lock, so a page reads only its entries and one counter.
//! - Every write holds the backup gate (`gate`) shared, so a backup holding it exclusive
//!   copies one moment of the store; the read-through caches (`cache`) are forgotten around
//!   every write of their records.
//! - Opening a store builds, once and behind a marker in `meta`, what a store written by an
//!   older version lacks (list indexes, the resolved alerts' expiry index).
//!
//! Tested by unit tests beside each module (those that open a store run on both engines:
//! `testing`), and by the API tests in `tests/api/` (run again on PostgreSQL by
//! `tests/postgres/`), each of
//! which ends by checking every list index and counter against the records
//! (`Store::verify_lists`), as the crash harness does after its last restart.

pub mod accounts;
pub mod alerts;
pub mod backup;
pub mod blobs;
mod cache;
#[cfg(test)]
mod testing;
/// The test harness names this crate as its users do.
#[cfg(test)]
extern crate self as fleetops_storage;
mod clock;
mod codec;
pub mod devices;
mod engine;
pub mod enrollment;
pub mod failpoints;
mod flush;
mod gate;
mod keys;
pub mod leases;
mod lists;
pub mod log_seal;
pub mod meta;
pub mod migrate;
pub mod model;
pub mod perms;
pub mod pipeline;
pub mod purge;
pub mod rollouts;
pub mod scm;
pub mod sections;
pub mod segments;
pub mod sessions;
mod spool;
pub mod states;
mod text_filter;
pub mod timings;

use std::path::Path;
use std::sync::Arc;

pub use blobs::BlobStore;
pub use model::*;
pub use states::{
    AlertEvent, AlertState, DeliveryOutcome, DeploymentStatus, InstallationState, IntegrationType,
    RolloutState, RolloutStatus, RunStatus, Severity, UpdateState, ValidationStatus,
};

/// Errors from the storage layer. Callers map them to 5xx; domain conflicts are decided by the
/// single-writer actors before they write, never by catching a storage error.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("the data directory is in use by another fleetops process ({0})")]
    Locked(String),
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("a stored record could not be decoded: {0}")]
    Corrupt(String),
    #[error("the durable flush failed")]
    FlushFailed,
    #[error("blob store: {0}")]
    Blob(#[from] object_store::Error),
    #[error("configuration: {0}")]
    Config(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The database refused a statement.
    #[error("database: {0}")]
    Database(String),
    /// The database cannot be reached (down, restarting, out of connections): the request
    /// may be retried.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// A stored log chunk cannot be read back as it was written (its checksum does not match,
    /// or its segment is gone from the object store); says which.
    #[error("{0}")]
    Damaged(String),
    /// A write's claim on a unique key (an e-mail, a slug, a name and version) lost to another
    /// writer's: nothing of the write was applied. Says what was taken.
    #[error("{0}")]
    Conflict(String),
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

impl StorageError {
    /// The write failed because its file system is full.
    pub fn is_disk_full(&self) -> bool {
        let io = match self {
            StorageError::Io(e) => Some(e),
            StorageError::Sled(sled::Error::Io(e)) => Some(e),
            _ => None,
        };
        io.is_some_and(|e| e.kind() == std::io::ErrorKind::StorageFull)
    }
}

/// `[database]`: where the store's records live. An empty `url` keeps them in sled under the
/// data directory (the default); `postgres://user:password@host:port/dbname` puts them in
/// that PostgreSQL database (`FLEETOPS_DATABASE_URL`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    pub url: String,
    /// Connections the pool may open.
    pub max_connections: usize,
    /// Lets several servers open one PostgreSQL database at once. Not a key of its own: the
    /// binary sets it when `[bus] url` names a bus (several nodes); without one a server takes
    /// the database alone, and a second one is refused at start, as is a server without a
    /// bus on a database nodes share and a node on one a lone server holds. On a shared
    /// database the read-through caches serve an entry at most [`SHARED_CACHE_MAX_AGE`].
    #[serde(skip)]
    pub shared: bool,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            max_connections: 32,
            shared: false,
        }
    }
}

impl DatabaseConfig {
    /// Whether the records live in PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        !self.url.is_empty()
    }
}

/// How long a server sharing its database with others serves a cached record after reading
/// it: the bound on how late a revocation made on another server is seen here when the bus
/// lost its announcement.
pub const SHARED_CACHE_MAX_AGE: std::time::Duration = std::time::Duration::from_millis(500);

/// One open data directory. Cheap to clone; all clones share the same sled instance and
/// group-commit flusher.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// The data directory.
    dir: std::path::PathBuf,
    db: engine::Db,
    /// Records and their secondary indexes share one tree so that a record and its index
    /// entries are written in one atomic `Batch`.
    records: gate::Tree,
    /// Log chunks: the bulk of the data, apart from the records so record scans stay small.
    logs: gate::Tree,
    /// Monotonic id counters (gaps after a crash are harmless).
    seq: gate::Tree,
    /// Server-wide settings generated once (secrets) and markers.
    meta: gate::Tree,
    /// The group commit of an engine whose writes are not durable as they return (sled).
    flusher: Option<flush::GroupCommit>,
    /// Writes hold it shared; a backup holds it exclusive.
    gate: gate::Gate,
    cache: cache::Caches,
    /// Held while a batch that changes listed records works out and applies its list
    /// entries and counters, so concurrent writers never lose a count.
    list_lock: std::sync::Mutex<()>,
    /// Deliveries this open wrote again from the intake's journal (`/metrics`).
    recovered: std::sync::atomic::AtomicU64,
    /// Webhook payloads, outside sled.
    spool: spool::Spool,
    /// Test-run ids taken from their counter a block at a time and not handed out yet
    /// (`Store::new_run`).
    run_ids: std::sync::Mutex<std::ops::Range<u64>>,
    /// Projects of deleted organizations (being purged, or purged since this open): writers
    /// refuse them ([`Store::project_retired`]). Loaded at open from the deletion markers.
    retired: dashmap::DashSet<u64>,
    /// Readers and seals of sessions' log chunks ([`log_seal`]).
    log_pins: log_seal::LogPins,
    /// Whether other servers write the same database ([`DatabaseConfig::shared`]).
    shared: bool,
    /// Each section's counter as this server last wrote or read it ([`sections`]).
    sections: dashmap::DashMap<String, Option<engine::Bytes>>,
    /// Where sealed log chunks go, once the binary has attached a blob store.
    segments: std::sync::OnceLock<segments::Segments>,
    /// The data directory's lock file, held while open, where the engine does not lock it
    /// itself (sled does).
    dir_lock: std::sync::OnceLock<std::fs::File>,
}

/// Which engine keeps the records of the data directory `dir`: `dir/engine` says, written at
/// its first open (and by `admin migrate`). Opening it with the other engine is refused, so a
/// configuration that lost its `[database] url`, or gained one, never starts an empty store
/// beside the real one.
pub(crate) fn engine_marker(dir: &Path, want: &str) -> Result<()> {
    let path = dir.join("engine");
    match std::fs::read_to_string(&path) {
        Ok(have) if have.trim() == want => Ok(()),
        Ok(have) => Err(StorageError::Config(format!(
            "{} keeps its records in {} but the configuration names {want}: set [database] url \
             (FLEETOPS_DATABASE_URL) to match{}",
            dir.display(),
            have.trim(),
            if want == "postgres" {
                ", or move an embedded store over with `fleetops admin migrate`"
            } else {
                ""
            }
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if want == "postgres" && dir.join("db").exists() {
                return Err(StorageError::Config(format!(
                    "{} holds an embedded store: move it over with `fleetops admin migrate \
                     --to <url>` first",
                    dir.display()
                )));
            }
            write_engine_marker(dir, want)
        }
        Err(e) => Err(e.into()),
    }
}

/// Records `engine` as the data directory's, durably.
pub(crate) fn write_engine_marker(dir: &Path, engine: &str) -> Result<()> {
    let tmp = dir.join("engine.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(engine.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join("engine"))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Takes `dir/lock` exclusively, or [`StorageError::Locked`] while another process holds it.
fn lock_dir(dir: &Path) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StorageError::Locked(dir.display().to_string())),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

impl Store {
    /// Opens a store its test just dropped, on the test's engine: sled's own flusher thread
    /// (or PostgreSQL's closing session) may hold the lock a moment after the last handle goes.
    #[cfg(test)]
    pub(crate) fn reopen(dir: &Path) -> Self {
        let mut tries = 0;
        loop {
            let db = testing::database(dir);
            match Store::open_on(dir, std::time::Duration::ZERO, &db) {
                Err(StorageError::Locked(_)) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                #[allow(clippy::unwrap_used)]
                other => break other.unwrap(),
            }
        }
    }

    /// Opens (or creates) the sled database under `dir/db`. Fails with [`StorageError::Locked`]
    /// when another process holds it, without touching anything.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, std::time::Duration::ZERO)
    }

    /// As [`Store::open`], with the group-commit delay of `[storage] commit_delay_us`.
    pub fn open_with(dir: &Path, commit_delay: std::time::Duration) -> Result<Self> {
        Self::open_on(dir, commit_delay, &DatabaseConfig::default())
    }

    /// Opens the store `database` names: sled under `dir/db`, or a PostgreSQL database
    /// (migrated to this build's schema). The data directory holds the webhook payload log
    /// either way.
    pub fn open_on(
        dir: &Path,
        commit_delay: std::time::Duration,
        database: &DatabaseConfig,
    ) -> Result<Self> {
        perms::restrict_umask();
        create_dir_durable(dir)?;
        if database.is_postgres() {
            if !database.url.starts_with("postgres://")
                && !database.url.starts_with("postgresql://")
            {
                return Err(StorageError::Config(
                    "[database] url must be empty (sled) or a postgres:// URL".into(),
                ));
            }
            // The data directory (the webhook payload log) is still this process's alone.
            let lock = lock_dir(dir)?;
            engine_marker(dir, "postgres")?;
            let pg = engine::pg::Pg::open(&database.url, database.max_connections)?;
            pg.hold_for_one_server(&database.url, database.shared)?;
            let store = Self::assemble(dir, engine::Db::Pg(pg), None, database.shared)?;
            let _ = store.inner.dir_lock.set(lock);
            if database.shared {
                store.inner.cache.set_max_age(SHARED_CACHE_MAX_AGE);
            }
            return Ok(store);
        }
        engine_marker(dir, "sled")?;
        let db = sled::Config::new()
            .path(dir.join("db"))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    StorageError::Locked(dir.display().to_string())
                }
                sled::Error::Io(io) if io.to_string().contains("lock") => {
                    StorageError::Locked(dir.display().to_string())
                }
                other => StorageError::Sled(other),
            })?;
        let flusher = flush::GroupCommit::start(db.clone(), commit_delay);
        Self::assemble(dir, engine::Db::Sled(db), Some(flusher), false)
    }

    fn assemble(
        dir: &Path,
        db: engine::Db,
        flusher: Option<flush::GroupCommit>,
        shared: bool,
    ) -> Result<Self> {
        let gate = gate::Gate::default();
        let records = gate::Tree::new(db.open_tree("records")?, gate.clone());
        let logs = gate::Tree::new(db.open_tree("logs")?, gate.clone());
        let seq = gate::Tree::new(db.open_tree("seq")?, gate.clone());
        let meta = gate::Tree::new(db.open_tree("meta")?, gate.clone());
        let spool = spool::Spool::open(&dir.join("webhook-payloads"))?;
        let store = Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                db,
                records,
                logs,
                seq,
                meta,
                flusher,
                gate,
                cache: cache::Caches::default(),
                list_lock: std::sync::Mutex::new(()),
                recovered: 0.into(),
                spool,
                run_ids: std::sync::Mutex::new(0..0),
                retired: dashmap::DashSet::new(),
                log_pins: log_seal::LogPins::default(),
                shared,
                sections: dashmap::DashMap::new(),
                segments: std::sync::OnceLock::new(),
                dir_lock: std::sync::OnceLock::new(),
            }),
        };
        store.load_retired()?;
        store.ensure_lists()?;
        store.ensure_alert_expiry()?;
        store.drop_legacy_queue()?;
        let recovered = store.recover_deliveries()?;
        store
            .inner
            .recovered
            .store(recovered as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(store)
    }

    /// Builds the list indexes of a store written before they existed (once; a marker in
    /// `meta` says they are kept from then on).
    fn ensure_lists(&self) -> Result<()> {
        const MARK: &[u8] = b"lists-format";
        // 2: last-seen seconds became lists with entries (1 kept only their counts).
        if self.inner.meta.get(MARK)?.as_deref() == Some(b"2".as_slice()) {
            return Ok(());
        }
        let n = self.rebuild_lists(&listed_families())?;
        self.inner.meta.insert(MARK, b"2".as_slice())?;
        self.inner.db.flush()?;
        if n > 0 {
            tracing::info!(records = n, "list indexes built");
        }
        Ok(())
    }

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
    fn named_trees(&self) -> [(&'static str, &gate::Tree); 4] {
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

    fn next_id(&self, counter: &str) -> Result<u64> {
        self.next_ids(counter, 1)
    }

    /// Advances `counter` by `n`; returns the first of the `n` ids.
    fn next_ids(&self, counter: &str, n: u64) -> Result<u64> {
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

    fn get<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        match self.inner.records.get(key)? {
            Some(v) => codec::decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// [`Store::get`] for a caller on an async task (a request's handler): on PostgreSQL the
    /// round trip is awaited, so no runtime thread is held while the database answers.
    async fn get_async<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        match self.inner.records.get_async(key).await? {
            Some(v) => codec::decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The records at `keys` that exist, in order: one read (one round trip on a network
    /// database) for a page of records.
    fn get_many<T: serde::de::DeserializeOwned>(&self, keys: &[Vec<u8>]) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(keys.len());
        for v in self.inner.records.get_many(keys)?.into_iter().flatten() {
            out.push(codec::decode(&v)?);
        }
        Ok(out)
    }

    fn get_id(&self, key: &[u8]) -> Result<Option<u64>> {
        Ok(self
            .inner
            .records
            .get(key)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes))
    }

    fn apply(&self, w: Writes) -> Result<()> {
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
    fn apply_shared(&self, w: Writes) -> Result<()> {
        let lists = !w.1.is_empty();
        self.apply_decided(lists, |_| Ok((w.clone(), ())))
    }

    /// On a shared engine: applies the writes `decide` makes from what it reads, inside one
    /// serializable transaction with those reads; `decide` runs again when another writer's
    /// commit conflicts. For a decision that must not fail a whole batch (which of several
    /// deliveries claims its id). `lists`: whether the writes may change lists (this
    /// process's list writers then take turns, as on the embedded store, so only another
    /// process's commit makes the transaction run again).
    fn apply_decided<T>(
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

    fn list_guard(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .list_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records under `prefix`, newest (highest key) first.
    fn scan_rev<T: serde::de::DeserializeOwned>(&self, prefix: &[u8]) -> Result<Vec<T>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(prefix).rev() {
            let (_, v) = kv?;
            out.push(codec::decode(&v)?);
        }
        Ok(out)
    }

    fn scan_keys(&self, prefix: &[u8]) -> Result<Vec<engine::Bytes>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(prefix) {
            out.push(kv?.0);
        }
        Ok(out)
    }
}

/// Reads of the records tree made with a decided write ([`Store::apply_decided`]).
struct Reads<'a> {
    many: &'a ReadMany<'a>,
}

type ReadMany<'a> = dyn Fn(&[Vec<u8>]) -> TxResult<Vec<Option<engine::Bytes>>> + 'a;

impl Reads<'_> {
    /// The values of `keys` in their order, in one read (one round trip on a network
    /// database).
    fn get_many(&self, keys: &[Vec<u8>]) -> TxResult<Vec<Option<engine::Bytes>>> {
        (self.many)(keys)
    }
}
type TxResult<T> = std::result::Result<T, engine::TxError<StorageError>>;

/// Writes accumulated by a typed operation, applied atomically by [`Store::apply`], with the
/// listed records whose list entries `apply` brings in step.
#[derive(Clone)]
struct Writes(Ops, Vec<lists::Relist>);

/// A batch's inserts and removals in the order made (a later one of a key wins, as in
/// `sled::Batch`), kept as a list so a caller can take back the ones made since a mark.
#[derive(Default, Clone)]
struct Ops(Vec<(engine::Bytes, Op)>);

/// A condition on what a key holds (`None`: nothing), decided with the write.
type Check = std::sync::Arc<dyn Fn(Option<&[u8]>) -> bool + Send + Sync>;

#[derive(Clone)]
enum Op {
    Set(engine::Bytes),
    Remove,
    /// Remove while the key holds this value (as stored, or as set earlier in the batch): an
    /// index entry goes only with the record it points at.
    RemoveIf(engine::Bytes),
    /// Set, unless the key holds another value: then the whole write fails with
    /// [`StorageError::Conflict`] saying what was taken. Decided by the engine, atomically
    /// with the write, so two processes never both claim one key.
    Claim(engine::Bytes, &'static str),
    /// No write: the whole write fails with [`StorageError::Conflict`] unless what the key
    /// holds (at this point of the batch) passes the check. A conditional update: the
    /// record is still what its writer read.
    Guard(Check, &'static str),
}

impl Ops {
    fn insert<K: Into<engine::Bytes>, V: Into<engine::Bytes>>(&mut self, key: K, value: V) {
        self.0.push((key.into(), Op::Set(value.into())));
    }
    fn remove<K: Into<engine::Bytes>>(&mut self, key: K) {
        self.0.push((key.into(), Op::Remove));
    }
    fn remove_if<K: Into<engine::Bytes>, V: Into<engine::Bytes>>(&mut self, key: K, value: V) {
        self.0.push((key.into(), Op::RemoveIf(value.into())));
    }
    /// The writes, with each conditional removal and claim decided against what the key
    /// holds at that point of the batch, read through `read`.
    fn resolve<E: From<StorageError>>(
        self,
        read: impl Fn(&[u8]) -> std::result::Result<Option<engine::Bytes>, E>,
    ) -> std::result::Result<Vec<(engine::Bytes, Option<engine::Bytes>)>, E> {
        let mut out = Vec::with_capacity(self.0.len());
        let mut pending: std::collections::HashMap<engine::Bytes, Option<engine::Bytes>> =
            std::collections::HashMap::new();
        let conditional = self
            .0
            .iter()
            .any(|(_, op)| matches!(op, Op::RemoveIf(_) | Op::Claim(..) | Op::Guard(..)));
        for (k, op) in self.0 {
            let holds =
                |k: &engine::Bytes,
                 pending: &std::collections::HashMap<_, Option<engine::Bytes>>| {
                    match pending.get(k) {
                        Some(v) => Ok(v.clone()),
                        None => read(k),
                    }
                };
            let write = match op {
                Op::Set(v) => Some(v),
                Op::Remove => None,
                Op::RemoveIf(expected) => {
                    if holds(&k, &pending)?.as_ref() != Some(&expected) {
                        continue;
                    }
                    None
                }
                Op::Claim(v, what) => {
                    if holds(&k, &pending)?.is_some_and(|h| h != v) {
                        return Err(StorageError::Conflict(what.to_string()).into());
                    }
                    Some(v)
                }
                Op::Guard(check, what) => {
                    if !check(holds(&k, &pending)?.as_deref()) {
                        return Err(StorageError::Conflict(what.to_string()).into());
                    }
                    continue;
                }
            };
            if conditional {
                pending.insert(k.clone(), write.clone());
            }
            out.push((k, write));
        }
        Ok(out)
    }

    /// The batch, with each conditional removal and claim decided against what the store
    /// holds. Its writer must be the only one of such keys (the read is not under a lock):
    /// the embedded store's, whose process is its only writer.
    fn into_batch(self, store: &Store) -> Result<engine::Batch> {
        let writes = self.resolve(|k| store.inner.records.get(k))?;
        Ok(engine::Batch(writes))
    }
}

/// How far a [`Writes`] had got: what [`Writes::rollback`] returns it to.
#[derive(Debug, Clone, Copy)]
pub struct WritesMark(usize, usize);

impl Writes {
    fn new() -> Self {
        Self(Ops::default(), Vec::new())
    }
    fn mark(&self) -> WritesMark {
        WritesMark(self.0.0.len(), self.1.len())
    }
    /// Takes back every write made since `m`.
    fn rollback(&mut self, m: WritesMark) {
        self.0.0.truncate(m.0);
        self.1.truncate(m.1);
    }
    fn is_empty(&self) -> bool {
        self.0.0.is_empty() && self.1.is_empty()
    }
    /// Writes a record kept in lists.
    fn put_listed<T: serde::Serialize + lists::Listed>(
        &mut self,
        key: Vec<u8>,
        value: &T,
    ) -> Result<()> {
        self.1.push(lists::Relist {
            key: key.clone(),
            new: Some(value.entries()),
            old: lists::old_entries::<T>,
        });
        self.put(key, value)
    }
    /// Deletes a record kept in lists.
    fn delete_listed<T: lists::Listed>(&mut self, key: Vec<u8>) {
        self.1.push(lists::Relist {
            key: key.clone(),
            new: None,
            old: lists::old_entries::<T>,
        });
        self.delete(key);
    }
    fn put<T: serde::Serialize>(&mut self, key: Vec<u8>, value: &T) -> Result<()> {
        self.0.insert(key, codec::encode(value)?);
        Ok(())
    }
    fn put_id(&mut self, key: Vec<u8>, id: u64) {
        self.0.insert(key, id.to_be_bytes().to_vec());
    }
    /// Writes `key` unless it holds another value: then the write fails with
    /// [`StorageError::Conflict`]`(what)`.
    fn claim(&mut self, key: Vec<u8>, value: Vec<u8>, what: &'static str) {
        self.0.0.push((key.into(), Op::Claim(value.into(), what)));
    }
    fn claim_id(&mut self, key: Vec<u8>, id: u64, what: &'static str) {
        self.claim(key, id.to_be_bytes().to_vec(), what);
    }
    /// Fails the whole write with [`StorageError::Conflict`]`(what)` unless what `key` holds
    /// when the write is applied passes `check`.
    fn guard(
        &mut self,
        key: Vec<u8>,
        what: &'static str,
        check: impl Fn(Option<&[u8]>) -> bool + Send + Sync + 'static,
    ) {
        self.0
            .0
            .push((key.into(), Op::Guard(std::sync::Arc::new(check), what)));
    }
    /// Fails the whole write with [`StorageError::Conflict`]`(what)` unless the record at
    /// `key` is still `read` (as decoded: an older encoding of the same value passes).
    fn guard_record<T>(&mut self, key: Vec<u8>, read: &T, what: &'static str)
    where
        T: serde::de::DeserializeOwned + PartialEq + Clone + Send + Sync + 'static,
    {
        let read = read.clone();
        self.guard(key, what, move |v| {
            v.and_then(|v| codec::decode::<T>(v).ok()).as_ref() == Some(&read)
        });
    }
    fn delete(&mut self, key: Vec<u8>) {
        self.0.remove(key);
    }
}

/// `create_dir_all` whose new directories' entries are durable (power loss, not only kill
/// -9): each directory it made is synced in its parent, up to the first that existed.
pub(crate) fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    // A relative path's last parent is "", which names the working directory.
    fn parent(p: &Path) -> Option<&Path> {
        p.parent().map(|q| {
            if q.as_os_str().is_empty() {
                Path::new(".")
            } else {
                q
            }
        })
    }
    let mut existing = dir;
    while !existing.exists() {
        match parent(existing) {
            Some(p) => existing = p,
            None => break,
        }
    }
    if existing == dir {
        return Ok(());
    }
    perms::create_dirs(dir)?;
    let mut d = parent(dir);
    while let Some(p) = d {
        std::fs::File::open(p)?.sync_all()?;
        if p == existing {
            break;
        }
        d = parent(p);
    }
    Ok(())
}

/// Every listed record family: its key prefix and how to read a stored record's entries.
type Family = (Vec<u8>, fn(&[u8]) -> Result<Vec<lists::Entry>>);

fn listed_families() -> Vec<Family> {
    use lists::old_entries;
    vec![
        (keys::all_devices_prefix(), old_entries::<Device>),
        (keys::all_sessions_prefix(), old_entries::<Session>),
        (keys::delivery_prefix(), old_entries::<Delivery>),
        (keys::all_runs_prefix(), old_entries::<TestRun>),
        (keys::all_configs_prefix(), old_entries::<Configuration>),
        (keys::all_deployments_prefix(), old_entries::<Deployment>),
        (keys::all_alerts_prefix(), old_entries::<Alert>),
    ]
}

#[cfg(test)]
mod dir_tests {
    /// Nested new directories are made (and synced) whatever part of the path existed.
    #[test]
    fn durable_dirs_are_made_at_any_depth_and_again_harmlessly() {
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a/b/c");
        super::create_dir_durable(&deep).unwrap();
        assert!(deep.is_dir());
        super::create_dir_durable(&deep).unwrap();
        super::create_dir_durable(&t.path().join("a/d")).unwrap();
        assert!(t.path().join("a/d").is_dir());
        // A relative path whose first part is new.
        let rel =
            std::path::PathBuf::from(format!("target-durable-dir-test-{}/x", std::process::id()));
        super::create_dir_durable(&rel).unwrap();
        assert!(rel.is_dir());
        std::fs::remove_dir_all(rel.parent().unwrap()).unwrap();
    }
}
