//! The backup gate: every write to the store holds it shared, a backup holds it exclusive while it
//! copies the trees, so the copy is one moment of the store (sled's own iterators are not
//! snapshots: a scan running beside a batch can see part of it).
//!
//! [`Tree`] wraps an engine's tree and offers its writes only through the gate, so a write that
//! forgot it does not compile. A writer that also takes the store's list lock takes the gate
//! first and passes the guard in (`*_held`): taking it after the list lock would let a
//! backup's wait stall every other listed writer on the plain mutex.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::engine::{self, Batch, Bytes, Iter, Tx, TxError, TxOutcome};

#[derive(Clone, Default)]
pub(crate) struct Gate(Arc<RwLock<()>>);

impl Gate {
    /// Held by a write for as long as it applies. Never take it twice on one thread: a
    /// waiting backup would stop the second one (the lock prefers writers). A write that has
    /// to wait for a backup on an async worker thread hands the thread's other tasks to
    /// another worker first, so reads go on while writes wait.
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        match self.0.try_read() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let wait = || self.0.read().unwrap_or_else(|e| e.into_inner());
                match tokio::runtime::Handle::try_current() {
                    Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                        tokio::task::block_in_place(wait)
                    }
                    _ => wait(),
                }
            }
        }
    }

    /// Held by a backup while it copies: every write waits.
    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// An engine's tree whose writes go through the gate.
#[derive(Clone)]
pub(crate) struct Tree {
    tree: engine::Tree,
    gate: Gate,
}

fn owned(b: std::ops::Bound<&impl AsRef<[u8]>>) -> std::ops::Bound<Vec<u8>> {
    use std::ops::Bound;
    match b {
        Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl Tree {
    pub(crate) fn new(tree: engine::Tree, gate: Gate) -> Self {
        Self { tree, gate }
    }

    /// A transaction over this tree and `other`, under a gate guard the caller already holds.
    pub(crate) fn transaction_held<A, E>(
        &self,
        other: &Tree,
        _held: &RwLockReadGuard<'_, ()>,
        f: impl Fn(&Tx, &Tx) -> Result<A, TxError<E>>,
    ) -> Result<A, TxOutcome<E>> {
        self.tree.transaction(&other.tree, f)
    }

    /// A batch under a gate guard the caller already holds.
    pub(crate) fn apply_batch_held(
        &self,
        batch: Batch,
        _held: &RwLockReadGuard<'_, ()>,
    ) -> crate::Result<()> {
        self.tree.apply_batch(batch)
    }

    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> crate::Result<Option<Bytes>> {
        self.tree.get(key.as_ref())
    }

    pub(crate) async fn get_async(&self, key: &[u8]) -> crate::Result<Option<Bytes>> {
        self.tree.get_async(key).await
    }

    pub(crate) fn get_many(&self, keys: &[Vec<u8>]) -> crate::Result<Vec<Option<Bytes>>> {
        self.tree.get_many(keys)
    }

    pub(crate) fn contains_key(&self, key: impl AsRef<[u8]>) -> crate::Result<bool> {
        self.tree.contains_key(key.as_ref())
    }

    pub(crate) fn range<K: AsRef<[u8]>, R: std::ops::RangeBounds<K>>(&self, range: R) -> Iter {
        self.tree
            .range(owned(range.start_bound()), owned(range.end_bound()))
    }

    pub(crate) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Iter {
        self.tree.scan_prefix(prefix.as_ref())
    }

    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> crate::Result<()> {
        let _g = self.gate.shared();
        self.tree.insert(key.as_ref(), value.as_ref())
    }

    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> crate::Result<()> {
        let _g = self.gate.shared();
        self.tree.remove(key.as_ref())
    }

    pub(crate) fn apply_batch(&self, batch: Batch) -> crate::Result<()> {
        let _g = self.gate.shared();
        self.tree.apply_batch(batch)
    }

    pub(crate) fn update_and_fetch(
        &self,
        key: impl AsRef<[u8]>,
        f: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> crate::Result<Option<Bytes>> {
        let _g = self.gate.shared();
        self.tree.update_and_fetch(key.as_ref(), f)
    }

    /// Sets `key` to `new` if it holds `old`; `Ok(false)` when it did not.
    pub(crate) fn compare_and_swap(
        &self,
        key: impl AsRef<[u8]>,
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> crate::Result<bool> {
        let _g = self.gate.shared();
        self.tree.compare_and_swap(key.as_ref(), old, new)
    }
}
