//! Log entries: the rules for what a device may send, how a batch becomes a stored chunk, and
//! how a query walks the chunks. Pure functions; the session actor and the sessions handle
//! call them.
//!
//! A batch is checked whole, all entries or none (at most 10,000 of them, else 413; a bad
//! timestamp, level or metadata is a 422 naming the entry), and laid out as one chunk, column
//! by column: timestamps, levels, a module dictionary, the messages concatenated, metadata as
//! JSON bytes (an object, nested at most 64 levels). A [`LogFilter`] (levels, module, a
//! case-insensitive substring, a time range) first rules a chunk out from its level mask and
//! time range, then picks the matching entries in arrival order; a search is one `memmem` pass
//! over the chunk's lower-cased text (entry by entry when either side is not ASCII). The same
//! filter serves the query, the export and the live stream, so the three agree.
//!
//! Tested by the unit tests below and through the API (`tests/api/sessions/`,
//! `tests/api/live.rs`).

use std::collections::HashMap;

use fleetops_storage::{Columns, LogChunk};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::clock::{now_ms, parse_ms, write_ms};
use crate::error::{Error, Result};

/// Most entries in one batch.
pub const MAX_BATCH_ENTRIES: usize = 10_000;
/// Largest batch body.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Largest `limit` of a query.
pub const MAX_QUERY_LIMIT: usize = 10_000;

pub const LEVELS: [&str; 4] = ["DEBUG", "INFO", "WARN", "ERROR"];

/// One entry as a device sends it.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RawEntry {
    #[serde(default)]
    #[schemars(schema_with = "crate::rules::schemas::opt_time")]
    pub timestamp: Option<String>,
    #[schemars(schema_with = "crate::rules::schemas::level")]
    pub level: String,
    pub module: Option<String>,
    pub message: String,
    #[serde(default)]
    #[schemars(schema_with = "crate::rules::schemas::opt_object")]
    pub metadata: Option<Box<RawValue>>,
}

/// The JSON Schema of a batch (a JSON array body), for the OpenAPI document.
pub fn batch_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let entry = g.subschema_for::<RawEntry>();
    schemars::json_schema!({"type": "array", "maxItems": MAX_BATCH_ENTRIES, "items": entry})
}

/// `debug`, `info`, `warn` (or `warning`), `error`, in any case.
pub fn parse_level(s: &str) -> Option<u8> {
    match s.to_ascii_lowercase().as_str() {
        "debug" => Some(0),
        "info" => Some(1),
        "warn" | "warning" => Some(2),
        "error" => Some(3),
        _ => None,
    }
}

/// Checks every entry (all or nothing) and lays the batch out as one chunk.
pub fn build_chunk(entries: Vec<RawEntry>) -> Result<LogChunk> {
    if entries.len() > MAX_BATCH_ENTRIES {
        return Err(Error::TooLarge(format!(
            "A batch holds at most {MAX_BATCH_ENTRIES} entries"
        )));
    }
    let now = now_ms();
    let n = entries.len();
    let mut c = LogChunk {
        ts: Vec::with_capacity(n * 8),
        levels: Vec::with_capacity(n),
        module_idx: Vec::with_capacity(n * 4),
        text_ends: Vec::with_capacity(n * 4),
        meta_ends: Vec::with_capacity(n * 4),
        ..LogChunk::default()
    };
    let mut modules: HashMap<String, u32> = HashMap::new();
    for (i, e) in entries.into_iter().enumerate() {
        let bad = |why: String| Error::Unprocessable(format!("entry {i}: {why}"));
        let ts = match &e.timestamp {
            None => now,
            Some(t) => parse_ms(t)
                .ok_or_else(|| bad(format!("timestamp: not an RFC 3339 datetime: {t:?}")))?,
        };
        let level = parse_level(&e.level).ok_or_else(|| {
            bad(format!(
                "level: must be debug, info, warn or error, not {:?}",
                e.level
            ))
        })?;
        let meta = match &e.metadata {
            None => "{}",
            Some(m) if m.get().trim_start().starts_with('{') => m.get(),
            Some(m) if m.get().trim() == "null" => "{}",
            Some(_) => return Err(bad("metadata: must be an object".into())),
        };
        if json_depth(meta.as_bytes()) > crate::rules::config_files::MAX_DEPTH {
            return Err(bad(format!(
                "metadata: nested deeper than {} levels",
                crate::rules::config_files::MAX_DEPTH
            )));
        }
        let module = e.module.unwrap_or_default();
        let next = modules.len() as u32;
        let mi = *modules.entry(module).or_insert(next);
        c.push(ts, level, mi, &e.message, meta.as_bytes())
            .ok_or_else(|| bad("batch too large".into()))?;
    }
    let mut names: Vec<(String, u32)> = modules.into_iter().collect();
    names.sort_by_key(|(_, i)| *i);
    c.modules = names.into_iter().map(|(m, _)| m).collect();
    Ok(c)
}

