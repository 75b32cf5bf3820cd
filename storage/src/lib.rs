//! Persistence for fleetops: typed records and indexes on a key-value engine (`engine`:
//! sled, embedded, by default; PostgreSQL with `[database] url`), webhook payloads in
//! append-only segment files beside sled (`webhooks::payload_log`; on PostgreSQL they are
//! records), blobs through `object_store` (local files or S3).
//!
//! Owns every key layout (`keys`) and codec (`codec`); nothing outside this crate sees an
//! engine's type. The rest of the code calls typed operations (`accounts`, `devices`,
//! `sessions`, `pipeline`, `webhooks`, ...), written once for both engines and passing the same
//! tests. Four trees: `records` (every record with its secondary indexes and list entries,
//! so a record and what points at it are one atomic batch), `logs` (log chunks, kept apart so
//! record scans stay small), `seq` (id counters; a gap after a crash is harmless) and `meta`
//! (values generated once, and markers).
//!
//! Records are postcard-encoded; times are Unix milliseconds (UTC). Field order is part of
//! the format: append new fields only with a format bump in `codec`.
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
//! `testing`), and by the API tests in `tests/api/` (each on sled and on PostgreSQL), each of
//! which ends by checking every list index and counter against the records
//! (`Store::verify_lists`), as the crash harness does after its last restart.

// One folder per family of the API, each with its `records` (the persisted types) and its
// typed operations: accounts (users, organizations, projects, keys), devices (and
// enrollment), sessions (log chunks, seals, segments), pipeline (capsules, configurations,
// deployments, rollouts), webhooks (deliveries, the payload log, installations, runs), alerts.
pub mod accounts;
pub mod alerts;
pub mod devices;
pub mod pipeline;
pub mod sessions;
pub mod webhooks;

// What every family is written with.
mod access;
mod cache;
mod clock;
mod codec;
mod engine;
mod flush;
mod gate;
mod keys;
mod lists;
mod open;
mod uploads;
mod writes;

// The store as a whole: backups, blobs, failure points, leases and sections (several nodes),
// markers, migration between engines, file modes, purges, states, commit timings.
pub mod backup;
pub mod blobs;
pub mod failpoints;
pub mod leases;
pub mod meta;
pub mod migrate;
pub mod perms;
pub mod purge;
pub mod sections;
pub mod states;
pub mod timings;

#[cfg(test)]
mod testing;
/// The test harness names this crate as its users do.
#[cfg(test)]
extern crate self as fleetops_storage;

use std::path::Path;
use std::sync::Arc;

pub use blobs::BlobStore;
pub(crate) use open::{Family, create_dir_durable, listed_families, write_engine_marker};
pub use writes::WritesMark;
use writes::{Reads, TxResult, Writes};
// The records of every family, each in its family's `records`, named from the crate root.
pub use accounts::records::*;
pub use alerts::records::*;
pub use devices::records::*;
pub use pipeline::records::*;
pub use sessions::records::*;
pub use states::{
    AlertEvent, AlertState, DeliveryOutcome, DeploymentStatus, InstallationState, IntegrationType,
    RolloutState, RolloutStatus, RunStatus, Severity, UpdateState, ValidationStatus,
};
pub use uploads::*;
pub use webhooks::records::*;

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
    payload_log: webhooks::payload_log::PayloadLog,
    /// Test-run ids taken from their counter a block at a time and not handed out yet
    /// (`Store::new_run`).
    run_ids: std::sync::Mutex<std::ops::Range<u64>>,
    /// Projects of deleted organizations (being purged, or purged since this open): writers
    /// refuse them ([`Store::project_retired`]). Loaded at open from the deletion markers.
    retired: dashmap::DashSet<u64>,
    /// Readers and seals of sessions' log chunks ([`sessions::seal`]).
    log_pins: sessions::seal::LogPins,
    /// Whether other servers write the same database ([`DatabaseConfig::shared`]).
    shared: bool,
    /// Each section's counter as this server last wrote or read it ([`sections`]).
    sections: dashmap::DashMap<String, Option<engine::Bytes>>,
    /// Where sealed log chunks go, once the binary has attached a blob store.
    segments: std::sync::OnceLock<sessions::segments::Segments>,
    /// The data directory's lock file, held while open, where the engine does not lock it
    /// itself (sled does).
    dir_lock: std::sync::OnceLock<std::fs::File>,
}
