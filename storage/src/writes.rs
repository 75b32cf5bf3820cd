//! [`Writes`]: one atomic batch of puts, deletes, claims and guards, with the list entries
//! its records move; and [`Reads`], what a decided write reads with it.

use super::*;

/// Reads of the records tree made with a decided write ([`Store::apply_decided`]).
pub(super) struct Reads<'a> {
    pub(super) many: &'a ReadMany<'a>,
}

pub(crate) type ReadMany<'a> = dyn Fn(&[Vec<u8>]) -> TxResult<Vec<Option<engine::Bytes>>> + 'a;

impl Reads<'_> {
    /// The values of `keys` in their order, in one read (one round trip on a network
    /// database).
    pub(super) fn get_many(&self, keys: &[Vec<u8>]) -> TxResult<Vec<Option<engine::Bytes>>> {
        (self.many)(keys)
    }
}
pub(crate) type TxResult<T> = std::result::Result<T, engine::TxError<StorageError>>;

/// Writes accumulated by a typed operation, applied atomically by [`Store::apply`], with the
/// listed records whose list entries `apply` brings in step.
#[derive(Clone)]
pub(crate) struct Writes(pub(crate) Ops, pub(crate) Vec<lists::Relist>);

/// A batch's inserts and removals in the order made (a later one of a key wins, as in
/// `sled::Batch`), kept as a list so a caller can take back the ones made since a mark.
#[derive(Default, Clone)]
pub(crate) struct Ops(pub(crate) Vec<(engine::Bytes, Op)>);

/// A condition on what a key holds (`None`: nothing), decided with the write.
type Check = std::sync::Arc<dyn Fn(Option<&[u8]>) -> bool + Send + Sync>;

#[derive(Clone)]
pub(super) enum Op {
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
    pub(super) fn insert<K: Into<engine::Bytes>, V: Into<engine::Bytes>>(
        &mut self,
        key: K,
        value: V,
    ) {
        self.0.push((key.into(), Op::Set(value.into())));
    }
    pub(super) fn remove<K: Into<engine::Bytes>>(&mut self, key: K) {
        self.0.push((key.into(), Op::Remove));
    }
    pub(super) fn remove_if<K: Into<engine::Bytes>, V: Into<engine::Bytes>>(
        &mut self,
        key: K,
        value: V,
    ) {
        self.0.push((key.into(), Op::RemoveIf(value.into())));
    }
    /// The writes, with each conditional removal and claim decided against what the key
    /// holds at that point of the batch, read through `read`.
    pub(super) fn resolve<E: From<StorageError>>(
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
    pub(super) fn into_batch(self, store: &Store) -> Result<engine::Batch> {
        let writes = self.resolve(|k| store.inner.records.get(k))?;
        Ok(engine::Batch(writes))
    }
}

/// How far a [`Writes`] had got: what [`Writes::rollback`] returns it to.
#[derive(Debug, Clone, Copy)]
pub struct WritesMark(usize, usize);

impl Writes {
    pub(super) fn new() -> Self {
        Self(Ops::default(), Vec::new())
    }
    pub(super) fn mark(&self) -> WritesMark {
        WritesMark(self.0.0.len(), self.1.len())
    }
    /// Takes back every write made since `m`.
    pub(super) fn rollback(&mut self, m: WritesMark) {
        self.0.0.truncate(m.0);
        self.1.truncate(m.1);
    }
    pub(super) fn is_empty(&self) -> bool {
        self.0.0.is_empty() && self.1.is_empty()
    }
    /// Writes a record kept in lists.
    pub(super) fn put_listed<T: serde::Serialize + lists::Listed>(
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
    pub(super) fn delete_listed<T: lists::Listed>(&mut self, key: Vec<u8>) {
        self.1.push(lists::Relist {
            key: key.clone(),
            new: None,
            old: lists::old_entries::<T>,
        });
        self.delete(key);
    }
    pub(super) fn put<T: serde::Serialize>(&mut self, key: Vec<u8>, value: &T) -> Result<()> {
        self.0.insert(key, codec::encode(value)?);
        Ok(())
    }
    pub(super) fn put_id(&mut self, key: Vec<u8>, id: u64) {
        self.0.insert(key, id.to_be_bytes().to_vec());
    }
    /// Writes `key` unless it holds another value: then the write fails with
    /// [`StorageError::Conflict`]`(what)`.
    pub(super) fn claim(&mut self, key: Vec<u8>, value: Vec<u8>, what: &'static str) {
        self.0.0.push((key.into(), Op::Claim(value.into(), what)));
    }
    pub(super) fn claim_id(&mut self, key: Vec<u8>, id: u64, what: &'static str) {
        self.claim(key, id.to_be_bytes().to_vec(), what);
    }
    /// Fails the whole write with [`StorageError::Conflict`]`(what)` unless what `key` holds
    /// when the write is applied passes `check`.
    pub(super) fn guard(
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
    pub(super) fn guard_record<T>(&mut self, key: Vec<u8>, read: &T, what: &'static str)
    where
        T: serde::de::DeserializeOwned + PartialEq + Clone + Send + Sync + 'static,
    {
        let read = read.clone();
        self.guard(key, what, move |v| {
            v.and_then(|v| codec::decode::<T>(v).ok()).as_ref() == Some(&read)
        });
    }
    pub(super) fn delete(&mut self, key: Vec<u8>) {
        self.0.remove(key);
    }
}
