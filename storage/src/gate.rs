//! The backup gate: every write to sled holds it shared, a backup holds it exclusive while it
//! copies the trees, so the copy is one moment of the store (sled's own iterators are not
//! snapshots: a scan running beside a batch can see part of it).
//!
//! [`Tree`] wraps a sled tree and offers its writes only through the gate, so a write that
//! forgot it does not compile. A writer that also takes the store's list lock takes the gate
//! first and passes the guard in (`*_held`): taking it after the list lock would let a
//! backup's wait stall every other listed writer on the plain mutex.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sled::IVec;
use sled::transaction::{ConflictableTransactionResult, TransactionResult, TransactionalTree};

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

/// A sled tree whose writes go through the gate.
#[derive(Clone)]
pub(crate) struct Tree {
    tree: sled::Tree,
    gate: Gate,
}

impl Tree {
    pub(crate) fn new(tree: sled::Tree, gate: Gate) -> Self {
        Self { tree, gate }
    }

    /// A transaction over this tree and `other`, under a gate guard the caller already holds.
    pub(crate) fn transaction_held<A, E>(
        &self,
        other: &Tree,
        _held: &RwLockReadGuard<'_, ()>,
        f: impl Fn(&(TransactionalTree, TransactionalTree)) -> ConflictableTransactionResult<A, E>,
    ) -> TransactionResult<A, E> {
        use sled::Transactional;
        (&self.tree, &other.tree).transaction(f)
    }

    /// A batch under a gate guard the caller already holds.
    pub(crate) fn apply_batch_held(
        &self,
        batch: sled::Batch,
        _held: &RwLockReadGuard<'_, ()>,
    ) -> sled::Result<()> {
        self.tree.apply_batch(batch)
    }

    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        self.tree.get(key)
    }

    pub(crate) fn contains_key(&self, key: impl AsRef<[u8]>) -> sled::Result<bool> {
        self.tree.contains_key(key)
    }

    pub(crate) fn range<K: AsRef<[u8]>, R: std::ops::RangeBounds<K>>(
        &self,
        range: R,
    ) -> sled::Iter {
        self.tree.range(range)
    }

    pub(crate) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> sled::Iter {
        self.tree.scan_prefix(prefix)
    }

    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl Into<IVec>,
    ) -> sled::Result<Option<IVec>> {
        let _g = self.gate.shared();
        self.tree.insert(key, value)
    }

    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> sled::Result<Option<IVec>> {
        let _g = self.gate.shared();
        self.tree.remove(key)
    }

    pub(crate) fn apply_batch(&self, batch: sled::Batch) -> sled::Result<()> {
        let _g = self.gate.shared();
        self.tree.apply_batch(batch)
    }

    pub(crate) fn update_and_fetch<V: Into<IVec>>(
        &self,
        key: impl AsRef<[u8]>,
        f: impl FnMut(Option<&[u8]>) -> Option<V>,
    ) -> sled::Result<Option<IVec>> {
        let _g = self.gate.shared();
        self.tree.update_and_fetch(key, f)
    }

    pub(crate) fn compare_and_swap<V1: AsRef<[u8]>, V2: Into<IVec>>(
        &self,
        key: impl AsRef<[u8]>,
        old: Option<V1>,
        new: Option<V2>,
    ) -> sled::Result<Result<(), sled::CompareAndSwapError>> {
        let _g = self.gate.shared();
        self.tree.compare_and_swap(key, old, new)
    }
}
