#![allow(clippy::unwrap_used)]

use super::*;

/// A caller that stops waiting while its transaction's `BEGIN` is under way (the answer
/// comes after the deadline) leaves no connection inside that transaction in the pool:
/// every connection the pool hands out afterwards runs its statements in autocommit.
#[test]
fn a_transaction_its_caller_gave_up_on_never_returns_to_the_pool() {
    crate::testing::on(crate::testing::Engine::Postgres, || {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::testing::database(dir.path()).url;
        let pg = Pg::open(&url, 2).unwrap();
        let t = pg.tree("records").unwrap();
        pg.0.answer_wait_ms
            .store(300, std::sync::atomic::Ordering::SeqCst);
        BEGIN_DELAY_MS.store(1_000, std::sync::atomic::Ordering::SeqCst);
        let out = t.transaction(&t, |_, _| Ok::<(), TxError<()>>(()));
        match out {
            Err(TxOutcome::Storage(StorageError::Unavailable(_))) => {}
            Ok(()) => panic!("answered in time"),
            Err(TxOutcome::Storage(e)) => panic!("{e}"),
            Err(_) => panic!("aborted"),
        }
        BEGIN_DELAY_MS.store(0, std::sync::atomic::Ordering::SeqCst);
        pg.0.answer_wait_ms
            .store(45_000, std::sync::atomic::Ordering::SeqCst);
        // The abandoned task finishes its begin, and its answer goes unclaimed.
        std::thread::sleep(Duration::from_millis(1_500));
        // Both of the pool's connections at once: neither is inside a transaction (in
        // one, `now()` would be the old BEGIN's time).
        let pool = pg.0.pool.clone();
        let stale = pg
            .run(async move {
                let a = pool.get().await.map_err(pool_error)?;
                let b = pool.get().await.map_err(pool_error)?;
                let mut stale = 0;
                for c in [&a, &b] {
                    let r = c
                        .query_one(
                            "SELECT now() < statement_timestamp() - interval '500 ms'",
                            &[],
                        )
                        .await
                        .map_err(db_error)?;
                    stale += usize::from(r.get::<_, bool>(0));
                }
                Ok(stale)
            })
            .unwrap();
        assert_eq!(
            stale, 0,
            "a pooled connection is still inside the transaction"
        );
    });
}

#[test]
fn a_prefix_ends_past_every_key_that_starts_with_it() {
    assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
    assert_eq!(prefix_end(&[0xff, 0xff]), None);
    assert_eq!(prefix_end(b""), None);
}
