//! The sessions and live-stream suites again, on servers that seal every log batch as soon as
//! it is stored (`[logs] seal_lines = 1`): every answer they check (queries, totals, exports,
//! replays, tails) must be the same whether a session's batches are sealed, merged or not yet.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

/// Read by `common::test_config`.
pub const SEAL_EVERY_BATCH: bool = true;
pub const BLOBS_ON_S3: bool = false;
pub const ON_POSTGRES: bool = false;

#[path = "../api/common.rs"]
mod common;
#[path = "../api/live.rs"]
mod live;
#[path = "../api/sessions.rs"]
mod sessions;
