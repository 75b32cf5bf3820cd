//! Log lines as the agent reads them, and as the service takes them: one NDJSON entry a line
//! (`{timestamp, level, module, message}`), the level read from the line where it says one.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub timestamp: String,
    pub level: &'static str,
    pub module: String,
    pub message: String,
}

/// The level a line announces (`ERROR`, `[WARN]`, `W:`, `level=debug`, ROS's `[INFO]`...)
/// among its first words; `otherwise` when it says none.
pub fn level_of(line: &str, otherwise: &'static str) -> &'static str {
    let head: String = line.chars().take(64).collect();
    for word in head
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(6)
    {
        match word.to_ascii_uppercase().as_str() {
            "ERROR" | "ERR" | "FATAL" | "CRITICAL" | "CRIT" | "PANIC" | "EMERG" | "ALERT" => {
                return "error";
            }
            "WARN" | "WARNING" => return "warn",
            "INFO" | "NOTICE" => return "info",
            "DEBUG" | "TRACE" => return "debug",
            _ => {}
        }
    }
    otherwise
}

/// `ms` since the epoch as RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// An entry for `raw` (a line without its newline) read now, cut at `max_bytes` on a
/// character boundary.
pub fn entry(raw: &[u8], module: &str, otherwise: &'static str, max_bytes: usize) -> Entry {
    entry_at(raw, module, otherwise, max_bytes, rfc3339(now_ms()))
}

/// As [`entry`], stamped `timestamp` (the lines of one read share it).
pub fn entry_at(
    raw: &[u8],
    module: &str,
    otherwise: &'static str,
    max_bytes: usize,
    timestamp: String,
) -> Entry {
    let text = String::from_utf8_lossy(raw);
    let mut message = text.trim_end_matches('\r').to_string();
    if message.len() > max_bytes {
        let mut cut = max_bytes;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    Entry {
        timestamp,
        level: level_of(&message, otherwise),
        module: module.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_read_from_common_formats() {
        assert_eq!(level_of("[ERROR] [1700.1] [nav]: lost", "info"), "error");
        assert_eq!(level_of("2026-11-28 WARNING motor hot", "info"), "warn");
        assert_eq!(level_of("level=debug msg=x", "info"), "debug");
        assert_eq!(level_of("INFO:root:ready", "error"), "info");
        assert_eq!(level_of("all good", "info"), "info");
        assert_eq!(level_of("all good", "error"), "error");
        // A level word deep in the message is not the line's level.
        assert_eq!(
            level_of("a b c d e f g the error count is 0", "info"),
            "info"
        );
    }

    #[test]
    fn times_are_rfc3339_utc_to_the_millisecond() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_863_541_839), "2026-11-28T10:59:01.839Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn long_lines_are_cut_on_a_character_boundary() {
        let e = entry("ééé".as_bytes(), "m", "info", 3);
        assert_eq!(e.message, "é");
    }
}
