//! A version (first line) and a version constraint (the rest).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| {
    let (version, constraint) = data.split_once('\n').unwrap_or((data, ""));
    fleetops_actors::fuzzing::versions(version, constraint);
});
