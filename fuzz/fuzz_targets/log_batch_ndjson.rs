//! A log batch body sent as NDJSON.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetops_http::fuzzing::log_batch(data, true));
