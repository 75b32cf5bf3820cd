//! Group commit: many writers waiting for durability share one `sled::Db::flush`.
//!
//! A writer takes a ticket after its write and waits until a flush that began after the ticket
//! was issued has finished. The flusher reads the newest ticket *before* flushing, so every
//! ticket up to it belongs to a write that the flush covers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Notify, watch};

use crate::{Result, StorageError};

#[derive(Clone, Copy)]
struct Done {
    /// Every ticket up to this one is settled.
    upto: u64,
    /// Tickets above this one were flushed successfully; at or below, the flush that settled
    /// them may have failed.
    failed_upto: u64,
}

pub(crate) struct GroupCommit {
    /// How long each flush took.
    pub(crate) timings: Arc<crate::timings::Timings>,
    requested: Arc<AtomicU64>,
    /// Set on drop so the flusher thread exits and releases its handle on the database (and
    /// with it the data directory's lock).
    closed: Arc<AtomicBool>,
    wake: Arc<Notify>,
    done: watch::Receiver<Done>,
    /// Joined on drop: the lock is released when the store is, not some time later (a
    /// process that reopens the directory right after would find it still held).
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GroupCommit {
    pub(crate) fn start(db: sled::Db, delay: std::time::Duration) -> Self {
        let requested = Arc::new(AtomicU64::new(0));
        let wake = Arc::new(Notify::new());
        let (tx, rx) = watch::channel(Done {
            upto: 0,
            failed_upto: 0,
        });
        let closed = Arc::new(AtomicBool::new(false));
        let timings = Arc::new(crate::timings::Timings::default());
        let (req, w, stop, t) = (
            requested.clone(),
            wake.clone(),
            closed.clone(),
            timings.clone(),
        );
        // A dedicated thread, not a tokio task: it must outlive any one runtime (offline
        // commands and tests create several) and fsync is blocking anyway.
        let thread = std::thread::Builder::new()
            .name("fleetops-flush".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build();
                let Ok(rt) = rt else { return };
                rt.block_on(async move {
                    let mut failed_upto = 0;
                    loop {
                        w.notified().await;
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        let upto = req.load(Ordering::SeqCst);
                        let started = std::time::Instant::now();
                        let flushed = db.flush();
                        t.observe(started.elapsed());
                        if let Err(e) = flushed {
                            tracing::error!(error = %e, "durable flush failed");
                            failed_upto = upto;
                        }
                        if tx.send(Done { upto, failed_upto }).is_err() {
                            return;
                        }
                    }
                });
            })
            .ok();
        Self {
            timings,
            requested,
            closed,
            wake,
            done: rx,
            thread,
        }
    }

    pub(crate) async fn wait(&self) -> Result<()> {
        let ticket = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        self.wake.notify_one();
        let mut rx = self.done.clone();
        let done = *rx
            .wait_for(|d| d.upto >= ticket)
            .await
            .map_err(|_| StorageError::FlushFailed)?;
        if ticket <= done.failed_upto {
            return Err(StorageError::FlushFailed);
        }
        Ok(())
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
        // At most one flush in progress to wait for.
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::Store;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_waiters_share_flushes_with_and_without_delay() {
        for delay in [Duration::ZERO, Duration::from_millis(2)] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_with(dir.path(), delay).unwrap();
            let mut tasks = Vec::new();
            for i in 0..64u64 {
                let s = store.clone();
                tasks.push(tokio::spawn(async move {
                    s.meta_put(&format!("k{i}"), b"v").unwrap();
                    s.durable().await
                }));
            }
            for t in tasks {
                t.await.unwrap().unwrap();
            }
            assert_eq!(store.meta_get("k63").unwrap().as_deref(), Some(&b"v"[..]));
        }
    }
}
