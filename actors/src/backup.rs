//! Backups taken while serving: one at a time, on the blocking pool, into an absolute path on
//! the server's host outside the data directory. Writes wait while the copy is made (see
//! `fleetops_storage::backup`).

use std::path::PathBuf;
use std::sync::Arc;

use fleetops_storage::Store;
pub use fleetops_storage::backup::BackupReport;

use crate::clock::Clock;
use crate::{Error, Result};

#[derive(Clone)]
pub struct BackupsHandle {
    pub(crate) store: Store,
    /// The local blob directory (None when blobs live in S3).
    pub(crate) blobs: Option<PathBuf>,
    pub(crate) clock: Clock,
    running: Arc<tokio::sync::Mutex<()>>,
}

/// Why a server on PostgreSQL makes no backup of its own.
pub const POSTGRES_BACKUP: &str = "This server keeps its records in PostgreSQL: back them up \
     with the database's own tools (pg_dump, base backups, replicas), and the data directory's \
     webhook-payloads folder and blobs beside them; fleetops' backup copies an embedded store";

impl BackupsHandle {
    pub(crate) fn new(store: Store, blobs: Option<PathBuf>, clock: Clock) -> Self {
        Self {
            store,
            blobs,
            clock,
            running: Arc::default(),
        }
    }

    /// A consistent copy of the data directory at `to` (422 for a destination that cannot
    /// take it, 409 while another backup runs).
    pub async fn take(&self, to: &str) -> Result<BackupReport> {
        if self.store.on_postgres() {
            return Err(Error::Conflict(POSTGRES_BACKUP.into()));
        }
        let to = PathBuf::from(to);
        fleetops_storage::backup::check_destination(&to, self.store.dir(), self.blobs.as_deref())
            .map_err(|why| Error::unprocessable("to", why))?;
        // Held by the copy itself: a caller that hangs up does not free the slot while the
        // copy goes on.
        let one = self
            .running
            .clone()
            .try_lock_owned()
            .map_err(|_| Error::Conflict("A backup is already running".into()))?;
        let (store, blobs, now) = (self.store.clone(), self.blobs.clone(), self.clock.now_ms());
        let report = crate::off_thread(move || {
            let _one = one;
            Ok(store.backup_to(&to, blobs.as_deref(), now)?)
        })
        .await?;
        tracing::info!(
            path = %report.path,
            keys = report.keys,
            files = report.files,
            paused_ms = report.paused_ms,
            "backup taken"
        );
        Ok(report)
    }
}
