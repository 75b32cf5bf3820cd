//! The wall clock the store stamps its own records with. A leaf.

/// The wall clock in Unix ms (when a batch became owed a seal, when a segment was written).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
