//! [`DiskSpace`]: the data directory's free bytes, and the floor below which requests that
//! would write to it are refused.
//!
//! Below `[storage] min_free_bytes`, the edge answers such requests 507 with the contract's
//! envelope before they reach an actor, so nothing is half-written; reads, exports and
//! deletes (which free space) go on. The free space is read with `statvfs` at most every
//! `RECHECK`, so a request costs an atomic load. A write that still meets a full disk (the
//! floor at 0, or another process filling it) fails inside its transaction and is answered
//! 507 too (`Error::InsufficientStorage` from an `ENOSPC`), never acknowledged.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fleetops_storage::Store;

use crate::error::{Error, Result};

/// How stale the free-space figure may be.
const RECHECK: Duration = Duration::from_millis(250);

pub struct DiskSpace {
    store: Store,
    floor: u64,
    free: AtomicU64,
    checked: Mutex<Option<Instant>>,
}

impl DiskSpace {
    pub(crate) fn new(store: Store, floor: u64) -> Self {
        Self {
            store,
            floor,
            free: AtomicU64::new(u64::MAX),
            checked: Mutex::new(None),
        }
    }

    /// Free bytes on the data directory's file system, at most `RECHECK` old.
    pub fn free_bytes(&self) -> u64 {
        let due = {
            let mut at = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            let due = at.is_none_or(|t| t.elapsed() >= RECHECK);
            if due {
                *at = Some(Instant::now());
            }
            due
        };
        if due {
            match self.store.free_bytes() {
                Ok(n) => self.free.store(n, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the data directory's free space failed")
                }
            }
        }
        self.free.load(Ordering::Relaxed)
    }

    /// The configured floor (`[storage] min_free_bytes`).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// 507 when the free space is below the floor.
    pub fn check_write(&self) -> Result<()> {
        let free = self.free_bytes();
        if self.floor > 0 && free < self.floor {
            return Err(Error::InsufficientStorage(format!(
                "The data directory has {free} bytes free, below the configured minimum of {} \
                 ([storage] min_free_bytes): writes are refused until space is freed; reads, \
                 exports and deletes still work",
                self.floor
            )));
        }
        Ok(())
    }
}
