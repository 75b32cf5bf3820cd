//! The several-node harness of `fleetops_testkit::nodes`.

pub use fleetops_testkit::nodes::*;
