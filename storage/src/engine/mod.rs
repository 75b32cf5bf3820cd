//! The key-value engines under the store: sled (embedded, the default) and PostgreSQL. Every
//! typed operation of this crate is written once against [`Tree`], [`Batch`], [`Iter`] and
//! [`Tree::transaction`]; an engine only stores ordered byte keys and values in four named
//! trees (`records`, `logs`, `seq`, `meta`) and applies batches and transactions atomically.
//!
//! What an engine must give, and the tests beside each module check on it:
//! - ordered keys, prefix and range scans both ways, read lazily;
//! - a batch of one tree applied atomically;
//! - a transaction over two trees that sees its own writes, is serializable, and is run
//!   again from the start when the engine reports a conflict (so its closure must be
//!   repeatable);
//! - `update_and_fetch` and `compare_and_swap` decided by the engine, not by this process.
//!
//! Values are [`Bytes`], an immutable byte string that clones cheaply (sled's `IVec`, used by
//! both engines as a plain container; no engine type leaves this crate).

pub(crate) mod pg;
pub(crate) mod sled_engine;

use crate::{Result, StorageError};

/// An immutable byte string, cheap to clone.
pub(crate) type Bytes = sled::IVec;

/// Inserts and removals of one tree, applied together; a later write of a key wins.
#[derive(Default)]
pub(crate) struct Batch(pub(crate) Vec<(Bytes, Option<Bytes>)>);

impl Batch {
    pub(crate) fn insert<K: Into<Bytes>, V: Into<Bytes>>(&mut self, key: K, value: V) {
        self.0.push((key.into(), Some(value.into())));
    }
    pub(crate) fn remove<K: Into<Bytes>>(&mut self, key: K) {
        self.0.push((key.into(), None));
    }
}

/// Keys and values in key order (or reversed), read lazily.
pub(crate) struct Iter(Box<dyn DoubleEndedIterator<Item = Result<(Bytes, Bytes)>> + Send>);

impl Iter {
    pub(crate) fn new(
        it: impl DoubleEndedIterator<Item = Result<(Bytes, Bytes)>> + Send + 'static,
    ) -> Self {
        Self(Box::new(it))
    }
    pub(crate) fn keys(self) -> impl DoubleEndedIterator<Item = Result<Bytes>> + Send {
        self.0.map(|kv| kv.map(|(k, _)| k))
    }
}

impl Iterator for Iter {
    type Item = Result<(Bytes, Bytes)>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next()
    }
}

impl DoubleEndedIterator for Iter {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.0.next_back()
    }
}

/// Why a transaction's step failed: the engine's conflict or error (the transaction is run
/// again or fails), or the closure's own abort.
pub(crate) enum TxError<E> {
    Abort(E),
    Engine(TxFailure),
}

/// An engine's failure inside a transaction: carried out of the closure by `?`.
pub(crate) struct TxFailure(pub(crate) TxFailureKind);

pub(crate) enum TxFailureKind {
    Sled(sled::transaction::UnabortableTransactionError),
    /// The engine found a conflict: the transaction runs again from the start.
    Retry,
    Storage(StorageError),
}

impl From<StorageError> for TxError<StorageError> {
    fn from(e: StorageError) -> Self {
        TxError::Abort(e)
    }
}

impl<E> From<TxFailure> for TxError<E> {
    fn from(f: TxFailure) -> Self {
        TxError::Engine(f)
    }
}

/// How a transaction ended when it did not commit.
pub(crate) enum TxOutcome<E> {
    Abort(E),
    Storage(StorageError),
}

/// One tree inside a transaction, as an engine gives it.
pub(crate) trait TxTree {
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>, TxFailure>;
    /// The values of `keys`, in their order: one round trip on a network database.
    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, TxFailure> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), TxFailure>;
    fn remove(&self, key: &[u8]) -> Result<(), TxFailure>;
}

/// One tree inside a transaction: reads see the transaction's own writes.
pub(crate) struct Tx<'a>(pub(crate) &'a dyn TxTree);

impl Tx<'_> {
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, TxFailure> {
        self.0.get(key.as_ref())
    }
    pub(crate) fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>, TxFailure> {
        self.0.get_many(keys)
    }
    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<(), TxFailure> {
        self.0.insert(key.as_ref(), value.as_ref())
    }
    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> Result<(), TxFailure> {
        self.0.remove(key.as_ref())
    }
}

/// One named tree of an engine.
#[derive(Clone)]
pub(crate) enum Tree {
    Sled(sled::Tree),
    Pg(pg::PgTree),
}

