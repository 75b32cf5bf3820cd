//! The sessions and live-stream suites again, sealing every log batch as soon as it is stored
//! (`[logs] seal_lines = 1`) into segments kept in an S3-compatible server (moto on loopback,
//! one for the run, a bucket per server): every answer must be the same as with local chunks.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

/// Read by `common::test_config`.
pub const SEAL_EVERY_BATCH: bool = true;
pub const BLOBS_ON_S3: bool = true;
pub const ON_POSTGRES: bool = false;

#[path = "../api/common.rs"]
mod common;
#[path = "../api/live.rs"]
mod live;
#[path = "../api/sessions.rs"]
mod sessions;
