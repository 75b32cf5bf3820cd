//! The sessions and live-stream suites on servers that seal every log batch as soon as it is
//! stored (`[logs] seal_lines = 1`) and keep their records in PostgreSQL: a seal's
//! transaction, the segment index and the reader pins on the shared engine must give every
//! answer the embedded store gives.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

/// Read by `common::test_config`.
pub const SEAL_EVERY_BATCH: bool = true;
pub const BLOBS_ON_S3: bool = false;
pub const ON_POSTGRES: bool = true;

#[path = "../api/common.rs"]
mod common;
#[path = "../api/live.rs"]
mod live;
#[path = "../api/sessions.rs"]
mod sessions;
