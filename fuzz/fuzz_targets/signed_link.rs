//! The token of a signed upload or download link.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| fleetops_actors::fuzzing::link(data));
