//! The whole API suite again with the records in PostgreSQL (`[database] url`): a private
//! cluster for the run (Debian's `postgresql`, started by the tests), a database per server
//! cloned from a migrated template. Every answer must be the one the embedded store gives.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Read by `common::test_config`.
pub const SEAL_EVERY_BATCH: bool = false;
pub const BLOBS_ON_S3: bool = false;
pub const ON_POSTGRES: bool = true;

#[path = "../api/accounts.rs"]
mod accounts;
#[path = "../api/alerts.rs"]
mod alerts;
#[path = "../api/artifacts.rs"]
mod artifacts;
#[path = "../api/bad_input.rs"]
mod bad_input;
#[path = "../api/capsules.rs"]
mod capsules;
#[path = "../api/cli.rs"]
mod cli;
#[path = "../api/common.rs"]
mod common;
#[path = "../api/configurations.rs"]
mod configurations;
#[path = "../api/console.rs"]
mod console;
#[path = "../api/crash.rs"]
mod crash;
#[path = "../api/deployments.rs"]
mod deployments;
#[path = "../api/devices.rs"]
mod devices;
#[path = "../api/disk.rs"]
mod disk;
#[path = "../api/enrollment.rs"]
mod enrollment;
#[path = "../api/evaluation.rs"]
mod evaluation;
#[path = "../api/gates.rs"]
mod gates;
#[path = "../api/hostile.rs"]
mod hostile;
#[path = "../api/live.rs"]
mod live;
#[path = "../api/offboarding.rs"]
mod offboarding;
#[path = "../api/ops.rs"]
mod ops;
mod outage;
#[path = "../api/peers.rs"]
mod peers;
mod races;
#[path = "../api/rate_limits.rs"]
mod rate_limits;
#[path = "../api/retention.rs"]
mod retention;
#[path = "../api/rollouts.rs"]
mod rollouts;
#[path = "../api/s3.rs"]
mod s3;
#[path = "../api/schemathesis.rs"]
mod schemathesis;
#[path = "../api/sealing.rs"]
mod sealing;
#[path = "../api/secrets.rs"]
mod secrets;
#[path = "../api/sessions.rs"]
mod sessions;
#[path = "../api/supervision.rs"]
mod supervision;
#[path = "../api/tour.rs"]
mod tour;
#[path = "../api/updates.rs"]
mod updates;
#[path = "../api/webhooks.rs"]
mod webhooks;
