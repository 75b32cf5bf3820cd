//! What fleetops's test binaries and benches share, so that each is written once:
//!
//! - [`postgres`]: a private PostgreSQL cluster for the run, a database per data directory;
//! - [`moto`]: the S3-compatible server (moto), shared by the run or owned by one test;
//! - [`nats`]: the NATS server binary;
//! - [`python`]: the interpreter and tools of the repository's virtual environment;
//! - [`process`]: a child killed and reaped on drop, free ports, waiting for a port, a server's
//!   start read with a deadline;
//! - [`agent`]: a fleetops server as a process of its own, and the agent binary run against it;
//! - [`nodes`]: the engines several nodes share (a database, a bucket, a `nats-server`) and
//!   the nodes, each a process;
//! - [`tmpfs`]: a small file system of a test's own, for tests that watch free space;
//! - [`layering`]: a crate's module graph read from its sources, and its import cycles;
//! - [`eventually`] and [`sign`] (a source host's webhook signature).
//!
//! Nothing here is part of the service; the crate is never published.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod layering;
pub mod moto;
pub mod nats;
pub mod nodes;
pub mod postgres;
pub mod process;
pub mod python;
pub mod tmpfs;

use std::path::PathBuf;
use std::time::Duration;

/// A binary of the workspace built beside the running test or bench (`fleetops`,
/// `fleetops-agent`): cargo builds a package's binaries before its tests and benches, into
/// the directory above the test's own (`target/<profile>/deps/`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let p = dir.join(name);
    assert!(p.exists(), "{} is not built", p.display());
    p
}

/// Polls `f` every 50 ms until it returns true (`true`) or `secs` pass (`false`).
pub async fn eventually<F, Fut>(secs: u64, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The `X-Hub-Signature-256` value a source host sends with `body` under `secret`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    m.update(body);
    format!("sha256={}", hex::encode(m.finalize().into_bytes()))
}
