//! The input formats of [`super`] as JSON Schemas, for the OpenAPI document: a request field
//! names its format with `#[schemars(schema_with = "...")]`, and the tests below hold each
//! schema to the function that enforces it, so a value the schema admits is one the server
//! takes, and one it refuses the server refuses too.
//!
//! Patterns use only what ECMA-262, Rust's `regex` and the validators of API testing tools
//! read alike (no `\s`, `\d` or `\w`, whose meanings differ between them).

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

/// The characters Rust's `str::trim` removes (Unicode White_Space), as a class body.
const WS: &str = r"\t\n\u000B\f\r \u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000";

/// Longest display name, in characters.
pub const NAME_MAX: usize = 200;

fn not_blank() -> String {
    format!("[^{WS}]")
}

fn email_pattern() -> String {
    format!("^[^@{WS}]+@[^@.{WS}]([^@{WS}]*[^@.{WS}])?$")
}

/// An anchored pattern, and no newline at the end: Python's `re` (which some API tools
/// generate from) lets `$` match before a final newline, where ECMA-262 and Rust do not.
fn exact(pattern: &str) -> Value {
    json!({"type": "string", "pattern": pattern, "not": {"pattern": "\\n$"}})
}

fn with(mut v: Value, extra: Value) -> Value {
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v
}

/// Schemas of optional fields also take `null` (serde reads it as absent).
fn nullable(mut s: Value) -> Schema {
    if let Some(t) = s.get("type").cloned()
        && let Value::Object(m) = &mut s
    {
        m.insert("type".into(), json!([t, "null"]));
    }
    Schema::try_from(s).unwrap_or_default()
}

fn name_value() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": NAME_MAX, "pattern": not_blank()})
}

/// A display name: 1 to 200 characters, not all whitespace (see [`super::name`]).
pub fn name(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(name_value()).unwrap_or_default()
}

pub fn opt_name(_: &mut SchemaGenerator) -> Schema {
    nullable(name_value())
}

fn slug_value() -> Value {
    exact("^[a-z0-9][a-z0-9-]{0,62}$")
}

/// See [`super::slug`].
pub fn slug(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(slug_value()).unwrap_or_default()
}

/// See [`super::email`] (compared without case).
pub fn email(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(with(exact(&email_pattern()), json!({"maxLength": 254}))).unwrap_or_default()
}

/// See [`super::password`].
pub fn password(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "minLength": 1, "maxLength": 1024})
}

fn labels_value() -> Value {
    json!({
        "type": "object",
        "maxProperties": 64,
        "propertyNames": {"minLength": 1, "maxLength": 128},
        "additionalProperties": {"type": "string", "maxLength": 256}
    })
}

/// See [`super::labels`].
pub fn labels(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(labels_value()).unwrap_or_default()
}

pub fn opt_labels(_: &mut SchemaGenerator) -> Schema {
    nullable(labels_value())
}

/// Heartbeat metrics: at most 256, names of 1 to 128 characters.
pub fn metrics(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": 256,
        "propertyNames": {"minLength": 1, "maxLength": 128},
        "additionalProperties": {"type": "number"}
    })
}

/// The tag pattern of [`super::tag`].
pub const TAG: &str = "^[A-Za-z0-9._:-]{1,64}$";

pub fn tag(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(exact(TAG)).unwrap_or_default()
}

/// A session's tags: at most [`super::MAX_TAGS`].
pub fn tags(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "array", "maxItems": super::MAX_TAGS, "items": exact(TAG)})
}

/// A repository as the host spells it, `owner/name` (see `webhooks::dispatcher`).
pub const FULL_NAME: &str = "^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$";

pub fn full_name(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(with(exact(FULL_NAME), json!({"maxLength": 200}))).unwrap_or_default()
}

/// A full commit id: 40 (SHA-1) or 64 (SHA-256) hexadecimal characters.
pub fn commit_sha(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(json!({"type": "string", "pattern": "^([0-9a-fA-F]{40}|[0-9a-fA-F]{64})$"}))
        .unwrap_or_default()
}

fn branch_patterns_value() -> Value {
    json!({
        "type": "array", "minItems": 1, "maxItems": 32,
        "items": with(exact(&format!("^[^{WS}]+$")), json!({"minLength": 1, "maxLength": 255}))
    })
}

