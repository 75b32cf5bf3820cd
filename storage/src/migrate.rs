//! Copying an embedded (sled) store into an empty PostgreSQL database, for
//! `fleetops admin migrate --to postgres://...`: every tree key by key (records with their
//! indexes and list entries, log chunks and their indexes, id counters, generated secrets and
//! markers), so the server started on the database answers as the embedded one did and new
//! ids continue where the old ones stopped. The webhook payload log, the local blobs and the
//! secrets key stay in the data directory, which the migrated server keeps using.

use serde::Serialize;

use crate::{Result, StorageError, Store, engine};

/// Keys copied per transaction.
const BATCH_KEYS: usize = 5_000;

/// What a migration copied.
#[derive(Debug, Serialize)]
pub struct MigrateReport {
    /// Keys copied, by tree.
    pub keys: std::collections::BTreeMap<&'static str, u64>,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}

/// Brings the PostgreSQL database at `url` to this build's schema (what a start does before
/// anything else), writing no records.
pub fn prepare_postgres(url: &str) -> Result<()> {
    engine::pg::Pg::open(url, 2).map(drop)
}

impl Store {
    /// Copies this store into the empty PostgreSQL database at `url` (migrated to this
    /// build's schema first), then checks each table holds as many keys as were copied. The
    /// store must not be written meanwhile (the server stopped: the caller holds its lock).
    pub fn copy_to_postgres(&self, url: &str) -> Result<MigrateReport> {
        if self.on_postgres() {
            return Err(StorageError::Config(
                "this store is already on PostgreSQL".into(),
            ));
        }
        let pg = engine::pg::Pg::open(url, 4)?;
        let trees = self.named_trees();
        for (name, _) in trees {
            if pg.tree(name)?.scan_prefix(b"").next().is_some() {
                return Err(StorageError::Config(
                    "the database already holds fleetops records: migrate into an empty one".into(),
                ));
            }
        }
        let mut report = MigrateReport {
            keys: Default::default(),
            bytes: 0,
        };
        for (name, from) in trees {
            let to = pg.tree(name)?;
            let mut batch = engine::Batch::default();
            let mut n = 0u64;
            for kv in from.scan_prefix(b"") {
                let (k, v) = kv?;
                report.bytes += (k.len() + v.len()) as u64;
                batch.insert(k, v);
                n += 1;
                if batch.0.len() == BATCH_KEYS {
                    to.apply_batch(std::mem::take(&mut batch))?;
                }
            }
            to.apply_batch(batch)?;
            let there = to.scan_prefix(b"").count() as u64;
            if there != n {
                return Err(StorageError::Corrupt(format!(
                    "{name}: {n} keys copied but the database holds {there}"
                )));
            }
            report.keys.insert(name, n);
        }
        // From now on the data directory is the database's: a start without the URL is
        // refused instead of serving the stale embedded copy.
        crate::write_engine_marker(&self.inner.dir, "postgres")?;
        Ok(report)
    }
}
