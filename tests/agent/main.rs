//! fleetops-agent against a real fleetops server: both are the built binaries, run as
//! processes, the server on a port of its own so that it can be stopped and started again
//! under a running agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli;
mod harness;
mod identity;
mod runs;
mod updates;
