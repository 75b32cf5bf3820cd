//! A log batch body sent as a JSON array.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetops_http::fuzzing::log_batch(data, false));