impl Tree {
    pub(crate) fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        match self {
            Tree::Sled(t) => Ok(t.get(key)?),
            Tree::Pg(t) => t.get(key),
        }
    }

    /// [`Tree::get`] for a caller on an async task: on a network database the caller waits
    /// without holding a thread; sled answers at once.
    pub(crate) async fn get_async(&self, key: &[u8]) -> Result<Option<Bytes>> {
        match self {
            Tree::Sled(t) => Ok(t.get(key)?),
            Tree::Pg(t) => t.get_async(key).await,
        }
    }

    /// The values of `keys`, in their order (`None`: absent): one round trip on a network
    /// database.
    pub(crate) fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Bytes>>> {
        match self {
            Tree::Sled(t) => keys.iter().map(|k| Ok(t.get(k)?)).collect(),
            Tree::Pg(t) => t.get_many(keys),
        }
    }

    pub(crate) fn contains_key(&self, key: &[u8]) -> Result<bool> {
        match self {
            Tree::Sled(t) => Ok(t.contains_key(key)?),
            Tree::Pg(t) => t.contains_key(key),
        }
    }

    pub(crate) fn range(
        &self,
        from: std::ops::Bound<Vec<u8>>,
        to: std::ops::Bound<Vec<u8>>,
    ) -> Iter {
        match self {
            Tree::Sled(t) => sled_engine::iter(t.range((from, to))),
            Tree::Pg(t) => t.range(from, to),
        }
    }

    pub(crate) fn scan_prefix(&self, prefix: &[u8]) -> Iter {
        match self {
            Tree::Sled(t) => sled_engine::iter(t.scan_prefix(prefix)),
            Tree::Pg(t) => t.scan_prefix(prefix),
        }
    }

    pub(crate) fn insert(&self, key: &[u8], value: &[u8]) -> Result<()> {
        match self {
            Tree::Sled(t) => t.insert(key, value).map(|_| ()).map_err(Into::into),
            Tree::Pg(t) => t.insert(key, value),
        }
    }

    pub(crate) fn remove(&self, key: &[u8]) -> Result<()> {
        match self {
            Tree::Sled(t) => t.remove(key).map(|_| ()).map_err(Into::into),
            Tree::Pg(t) => t.remove(key),
        }
    }

    pub(crate) fn apply_batch(&self, batch: Batch) -> Result<()> {
        match self {
            Tree::Sled(t) => sled_engine::apply_batch(t, batch),
            Tree::Pg(t) => t.apply_batch(batch),
        }
    }

    /// Sets the key to what `f` makes of its value (`None`: removed), atomically against
    /// every other writer of the engine; returns the new value.
    pub(crate) fn update_and_fetch(
        &self,
        key: &[u8],
        f: impl FnMut(Option<&[u8]>) -> Option<Vec<u8>>,
    ) -> Result<Option<Bytes>> {
        match self {
            Tree::Sled(t) => Ok(t.update_and_fetch(key, f)?),
            Tree::Pg(t) => t.update_and_fetch(key, f),
        }
    }

    /// Sets the key to `new` if it holds `old` (`None`: absent); `Ok(false)` when it did
    /// not.
    pub(crate) fn compare_and_swap(
        &self,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        match self {
            Tree::Sled(t) => Ok(t.compare_and_swap(key, old, new)?.is_ok()),
            Tree::Pg(t) => t.compare_and_swap(key, old, new),
        }
    }

    /// Runs `f` over this tree and `other` as one serializable transaction (again from the
    /// start on a conflict), committing what it wrote unless it aborts.
    pub(crate) fn transaction<A, E>(
        &self,
        other: &Tree,
        f: impl Fn(&Tx, &Tx) -> Result<A, TxError<E>>,
    ) -> Result<A, TxOutcome<E>> {
        match (self, other) {
            (Tree::Sled(a), Tree::Sled(b)) => sled_engine::transaction(a, b, f),
            (Tree::Pg(a), Tree::Pg(b)) => a.transaction(b, f),
            _ => Err(TxOutcome::Storage(StorageError::Config(
                "a transaction across two engines".into(),
            ))),
        }
    }
}

/// The engine behind a store: its trees and what concerns it whole.
#[derive(Clone)]
pub(crate) enum Db {
    Sled(sled::Db),
    Pg(pg::Pg),
}

impl Db {
    pub(crate) fn open_tree(&self, name: &str) -> Result<Tree> {
        match self {
            Db::Sled(db) => Ok(Tree::Sled(db.open_tree(name)?)),
            Db::Pg(db) => Ok(Tree::Pg(db.tree(name)?)),
        }
    }

    /// Makes everything written so far durable (a no-op where every commit already is).
    pub(crate) fn flush(&self) -> Result<()> {
        match self {
            Db::Sled(db) => db.flush().map(|_| ()).map_err(Into::into),
            // Every commit is durable when it returns.
            Db::Pg(_) => Ok(()),
        }
    }

    /// Bytes the engine keeps: sled's files on the local disk, or the PostgreSQL tables' size
    /// on the database server.
    pub(crate) fn size_on_disk(&self) -> Result<u64> {
        match self {
            Db::Sled(db) => Ok(db.size_on_disk()?),
            Db::Pg(db) => db.size(),
        }
    }
}
