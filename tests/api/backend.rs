//! Where the servers of a test keep their records and blobs, and the macros that run one test
//! on several of them. A test is written once, as a plain `async fn` named to a macro beside
//! it, and runs as one `#[test]` per backend, `name::sled`, `name::postgres` and so on:
//!
//! - [`each_backend!`]: the embedded store, and PostgreSQL (a private cluster for the run, a
//!   database per server cloned from a migrated template);
//! - [`every_log_store!`]: those two, and three that seal every log batch as soon as it is stored
//!   (`[logs] seal_lines = 1`): with segments in local files, on PostgreSQL, and in an
//!   S3-compatible server (moto, one for the run, a bucket per server). Every answer about a
//!   session's lines must be the same whether its batches are sealed, merged or not yet. After
//!   each such test, the batches it stored must have been sealed with no seal failing, and on
//!   S3 no segment may be in local files ([`crate::common::assert_sealing_held`]);
//! - [`sled_only!`] and [`postgres_only!`]: what only one backend has.
//!
//! `threads = N` runs the test on a multi-threaded runtime of N workers, as the server runs in
//! production; otherwise on one thread, as `#[tokio::test]` does.

use std::cell::Cell;

/// A test's backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sled,
    Postgres,
    /// Every log batch sealed at once, segments in local files.
    Sealed,
    /// As `Sealed`, the records in PostgreSQL.
    SealedPostgres,
    /// As `Sealed`, the segments (and every blob) in an S3-compatible server.
    SealedS3,
}

impl Backend {
    pub fn on_postgres(self) -> bool {
        matches!(self, Backend::Postgres | Backend::SealedPostgres)
    }

    pub fn seals_every_batch(self) -> bool {
        matches!(
            self,
            Backend::Sealed | Backend::SealedPostgres | Backend::SealedS3
        )
    }

    pub fn blobs_on_s3(self) -> bool {
        self == Backend::SealedS3
    }
}

thread_local! {
    static BACKEND: Cell<Backend> = const { Cell::new(Backend::Sled) };
}

/// The backend of the test running on this thread.
pub fn backend() -> Backend {
    BACKEND.get()
}

/// Whether this test's servers keep their records in PostgreSQL.
pub fn on_postgres() -> bool {
    backend().on_postgres()
}

/// Runs `test` on `backend`, on a runtime of `threads` workers (one thread when `None`); every
/// thread of that runtime knows the backend.
pub fn run<F: std::future::Future<Output = ()>>(
    backend: Backend,
    threads: Option<usize>,
    test: impl FnOnce() -> F,
) {
    BACKEND.set(backend);
    let mut rt = match threads {
        None => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    rt.enable_all()
        .on_thread_start(move || BACKEND.set(backend))
        .build()
        .unwrap()
        .block_on(async {
            test().await;
            crate::common::assert_sealing_held().await;
        })
}

/// One `#[test]` per backend named, calling the async fn `$name` beside the invocation.
macro_rules! on_backends {
    ($name:ident, $threads:expr, [$($variant:ident => $backend:ident),+]) => {
        mod $name {
            $(
                #[test]
                fn $variant() {
                    $crate::backend::run(
                        $crate::backend::Backend::$backend,
                        $threads,
                        super::$name,
                    )
                }
            )+
        }
    };
}

/// `$name::sled` and `$name::postgres`.
macro_rules! each_backend {
    ($name:ident $(, threads = $n:literal)?) => {
        on_backends!($name, None::<usize> $(.or(Some($n)))?, [sled => Sled, postgres => Postgres]);
    };
}

/// `$name::sled`, `$name::postgres`, `$name::sealed`, `$name::sealed_postgres` and
/// `$name::sealed_s3`.
macro_rules! every_log_store {
    ($name:ident $(, threads = $n:literal)?) => {
        on_backends!($name, None::<usize> $(.or(Some($n)))?, [
            sled => Sled,
            postgres => Postgres,
            sealed => Sealed,
            sealed_postgres => SealedPostgres,
            sealed_s3 => SealedS3
        ]);
    };
}

/// `$name::sled` alone.
macro_rules! sled_only {
    ($name:ident $(, threads = $n:literal)?) => {
        on_backends!($name, None::<usize> $(.or(Some($n)))?, [sled => Sled]);
    };
}

/// `$name::postgres` alone.
macro_rules! postgres_only {
    ($name:ident $(, threads = $n:literal)?) => {
        on_backends!($name, None::<usize> $(.or(Some($n)))?, [postgres => Postgres]);
    };
}
