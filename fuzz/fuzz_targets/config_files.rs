//! A configuration file, read as JSON, YAML, TOML, INI and .env.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fleetops_actors::fuzzing::config_file(data));
