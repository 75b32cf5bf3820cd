//! Leases: what lets one of several servers sharing a database decide something alone (a
//! rollout's controller), and keeps a server that lost its lease from deciding anyway.
//!
//! A lease is a record `{holder, epoch, until}` under its name. [`Store::take_lease`] takes
//! it when it is free or its time ran out (the epoch goes up by one), or extends it when the
//! caller holds it already (same epoch); another holder's running lease is left alone. The
//! take is a guarded write decided against the record as read, so two servers never both
//! take one lease.
//!
//! Fencing: a write made on the strength of a lease carries its [`Fence`]
//! ([`Writes::fence`](crate::Writes)), a guard that fails the whole write unless the lease
//! still has that holder and epoch. A server paused past its lease's end (a long GC-like
//! stall, a partition) whose lease another server took meanwhile has its writes refused with
//! [`StorageError::Conflict`]`("lease")`, so nothing is decided twice.

use serde::{Deserialize, Serialize};

use crate::{Result, StorageError, Store, Writes, codec, keys};

/// A lease as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The holding server's id (fresh at every start).
    pub holder: [u8; 16],
    /// Goes up by one each time another holder (or a fresh start) takes it.
    pub epoch: u64,
    /// Unix ms; after this anyone may take it.
    pub until: i64,
}

/// What a write made under a lease checks: the lease `name` still held by `holder` at
/// `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub holder: [u8; 16],
    pub epoch: u64,
}

impl Writes {
    /// Fails the whole write with [`StorageError::Conflict`]`("lease")` unless `fence`'s lease
    /// is still held by its holder at its epoch when the write is applied.
    pub(crate) fn fence(&mut self, fence: &Fence) {
        let (holder, epoch) = (fence.holder, fence.epoch);
        self.guard(keys::lease(&fence.name), "lease", move |v| {
            v.and_then(|v| codec::decode::<Lease>(v).ok())
                .is_some_and(|l| l.holder == holder && l.epoch == epoch)
        });
    }
}

impl Store {
    /// Takes or extends lease `name` for `holder` until `now + ttl_ms`: its fence while the
    /// caller holds it, `None` while another holder's lease runs (or another server took it
    /// in the same moment).
    pub fn take_lease(
        &self,
        name: &str,
        holder: [u8; 16],
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<Fence>> {
        let key = keys::lease(name);
        let read = self.inner.records.get(&key)?;
        let current = read.as_deref().map(codec::decode::<Lease>).transpose()?;
        let epoch = match current {
            Some(l) if l.holder == holder => l.epoch,
            Some(l) if l.until > now => return Ok(None),
            Some(l) => l.epoch + 1,
            None => 1,
        };
        let next = Lease {
            holder,
            epoch,
            until: now.saturating_add(ttl_ms),
        };
        let mut w = Writes::new();
        w.guard(key.clone(), "lease", move |v| v == read.as_deref());
        w.put(key, &next)?;
        match self.apply(w) {
            Ok(()) => Ok(Some(Fence {
                name: name.to_string(),
                holder,
                epoch,
            })),
            Err(StorageError::Conflict(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Gives back every lease `holder` holds, so other servers take them at once rather
    /// than when they run out (a server stopping): how many. Each is ended by a write
    /// guarded on the lease as read; one taken meanwhile by another is left alone.
    pub fn release_leases(&self, holder: [u8; 16], now: i64) -> Result<usize> {
        let mut released = 0;
        for kv in self.inner.records.scan_prefix(keys::lease_prefix()) {
            let (k, v) = kv?;
            let Ok(l) = codec::decode::<Lease>(&v) else {
                continue;
            };
            if l.holder != holder || l.until <= now {
                continue;
            }
            let mut w = Writes::new();
            w.guard(k.to_vec(), "lease", move |cur| cur == Some(&v[..]));
            w.put(k.to_vec(), &Lease { until: now, ..l })?;
            match self.apply(w) {
                Ok(()) => released += 1,
                Err(StorageError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(released)
    }

    /// The lease `name` as stored.
    pub fn lease(&self, name: &str) -> Result<Option<Lease>> {
        self.get(&keys::lease(name))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::testing::on_each_engine;

    const A: [u8; 16] = [1; 16];
    const B: [u8; 16] = [2; 16];

    fn one_holder_at_a_time_and_a_lapsed_lease_goes_to_the_next_with_a_new_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let a = store.take_lease("r/1", A, 1_000, 500).unwrap().unwrap();
        assert_eq!(a.epoch, 1);
        assert_eq!(store.take_lease("r/1", B, 1_200, 500).unwrap(), None);
        // A extends it: same epoch.
        assert_eq!(
            store.take_lease("r/1", A, 1_400, 500).unwrap(),
            Some(a.clone())
        );
        // Lapsed (A stopped renewing): B takes it, one epoch up.
        let b = store.take_lease("r/1", B, 1_901, 500).unwrap().unwrap();
        assert_eq!(b.epoch, 2);
        assert_eq!(store.lease("r/1").unwrap().unwrap().holder, B);
    }
    on_each_engine!(one_holder_at_a_time_and_a_lapsed_lease_goes_to_the_next_with_a_new_epoch);

    fn a_write_fenced_by_a_lease_that_moved_on_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let a = store.take_lease("r/1", A, 1_000, 500).unwrap().unwrap();
        let mut w = crate::Writes::new();
        w.fence(&a);
        w.put(b"x".to_vec(), &1u64).unwrap();
        store.apply(w).unwrap();
        let _b = store.take_lease("r/1", B, 2_000, 500).unwrap().unwrap();
        let mut w = crate::Writes::new();
        w.fence(&a);
        w.put(b"x".to_vec(), &2u64).unwrap();
        let r = store.apply(w);
        assert!(
            matches!(&r, Err(crate::StorageError::Conflict(w)) if w == "lease"),
            "{r:?}"
        );
        assert_eq!(store.get::<u64>(b"x").unwrap(), Some(1));
    }
    on_each_engine!(a_write_fenced_by_a_lease_that_moved_on_is_refused);

    fn released_leases_go_to_the_next_taker_at_once_with_a_new_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        store.take_lease("r/1", A, 1_000, 500).unwrap().unwrap();
        store.take_lease("r/2", A, 1_000, 500).unwrap().unwrap();
        store.take_lease("r/3", B, 1_000, 500).unwrap().unwrap();
        assert_eq!(store.release_leases(A, 1_100).unwrap(), 2);
        // Well before A's leases would have run out.
        let b = store.take_lease("r/1", B, 1_101, 500).unwrap().unwrap();
        assert_eq!(b.epoch, 2);
        assert!(store.take_lease("r/2", B, 1_101, 500).unwrap().is_some());
        // B's own lease stays B's.
        assert_eq!(store.take_lease("r/3", A, 1_101, 500).unwrap(), None);
    }
    on_each_engine!(released_leases_go_to_the_next_taker_at_once_with_a_new_epoch);
}
