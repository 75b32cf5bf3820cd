//! Rules: functions and types that decide, and never write. Handles and writers call them;
//! they import neither (`tests/layering.rs` lets them use only other rules and `error`,
//! `versions`, `clock`, `text`), so a rule is tested without an actor or a server. Some read
//! the store; none writes it.
//!
//! This file holds the input formats (slugs, e-mail addresses, names, passwords, labels,
//! heartbeat metrics, artifact paths, tags) and the per-entity bounds, each failing with a 422
//! that names the field. The children: `deployments` (what blocks a package, its targets, its
//! transitions), `rollouts` (phase plans, phase membership, the gate), `configurations` and
//! `config_files` (lineage, the five file formats, schema checks, what the quota counts),
//! `blob_keys`, `alert_conditions`, `notifications` (integration configs and wire formats),
//! `targets` (outbound addresses), `backtest` (replay with the live evaluator's semantics),
//! and `schemas` and `whole` (the formats as the OpenAPI document states them).
//!
//! Invariant: a format enforced here and the JSON Schema `schemas` publishes for it agree; the
//! unit tests in `schemas` hold each schema to its function on the same strings. Unit tests
//! sit beside the rules, in this file and most children.

pub mod alert_conditions;
pub mod backtest;
pub mod blob_keys;
pub mod config_files;
pub mod configurations;
pub mod deployments;
pub mod notifications;
pub mod rollouts;
pub mod schemas;
pub mod targets;
pub mod whole;

use crate::error::{Error, Result};

/// `[a-z0-9][a-z0-9-]{0,62}`.
pub fn slug(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && b == b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::unprocessable(
            field,
            "must match [a-z0-9][a-z0-9-]{0,62}",
        ))
    }
}

/// A plausible address: at most 254 characters, no whitespace, a non-empty local part and a
/// domain that neither starts nor ends with a dot; kept in lower case.
pub fn email(field: &str, s: &str) -> Result<String> {
    let long = s.chars().count() > 254;
    let s = s.to_lowercase();
    let valid = !long
        && !s.chars().any(char::is_whitespace)
        && match s.split_once('@') {
            Some((local, domain)) => {
                !local.is_empty()
                    && !domain.is_empty()
                    && !domain.contains('@')
                    && !domain.starts_with('.')
                    && !domain.ends_with('.')
            }
            None => false,
        };
    if valid {
        Ok(s)
    } else {
        Err(Error::unprocessable(field, "not a valid e-mail address"))
    }
}

/// A display name: 1 to `max` characters, not all whitespace; kept trimmed.
pub fn name(field: &str, s: &str, max: usize) -> Result<String> {
    let t = s.trim();
    if t.is_empty() || s.chars().count() > max {
        return Err(Error::unprocessable(
            field,
            format!("must be 1 to {max} characters"),
        ));
    }
    Ok(t.to_string())
}

pub fn password(field: &str, s: &str) -> Result<()> {
    if s.is_empty() || s.chars().count() > 1024 {
        return Err(Error::unprocessable(field, "must be 1 to 1024 characters"));
    }
    Ok(())
}

/// Device labels: at most 64, keys 1-128 characters, values up to 256.
pub fn labels(labels: &std::collections::BTreeMap<String, String>) -> Result<()> {
    if labels.len() > 64 {
        return Err(Error::unprocessable("labels", "at most 64 labels"));
    }
    for (k, v) in labels {
        if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 {
            return Err(Error::unprocessable(
                "labels",
                "keys must be 1-128 characters and values at most 256",
            ));
        }
    }
    Ok(())
}

/// Heartbeat metrics: at most 256, names of 1 to 128 characters.
pub fn metrics(m: &std::collections::BTreeMap<String, f64>) -> Result<()> {
    if m.len() > 256 || m.keys().any(|k| k.is_empty() || k.chars().count() > 128) {
        return Err(Error::unprocessable(
            "metrics",
            "at most 256 metrics with names of 1-128 characters",
        ));
    }
    Ok(())
}

/// An artifact path: relative, `/`-separated, at most 1024 bytes, without `..`, `.`, empty
/// segments, backslashes or NUL (400 otherwise: it does not parse as a path).
pub fn artifact_path(s: &str) -> Result<()> {
    let bad = s.is_empty()
        || s.len() > 1024
        || s.starts_with('/')
        || s.contains('\\')
        || s.contains('\0')
        || s.split('/')
            .any(|seg| seg.is_empty() || seg == ".." || seg == ".");
    if bad {
        Err(Error::BadRequest(
            "Invalid artifact path: relative, '/'-separated, without '..', empty segments, backslashes or NUL".into(),
        ))
    } else {
        Ok(())
    }
}

/// Tags one session may carry.
pub const MAX_TAGS: usize = 64;
/// Devices one group may hold.
pub const MAX_GROUP_MEMBERS: usize = 10_000;
/// Integrations or device groups one alert rule may name.
pub const MAX_RULE_REFS: usize = 100;

/// At most `max` items in `field` (422 naming it beyond).
pub fn at_most(field: &str, n: usize, max: usize) -> Result<()> {
    if n > max {
        return Err(Error::unprocessable(field, format!("at most {max} items")));
    }
    Ok(())
}

/// A session tag: 1-64 characters of `[A-Za-z0-9._:-]`.
pub fn tag(field: &str, s: &str) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::unprocessable(
            field,
            "tags are 1-64 characters of [A-Za-z0-9._:-]",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        assert!(slug("s", "a").is_ok());
        assert!(slug("s", "robot-fleet-01").is_ok());
        assert!(slug("s", &"a".repeat(63)).is_ok());
        assert!(slug("s", &"a".repeat(64)).is_err());
        assert!(slug("s", "-a").is_err());
        assert!(slug("s", "A").is_err());
        assert!(slug("s", "").is_err());
        assert!(slug("s", "a_b").is_err());
    }

    #[test]
    fn artifact_paths() {
        for ok in ["a.txt", "logs/run 1/out.mcap", "download", "a..b"] {
            assert!(artifact_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/",
            "a\\b",
            "a\0b",
            "./a",
        ] {
            assert!(artifact_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn emails() {
        assert_eq!(email("e", "A@B.io").unwrap(), "a@b.io");
        // Whitespace anywhere is refused, as the OpenAPI pattern says.
        assert!(email("e", " a@b.io").is_err());
        assert!(email("e", "admin@localhost").is_ok());
        assert!(email("e", "nope").is_err());
        assert!(email("e", "a@@b").is_err());
        assert!(email("e", "a b@c").is_err());
    }
}
