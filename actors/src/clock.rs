//! Time in one form inside (Unix milliseconds, UTC) and one form outside (RFC 3339 with
//! milliseconds and `Z`).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

pub fn now_ms() -> i64 {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// `2026-01-02T03:04:05.678Z`.
pub fn fmt_ms(ms: i64) -> String {
    let fmt =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000Z".into())
}

/// Accepts RFC 3339 with `Z` or an offset; anything else is `None`.
pub fn parse_ms(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses() {
        assert_eq!(fmt_ms(1_767_323_045_678), "2026-01-02T03:04:05.678Z");
        assert_eq!(
            parse_ms("2026-01-02T03:04:05.678Z"),
            Some(1_767_323_045_678)
        );
        assert_eq!(
            parse_ms("2026-01-02T04:04:05.678+01:00"),
            Some(1_767_323_045_678)
        );
        assert_eq!(parse_ms("2026-01-02 03:04:05"), None);
        assert_eq!(parse_ms("yesterday"), None);
    }
}
