//! The `fleetops` binary's library half: configuration and wiring, shared by `main.rs` and by
//! the integration tests, which start the real server in-process.

pub mod config;
pub mod startup;
