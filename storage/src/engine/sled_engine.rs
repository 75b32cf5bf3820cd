//! The sled engine: the embedded default. Its trees are sled trees; durability comes from
//! the store's group commit (`flush`), since sled fsyncs on its own only now and then.

use sled::transaction::{ConflictableTransactionError, TransactionError, TransactionalTree};

use super::{Batch, Iter, Tx, TxError, TxFailure, TxFailureKind, TxOutcome, TxTree};
use crate::{Result, StorageError};

pub(super) fn iter(it: sled::Iter) -> Iter {
    Iter::new(it.map(|kv| kv.map_err(StorageError::from)))
}

pub(super) fn apply_batch(tree: &sled::Tree, batch: Batch) -> Result<()> {
    let mut b = sled::Batch::default();
    for (k, v) in batch.0 {
        match v {
            Some(v) => b.insert(k, v),
            None => b.remove(k),
        }
    }
    Ok(tree.apply_batch(b)?)
}

struct SledTx<'a>(&'a TransactionalTree);

fn failed(e: sled::transaction::UnabortableTransactionError) -> TxFailure {
    TxFailure(TxFailureKind::Sled(e))
}

impl TxTree for SledTx<'_> {
    fn get(&self, key: &[u8]) -> Result<Option<super::Bytes>, TxFailure> {
        self.0.get(key).map_err(failed)
    }
    fn insert(&self, key: &[u8], value: &[u8]) -> Result<(), TxFailure> {
        self.0.insert(key, value).map(|_| ()).map_err(failed)
    }
    fn remove(&self, key: &[u8]) -> Result<(), TxFailure> {
        self.0.remove(key).map(|_| ()).map_err(failed)
    }
}

pub(super) fn transaction<A, E>(
    a: &sled::Tree,
    b: &sled::Tree,
    f: impl Fn(&Tx, &Tx) -> Result<A, TxError<E>>,
) -> Result<A, TxOutcome<E>> {
    use sled::Transactional;
    let out = (a, b).transaction(|(ta, tb)| {
        f(&Tx(&SledTx(ta)), &Tx(&SledTx(tb))).map_err(|e| match e {
            TxError::Abort(e) => ConflictableTransactionError::Abort(Ok(e)),
            TxError::Engine(TxFailure(TxFailureKind::Sled(u))) => u.into(),
            TxError::Engine(TxFailure(TxFailureKind::Retry)) => {
                ConflictableTransactionError::Conflict
            }
            // Not made by this engine's trees; carried out as an abort.
            TxError::Engine(TxFailure(TxFailureKind::Storage(s))) => {
                ConflictableTransactionError::Abort(Err(s))
            }
        })
    });
    match out {
        Ok(a) => Ok(a),
        Err(TransactionError::Abort(Ok(e))) => Err(TxOutcome::Abort(e)),
        Err(TransactionError::Abort(Err(s))) => Err(TxOutcome::Storage(s)),
        Err(TransactionError::Storage(e)) => Err(TxOutcome::Storage(e.into())),
    }
}
