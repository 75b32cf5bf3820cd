//! The server-and-agent harness of `fleetops_testkit::agent`, and the two binaries this
//! package built.

pub use fleetops_testkit::agent::*;

pub const SERVER: &str = env!("CARGO_BIN_EXE_fleetops");
pub const AGENT: &str = env!("CARGO_BIN_EXE_fleetops-agent");