/// Branch patterns: 1 to 32, each 1 to 255 characters without whitespace.
pub fn opt_branch_patterns(_: &mut SchemaGenerator) -> Schema {
    nullable(branch_patterns_value())
}

/// A strict `MAJOR.MINOR.PATCH` (see `versions::parse_version`).
pub const VERSION: &str = r"^(0|[1-9][0-9]{0,17})\.(0|[1-9][0-9]{0,17})\.(0|[1-9][0-9]{0,17})$";

pub fn version(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(exact(VERSION)).unwrap_or_default()
}

/// A capsule name (see `pipeline::capsule_name`).
pub const CAPSULE_NAME: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$";

pub fn capsule_name(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(exact(CAPSULE_NAME)).unwrap_or_default()
}

/// A configuration's environment (see `pipeline::configurations`).
pub fn environment(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(exact("^[A-Za-z0-9._-]{1,64}$")).unwrap_or_default()
}

/// A log level: `debug`, `info`, `warn` (or `warning`), `error`, in any case.
pub fn level(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(exact(
        "^([Dd][Ee][Bb][Uu][Gg]|[Ii][Nn][Ff][Oo]|[Ww][Aa][Rr][Nn]([Ii][Nn][Gg])?|[Ee][Rr][Rr][Oo][Rr])$",
    ))
    .unwrap_or_default()
}

/// Ids of records: at most `N`.
pub fn ids<const N: usize>(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "array", "maxItems": N, "items": {"type": "integer", "minimum": 0, "maximum": u64::MAX}})
}

pub fn opt_ids<const N: usize>(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["array", "null"], "maxItems": N, "items": {"type": "integer", "minimum": 0, "maximum": u64::MAX}})
}

/// A size in bytes: at least 1 (at most `MAX`).
pub fn size<const MAX: u64>(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "integer", "minimum": 1, "maximum": MAX})
}

pub fn opt_size<const MAX: u64>(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["integer", "null"], "minimum": 1, "maximum": MAX})
}

/// A version constraint (`^1.2.0`, `>=1.0.0, <2.0.0`, `1.*`; see `versions::Constraint`).
pub fn constraint(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "minLength": 1})
}

/// How a runner finishes a test run.
pub fn run_result(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "enum": ["passed", "failed"]})
}

/// A hex SHA-256.
pub fn sha256(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(exact("^[0-9a-fA-F]{64}$")).unwrap_or_default()
}

/// A state a device may report on a package (every update state but the service's own
/// `retrying`).
pub fn reportable_state(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = fleetops_storage::UpdateState::ALL
        .iter()
        .filter(|s| s.reportable())
        .map(|s| s.as_str())
        .collect();
    json_schema!({"type": "string", "enum": names})
}

/// Free text of at most `N` characters.
pub fn text<const N: usize>(_: &mut SchemaGenerator) -> Schema {
    nullable(json!({"type": "string", "maxLength": N}))
}

/// A JSON Schema (an object, or `true`/`false`), or `null` for none.
pub fn opt_json_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["object", "boolean", "null"]})
}

/// Any JSON object, or `null` for none.
pub fn opt_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["object", "null"]})
}

/// An RFC 3339 time with `Z` or an offset.
pub fn opt_time(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["string", "null"], "format": "date-time"})
}

/// A deployment's targets: device ids, `{"group_id"}` or `{"labels"}` items.
pub fn targets(_: &mut SchemaGenerator) -> Schema {
    Schema::try_from(targets_value()).unwrap_or_default()
}

pub fn opt_targets(_: &mut SchemaGenerator) -> Schema {
    nullable(targets_value())
}

