//! An artifact path from a request URL.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| fleetops_actors::fuzzing::artifact_path(data));
