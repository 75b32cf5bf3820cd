//! Integration tests: the real server, in-process on 127.0.0.1:0 with its own temporary data
//! directory (or the built binary where the process itself is under test), spoken to over
//! HTTP with a real client. Each test runs on the embedded store and on PostgreSQL, the
//! sessions' and live streams' also on servers that seal every batch ([`backend`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod backend;

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
mod outage;
mod peers;
mod races;
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
