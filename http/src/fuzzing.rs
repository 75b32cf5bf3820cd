//! Entry points for the coverage-guided fuzz targets in `fuzz/` that start at the edge. None
//! may panic, whatever the input.
#![doc(hidden)]

/// A log batch body as the ingestion route reads it, then stored as a chunk and read back.
pub fn log_batch(bytes: &[u8], ndjson: bool) {
    if let Ok(entries) = crate::handlers::sessions::parse_batch(bytes, ndjson) {
        fleetops_actors::fuzzing::log_entries(entries);
    }
}

/// The credential headers of a request: the bearer value extracted, then (when it is not an
/// API key or a device token, which are only looked up by hash) decoded as a JWT.
pub fn credential(authorization: Option<&str>, api_key: Option<&str>) {
    if let Some(v) = crate::app::credential(authorization, api_key) {
        fleetops_actors::fuzzing::jwt(v);
    }
}
