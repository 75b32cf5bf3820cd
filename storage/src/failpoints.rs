//! Failpoints for the crash tests. In a debug build (the one the tests run), a process started
//! with `FLEETOPS_FAILPOINT=<name>` aborts, as a `kill -9` would, the first time it reaches the
//! point of that name. Release builds compile every point to nothing.
//!
//! Points: `seal:after-put` (a seal's segment is written, its transaction not run),
//! `seal:after-commit` (the transaction applied, not yet flushed), `delete:after-commit` (a
//! session's delete applied, its segments still on the to-delete list).

/// Aborts here when `FLEETOPS_FAILPOINT` names `point` (debug builds only).
pub fn hit(point: &str) {
    #[cfg(debug_assertions)]
    {
        static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        if AT
            .get_or_init(|| std::env::var("FLEETOPS_FAILPOINT").ok())
            .as_deref()
            == Some(point)
        {
            eprintln!("fleetops: failpoint {point}: aborting");
            std::process::abort();
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}