fn targets_value() -> Value {
    json!({
        "type": "array",
        "maxItems": super::deployments::MAX_TARGETS,
        "items": {"oneOf": [
            {"type": "integer", "minimum": 0, "maximum": u64::MAX},
            {"type": "object", "required": ["group_id"], "additionalProperties": false,
             "properties": {"group_id": {"type": "integer", "minimum": 0, "maximum": u64::MAX}}},
            {"type": "object", "required": ["labels"], "additionalProperties": false,
             "properties": {"labels": {"type": "object", "minProperties": 1,
                                       "additionalProperties": {"type": "string"}}}}
        ]}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_final_newline_slips_past_an_anchor() {
        for f in [
            slug,
            email,
            tag,
            full_name,
            version,
            capsule_name,
            environment,
            level,
            sha256,
        ] {
            let v = schema(f);
            let s = f(&mut SchemaGenerator::default()).to_value();
            assert!(s["not"]["pattern"].is_string(), "{s}");
            assert!(!v.is_valid(&json!("abc\n")));
        }
    }

    fn schema(f: fn(&mut SchemaGenerator) -> Schema) -> jsonschema::Validator {
        let mut g = SchemaGenerator::default();
        let s = f(&mut g).to_value();
        jsonschema::validator_for(&s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Strings near every edge of the formats: whitespace of every kind, separators, the
    /// characters Rust and ECMA-262 classify differently, lengths around each limit.
    fn samples() -> Vec<String> {
        let mut v: Vec<String> = [
            "",
            " ",
            "a",
            "A",
            "0",
            "-",
            "a-",
            "-a",
            "ab",
            "a b",
            " a",
            "a ",
            "\u{FEFF}",
            "\u{1C}",
            "\u{85}",
            "\u{A0}x",
            "x\u{3000}",
            "\t",
            "a\n",
            "\na",
            "é",
            "a@b",
            "a@b.c",
            "@b",
            "a@",
            "a@.b",
            "a@b.",
            "a@@b",
            "a b@c",
            "A@B.C",
            "a@b@c",
            "x@y",
            "owner/name",
            "o/n/x",
            "/n",
            "o/",
            "o.-_/n.-_",
            "a:b",
            "a.b_c:d-e",
            "release/*",
            "1.2.3",
            "01.2.3",
            "1.2",
            "a\u{0}b",
            "ü@ü",
            "\u{2028}",
            "\u{1680}",
            "a\u{200B}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for n in [
            62, 63, 64, 65, 127, 128, 129, 199, 200, 201, 254, 255, 256, 1024, 1025,
        ] {
            v.push("a".repeat(n));
            v.push("é".repeat(n));
            v.push(format!("{}@b", "a".repeat(n.saturating_sub(2))));
            v.push(format!(" {}", "a".repeat(n.saturating_sub(1))));
        }
        v
    }

    /// The schema admits exactly what the rule takes.
    fn agree(f: fn(&mut SchemaGenerator) -> Schema, rule: impl Fn(&str) -> bool) {
        let s = schema(f);
        for x in samples() {
            assert_eq!(
                s.is_valid(&json!(x)),
                rule(&x),
                "{x:?}: schema and rule disagree"
            );
        }
    }

    #[test]
    fn string_formats_match_their_rules() {
        agree(name, |x| super::super::name("n", x, NAME_MAX).is_ok());
        agree(slug, |x| super::super::slug("s", x).is_ok());
        agree(email, |x| super::super::email("e", x).is_ok());
        agree(password, |x| super::super::password("p", x).is_ok());
        agree(tag, |x| super::super::tag("t", x).is_ok());
        agree(full_name, |x| {
            crate::webhooks::dispatcher::check_full_name(x).is_ok()
        });
        agree(version, |x| crate::versions::parse_version("v", x).is_ok());
        agree(capsule_name, |x| {
            crate::pipeline::capsule_name("c", x).is_ok()
        });
    }

    #[test]
    fn maps_and_lists_match_their_rules() {
        let l = schema(labels);
        let m = schema(metrics);
        let b = schema(opt_branch_patterns);
        for x in samples() {
            let map = std::collections::BTreeMap::from([(x.clone(), x.clone())]);
            assert_eq!(
                l.is_valid(&json!(map)),
                super::super::labels(&map).is_ok(),
                "labels {x:?}"
            );
            assert_eq!(
                m.is_valid(&json!({ &x: 1.5 })),
                super::super::metrics(&std::collections::BTreeMap::from([(x.clone(), 1.5)]))
                    .is_ok(),
                "metrics {x:?}"
            );
            assert_eq!(
                b.is_valid(&json!([x])),
                crate::webhooks::dispatcher::check_patterns(std::slice::from_ref(&x)).is_ok(),
                "branch pattern {x:?}"
            );
        }
        assert!(!b.is_valid(&json!([])));
        assert!(b.is_valid(&Value::Null));
    }
}
