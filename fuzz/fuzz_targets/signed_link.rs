//! A signed upload or download link: the bytes as a token, and as the claims of a token signed
//! with the right key.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetops_actors::fuzzing::link(data));
