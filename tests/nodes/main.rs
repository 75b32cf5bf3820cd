//! Several fleetops nodes on shared engines: PostgreSQL for records, an S3-compatible server
//! (moto) for blobs and log segments, and `nats-server` for what travels between nodes as it
//! happens. Each node is its own process on port 0; every test speaks to both over HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod alerts;
mod bus;
mod crash;
mod harness;
mod live;
mod nats_login;
mod nodes;
mod projects;
mod rollouts;
mod webhooks;
