//! The credential headers: `Authorization` (first line; absent when empty) and `X-API-Key`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| {
    let (authorization, api_key) = data.split_once('\n').unwrap_or((data, ""));
    fleetops_http::fuzzing::credential(
        (!authorization.is_empty()).then_some(authorization),
        (!api_key.is_empty()).then_some(api_key),
    );
});