/// The nesting depth of well-formed JSON text (an object or array is one level more than
/// what it holds). `RawValue` keeps metadata unparsed, past serde_json's own depth check, and
/// text nested deeper than ordinary JSON readers accept would be stored and served back.
fn json_depth(json: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                max = max.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// One entry as it is returned (levels upper-case, milliseconds).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct LogEntryView {
    pub timestamp: String,
    pub level: &'static str,
    pub module: String,
    pub message: String,
    pub metadata: Box<RawValue>,
}

/// Entry `i` of a chunk.
pub fn entry(c: &LogChunk, i: usize) -> Option<LogEntryView> {
    let mut timestamp = String::with_capacity(24);
    write_ms(&mut timestamp, c.ts_at(i)?);
    let level = LEVELS.get(c.level_at(i)? as usize).copied()?;
    let module = c.modules.get(c.module_at(i)? as usize)?.clone();
    let message = c.message(i)?.to_string();
    let meta = c.metadata(i)?;
    let metadata = RawValue::from_string(String::from_utf8_lossy(meta).into_owned()).ok()?;
    Some(LogEntryView {
        timestamp,
        level,
        module,
        message,
        metadata,
    })
}

/// The filters of the log query, the export and the live stream.
#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    /// Bit `1 << level` per wanted level; 0 means any.
    pub levels: u8,
    pub module: Option<String>,
    /// Lower-cased needle of a case-insensitive substring search of the message.
    pub search: Option<String>,
    /// Inclusive.
    pub since: Option<i64>,
    /// Exclusive.
    pub until: Option<i64>,
}

impl LogFilter {
    /// Whether the chunk could hold a match at all.
    fn may_match(&self, c: &impl Columns) -> bool {
        if c.is_empty() || (self.levels != 0 && c.cols().level_mask & self.levels == 0) {
            return false;
        }
        if self.since.is_some_and(|s| c.cols().max_ts < s)
            || self.until.is_some_and(|u| c.cols().min_ts >= u)
        {
            return false;
        }
        true
    }

    /// Indices of the chunk's entries that match, in arrival order.
    pub fn matches(&self, c: &impl Columns) -> Vec<usize> {
        if !self.may_match(c) {
            return Vec::new();
        }
        let module = match &self.module {
            Some(m) => match c.module_index(m) {
                Some(i) => Some(i),
                None => return Vec::new(),
            },
            None => None,
        };
        let keep = |i: usize| {
            let lv = c.level_at(i).unwrap_or(0);
            let ts = c.ts_at(i).unwrap_or(0);
            (self.levels == 0 || self.levels & (1 << lv) != 0)
                && module.is_none_or(|m| c.module_at(i) == Some(m))
                && self.since.is_none_or(|s| ts >= s)
                && self.until.is_none_or(|u| ts < u)
        };
        match self.search.as_deref() {
            // The text first: the other tests then run on its hits only.
            Some(needle) => search_hits(c, needle)
                .into_iter()
                .filter(|&i| keep(i))
                .collect(),
            None => (0..c.len()).filter(|&i| keep(i)).collect(),
        }
    }
}

