//! Time in one form inside (Unix milliseconds, UTC) and one form outside (RFC 3339 with
//! milliseconds and `Z`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

pub fn now_ms() -> i64 {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// The time the runtime's deadlines are measured by (test-run leases, the dedup window, the
/// previous webhook secret's grace period): wall time plus an offset that only tests move,
/// so those deadlines are tested by moving time rather than by sleeping through them.
#[derive(Clone, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    pub fn now_ms(&self) -> i64 {
        now_ms().saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    /// Moves this runtime's time forward (tests only).
    #[doc(hidden)]
    pub fn advance(&self, d: std::time::Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

/// `2026-01-02T03:04:05.678Z`.
pub fn fmt_ms(ms: i64) -> String {
    let mut s = String::with_capacity(24);
    write_ms(&mut s, ms);
    s
}

/// Appends `fmt_ms(ms)` to `out` without allocating (log export formats millions of these).
pub fn write_ms(out: &mut String, ms: i64) {
    let Ok(t) = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000) else {
        out.push_str("1970-01-01T00:00:00.000Z");
        return;
    };
    let year = t.year();
    if !(0..=9999).contains(&year) {
        let fmt = format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        out.push_str(&t.format(&fmt).unwrap_or_default());
        return;
    }
    let mut buf = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: u32| {
        for i in (0..width).rev() {
            if let Some(b) = buf.get_mut(at + i) {
                *b = b'0' + (v % 10) as u8;
            }
            v /= 10;
        }
    };
    put(0, 4, year as u32);
    put(5, 2, u8::from(t.month()) as u32);
    put(8, 2, t.day() as u32);
    put(11, 2, t.hour() as u32);
    put(14, 2, t.minute() as u32);
    put(17, 2, t.second() as u32);
    put(20, 3, t.millisecond() as u32);
    out.push_str(std::str::from_utf8(&buf).unwrap_or("1970-01-01T00:00:00.000Z"));
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
        assert_eq!(fmt_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(fmt_ms(1_767_323_045_008), "2026-01-02T03:04:05.008Z");
        assert_eq!(fmt_ms(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
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
