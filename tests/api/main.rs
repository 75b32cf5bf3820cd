//! Integration tests: the real server, in-process on 127.0.0.1:0 with its own temporary data
//! directory (or the built binary where the process itself is under test), spoken to over
//! HTTP with a real client.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Read by `common::test_config`: the `sealed` suite runs with every log batch sealed at once.
pub const SEAL_EVERY_BATCH: bool = false;
/// Read by `common::test_config`: the `sealed_s3` suite keeps blobs in an S3-compatible server.
pub const BLOBS_ON_S3: bool = false;
/// Read by `common::test_config`: the `postgres` suite keeps records in PostgreSQL.
pub const ON_POSTGRES: bool = false;

mod accounts;
mod alerts;
mod artifacts;
mod bad_input;
mod capsules;
mod cli;
mod common;
mod configurations;
mod console;
mod crash;
mod deployments;
mod devices;
mod disk;
mod enrollment;
mod evaluation;
mod gates;
mod hostile;
mod live;
mod migrate;
mod offboarding;
mod ops;
mod peers;
mod rate_limits;
mod retention;
mod rollouts;
mod s3;
mod schemathesis;
mod sealing;
mod secrets;
mod sessions;
mod supervision;
mod tour;
mod updates;
mod webhooks;