/// The entries of the chunk whose messages contain `needle` (already lower-case),
/// case-insensitively, in order: one pass of memmem over the chunk's lower-cased text,
/// mapped back to entries.
fn search_hits(c: &impl Columns, needle: &str) -> Vec<usize> {
    if needle.is_empty() {
        return (0..c.len()).collect();
    }
    let mut hits = Vec::new();
    if c.cols().text.is_ascii() && needle.is_ascii() {
        let hay = c.cols().text.to_ascii_lowercase();
        let finder = memchr::memmem::Finder::new(needle.as_bytes());
        let (mut from, mut last) = (0, 0);
        while let Some(pos) = finder.find(hay.get(from..).unwrap_or_default()) {
            let at = from + pos;
            // The entry whose message holds byte `at` (at or after the last one's).
            let i = c.entry_at_text(at, last);
            last = i;
            let end = c.text_end(i).unwrap_or(0);
            if at + needle.len() <= end {
                hits.push(i);
                // Nothing more to learn from this entry.
                from = end;
            } else {
                // The occurrence crosses into the next message: try again just after it.
                from = at + 1;
            }
            if from >= hay.len() {
                break;
            }
        }
        return hits;
    }
    (0..c.len())
        .filter(|&i| {
            c.message(i)
                .is_some_and(|m| m.to_lowercase().contains(needle))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(ts: Option<&str>, level: &str, module: &str, msg: &str) -> RawEntry {
        RawEntry {
            timestamp: ts.map(str::to_string),
            level: level.into(),
            module: Some(module.into()),
            message: msg.into(),
            metadata: None,
        }
    }

    #[test]
    fn build_and_filter() {
        let c = build_chunk(vec![
            raw(Some("2026-01-01T00:00:00Z"), "INFO", "nav", "Motor started"),
            raw(Some("2026-01-01T00:00:01Z"), "warning", "arm", "MOTOR hot"),
            raw(Some("2026-01-01T00:00:02Z"), "Error", "arm", "gripper jam"),
            raw(
                Some("2026-01-01T00:00:03Z"),
                "debug",
                "nav",
                "motorway ahead, café",
            ),
        ])
        .unwrap();
        assert_eq!(c.modules, vec!["nav", "arm"]);
        assert_eq!(c.levels, vec![1, 2, 3, 0]);
        let f = LogFilter {
            search: Some("motor".into()),
            ..Default::default()
        };
        assert_eq!(f.matches(&c), vec![0, 1, 3]);
        let f = LogFilter {
            levels: 1 << 2 | 1 << 3,
            module: Some("arm".into()),
            ..Default::default()
        };
        assert_eq!(f.matches(&c), vec![1, 2]);
        let f = LogFilter {
            since: parse_ms("2026-01-01T00:00:01Z"),
            until: parse_ms("2026-01-01T00:00:03Z"),
            ..Default::default()
        };
        assert_eq!(f.matches(&c), vec![1, 2]);
        let f = LogFilter {
            search: Some("é".into()),
            ..Default::default()
        };
        assert_eq!(f.matches(&c), vec![3]);
        // A match must not straddle two messages ("started" + "MOTOR" -> "dmo").
        let f = LogFilter {
            search: Some("dmotor".into()),
            ..Default::default()
        };
        assert!(f.matches(&c).is_empty());
        let e = entry(&c, 1).unwrap();
        assert_eq!(e.level, "WARN");
        assert_eq!(e.timestamp, "2026-01-01T00:00:01.000Z");
        assert_eq!(e.metadata.get(), "{}");
    }

    /// The one-pass search over a chunk's text finds exactly the entries whose own message
    /// holds the needle: random short messages over a small alphabet (frequent hits, empty
    /// messages, matches that would straddle two messages), against each message alone.
    #[test]
    fn the_text_search_finds_each_message_that_holds_the_needle() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let msgs: Vec<String> = (0..1 + next(60))
                .map(|_| {
                    (0..next(6))
                        .map(|_| ['a', 'b', 'A', ' '][next(4) as usize])
                        .collect()
                })
                .collect();
            let c = build_chunk(
                msgs.iter()
                    .map(|m| raw(Some("2026-01-01T00:00:00Z"), "info", "nav", m))
                    .collect(),
            )
            .unwrap();
            // Needles that overlap themselves ("aaa", "abab") can cross into the next message
            // twice in a row.
            for needle in ["a", "ab", "aa", "b a", "aba", "aaa", "abab", "a a a"] {
                let want: Vec<usize> = (0..msgs.len())
                    .filter(|&i| msgs[i].to_ascii_lowercase().contains(needle))
                    .collect();
                let f = LogFilter {
                    search: Some(needle.into()),
                    ..Default::default()
                };
                assert_eq!(f.matches(&c), want, "{needle:?} in {msgs:?}");
            }
        }
    }

    #[test]
    fn invalid_entries_name_their_index() {
        let e = build_chunk(vec![
            raw(None, "info", "", "ok"),
            raw(None, "loud", "", "x"),
        ])
        .unwrap_err();
        assert!(e.to_string().starts_with("entry 1: level"), "{e}");
        let e = build_chunk(vec![raw(Some("yesterday"), "info", "", "x")]).unwrap_err();
        assert!(e.to_string().starts_with("entry 0: timestamp"), "{e}");
        let mut bad_meta = raw(None, "info", "", "x");
        bad_meta.metadata = Some(RawValue::from_string("[1]".into()).unwrap());
        assert!(build_chunk(vec![bad_meta]).is_err());
    }

    #[test]
    fn metadata_nests_at_most_64_levels() {
        let nested = |levels: usize| {
            let mut s = "{\"a\":".repeat(levels);
            s.push('1');
            s.push_str(&"}".repeat(levels));
            s
        };
        assert_eq!(json_depth(nested(64).as_bytes()), 64);
        // Brackets inside strings (escaped quotes included) do not count.
        assert_eq!(json_depth(br#"{"k":"[{\"[[","l":[[]]}"#), 3);
        let mut ok = raw(None, "info", "", "x");
        ok.metadata = Some(RawValue::from_string(nested(64)).unwrap());
        let mut deep = raw(None, "info", "", "x");
        let mut text = nested(64);
        text.insert(5, '[');
        text.insert(text.len() - 1, ']');
        deep.metadata = Some(RawValue::from_string(text).unwrap());
        assert!(build_chunk(vec![ok]).is_ok());
        let e = build_chunk(vec![raw(None, "info", "", "y"), deep]).unwrap_err();
        assert!(
            e.to_string().starts_with("entry 1: metadata: nested"),
            "{e}"
        );
    }
}
