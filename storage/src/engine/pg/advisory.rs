//! Advisory locks: taken and given back by a statement that runs to its end whatever becomes
//! of its caller, on a connection held for the lock's life ([`HeldLock`]).

use super::*;

/// What [`Pg::advisory`] does with an advisory lock: take or give back, exclusive or
/// shared (shared holders exclude only an exclusive one).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Advisory {
    Take,
    Give,
    TakeShared,
    GiveShared,
}

/// An advisory lock held by a connection of its own ([`Pg::advisory_wait`]); dropping it
/// closes the connection, which gives the lock back.
pub(crate) struct HeldLock {
    _client: tokio_postgres::Client,
    conn: tokio::task::JoinHandle<std::result::Result<(), tokio_postgres::Error>>,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Pg {
    /// Tries `op` on advisory lock `key` on the sections' connection: whether it was taken
    /// (given back). Never waits for the lock. A session lock stacks, so every take that
    /// answered `true` is given back once. When the connection breaks, every lock on it is
    /// released by PostgreSQL; what was written under one is still fenced by its section's
    /// counter ([`crate::sections`]).
    ///
    /// The statement runs to its end whatever becomes of its caller; a lock taken for a
    /// caller that stopped waiting is given back at once, so no lock outlives its taker.
    pub(crate) fn advisory(
        &self,
        key: i64,
        op: Advisory,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.advisory_task(key, op, move |r| tx.send(r));
        async move {
            match tokio::time::timeout(Duration::from_secs(45), rx).await {
                Ok(Ok(r)) => r,
                _ => Err(StorageError::Unavailable(
                    "the database did not answer in time".into(),
                )),
            }
        }
    }

    /// Waits in PostgreSQL's queue for advisory lock `key`, on a connection of its own, for
    /// at most `within`: the connection, whose session holds the lock until it is dropped
    /// (closing it gives the lock back). Waiters are served in turn, so a server whose tries
    /// keep missing (another server takes the lock again and again) still gets it.
    pub(crate) async fn advisory_wait(
        &self,
        key: i64,
        within: Duration,
    ) -> Result<Option<HeldLock>> {
        let config = self.0.config.clone();
        let task = self.0.handle.spawn(async move {
            let (client, conn) = config.connect(NoTls).await.map_err(db_error)?;
            let conn = tokio::spawn(conn);
            let ms = within.as_millis().max(1).to_string();
            client
                .batch_execute(&format!("SET statement_timeout = {ms}"))
                .await
                .map_err(db_error)?;
            match client
                .query_one("SELECT pg_advisory_lock($1)", &[&key])
                .await
            {
                Ok(_) => Ok(Some(HeldLock {
                    _client: client,
                    conn,
                })),
                // Not granted in time.
                Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => {
                    conn.abort();
                    Ok(None)
                }
                Err(e) => {
                    conn.abort();
                    Err(db_error(e))
                }
            }
        });
        match tokio::time::timeout(within + Duration::from_secs(10), task).await {
            Ok(Ok(r)) => r,
            _ => Err(StorageError::Unavailable(
                "the database did not answer in time".into(),
            )),
        }
    }

    /// [`Pg::advisory`] for a synchronous caller.
    pub(crate) fn advisory_blocking(&self, key: i64, op: Advisory) -> Result<bool> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.advisory_task(key, op, move |r| tx.send(r).map_err(|e| e.0));
        let limit = Duration::from_millis(
            self.0
                .answer_wait_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let wait = || match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(_) => Err(StorageError::Unavailable(
                "the database did not answer in time".into(),
            )),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }

    /// Runs `op` on the engine's runtime and hands its answer to `answer`, which gives it
    /// back when the caller is gone: then a lock it took is given back.
    pub(super) fn advisory_task(
        &self,
        key: i64,
        op: Advisory,
        answer: impl FnOnce(Result<bool>) -> std::result::Result<(), Result<bool>> + Send + 'static,
    ) {
        let statement = self.advisory_statement(key, op);
        let give_back = match op {
            Advisory::Take => Some(self.advisory_statement(key, Advisory::Give)),
            Advisory::TakeShared => Some(self.advisory_statement(key, Advisory::GiveShared)),
            Advisory::Give | Advisory::GiveShared => None,
        };
        self.0.handle.spawn(async move {
            let r = statement.await;
            if let Err(Ok(true)) = answer(r)
                && let Some(g) = give_back
            {
                let _ = g.await;
            }
        });
    }

    pub(super) fn advisory_statement(
        &self,
        key: i64,
        op: Advisory,
    ) -> impl Future<Output = Result<bool>> + Send + 'static {
        let shared = self.0.clone();
        async move {
            let client = {
                let mut slot = shared.sections.lock().await;
                match slot.as_ref() {
                    Some((c, _)) if !c.is_closed() => c.clone(),
                    old => {
                        let old_pid = old.map(|(_, pid)| *pid);
                        let (client, conn) =
                            shared.config.connect(NoTls).await.map_err(db_error)?;
                        tokio::spawn(conn);
                        let pid: i32 = client
                            .query_one("SELECT pg_backend_pid()", &[])
                            .await
                            .map_err(db_error)?
                            .get(0);
                        // The broken connection's session may still be alive on the server
                        // (a half-open TCP connection) holding this server's locks: ended.
                        if let Some(old) = old_pid {
                            let _ = client
                                .query_one("SELECT pg_terminate_backend($1)", &[&old])
                                .await;
                        }
                        let client = Arc::new(client);
                        *slot = Some((client.clone(), pid));
                        client
                    }
                }
            };
            let sql = match op {
                Advisory::Take => "SELECT pg_try_advisory_lock($1)",
                Advisory::Give => "SELECT pg_advisory_unlock($1)",
                Advisory::TakeShared => "SELECT pg_try_advisory_lock_shared($1)",
                Advisory::GiveShared => "SELECT pg_advisory_unlock_shared($1)",
            };
            let row = client.query_one(sql, &[&key]).await.map_err(db_error)?;
            Ok(row.get::<_, bool>(0))
        }
    }
}
