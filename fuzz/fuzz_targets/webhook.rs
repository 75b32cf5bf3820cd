//! A delivery: the first line is the `X-Hub-Signature-256` header, the rest the raw body.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|b| *b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&data[..0], data),
    };
    fleetops_actors::fuzzing::webhook(&String::from_utf8_lossy(header), body);
});
