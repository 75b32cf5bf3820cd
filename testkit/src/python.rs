//! The Python the tests start their peers with (moto, the SMTP sink, the webhook signature
//! check, schemathesis, the generated client): `FLEETOPS_TEST_PYTHON`, the interpreter of the
//! virtual environment `scripts/test` fills from `tests/requirements.txt`, or `python3` from
//! `PATH` when it is not set.

use std::path::PathBuf;

/// The interpreter.
pub fn python() -> PathBuf {
    std::env::var_os("FLEETOPS_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// A command the Python tools install (`schemathesis`, `openapi-python-client`): beside the
/// interpreter of the virtual environment, or from `PATH`.
pub fn tool(name: &str) -> PathBuf {
    match std::env::var_os("FLEETOPS_TEST_PYTHON").map(PathBuf::from) {
        Some(p) => p.with_file_name(name),
        None => PathBuf::from(name),
    }
}
