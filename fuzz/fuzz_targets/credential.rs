//! The credential headers: `Authorization` (first line; absent when empty) and `X-API-Key`;
//! and the whole input as the claims of a correctly signed JWT.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &str| {
    let (authorization, api_key) = data.split_once('\n').unwrap_or((data, ""));
    fleetops_http::fuzzing::credential(
        (!authorization.is_empty()).then_some(authorization),
        (!api_key.is_empty()).then_some(api_key),
    );
    fleetops_actors::fuzzing::jwt_claims(data.as_bytes());
});
