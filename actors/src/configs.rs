//! Configuration files: parsing the five formats into a JSON object, inheritance by deep
//! merge (with the provenance `explain` shows), and JSON Schema checks located by JSON
//! Pointer. Pure functions; the pipeline handle and the project's actor call them.

use serde_json::{Map, Value};

/// Configuration files are at most this large (contract section 5).
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The file formats a configuration may have.
pub const FORMATS: [&str; 5] = [".json", ".yaml", ".toml", ".ini", ".env"];

/// Parses a configuration file into a JSON object; the error is the parser's message.
pub fn parse(format: &str, bytes: &[u8]) -> Result<Map<String, Value>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let v: Value = match format {
        ".json" => serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?,
        ".yaml" => yaml(text)?,
        ".toml" => {
            let t: toml::Table = toml::from_str(text).map_err(|e| format!("invalid TOML: {e}"))?;
            serde_json::to_value(t).map_err(|e| format!("invalid TOML: {e}"))?
        }
        ".ini" => ini(text)?,
        ".env" => env(text)?,
        other => return Err(format!("unknown file format {other}")),
    };
    match v {
        Value::Object(m) => Ok(m),
        Value::Null if format == ".yaml" => Ok(Map::new()),
        _ => Err("the top level must be a mapping of keys to values".into()),
    }
}

/// YAML with anchors and aliases refused (no alias bombs, no shared nodes) and the parser's
/// own budget against hostile input.
fn yaml(text: &str) -> Result<Value, String> {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_aliases = 0;
    budget.max_anchors = 0;
    budget.max_documents = 1;
    let mut opts = serde_saphyr::Options::default();
    opts.budget = Some(budget);
    serde_saphyr::from_str_with_options::<Value>(text, opts)
        .map_err(|e| format!("invalid YAML: {e}"))
}

/// `.ini` as `{section: {key: "value"}}`; keys before any section stay at the top level.
fn ini(text: &str) -> Result<Value, String> {
    let parsed = ini::Ini::load_from_str(text).map_err(|e| format!("invalid INI: {e}"))?;
    let mut out = Map::new();
    for (section, props) in parsed.iter() {
        let mut m = Map::new();
        for (k, v) in props.iter() {
            m.insert(k.to_string(), Value::String(v.to_string()));
        }
        match section {
            None => out.extend(m),
            Some(s) => match out.get_mut(s) {
                Some(Value::Object(existing)) => existing.extend(m),
                _ => {
                    out.insert(s.to_string(), Value::Object(m));
                }
            },
        }
    }
    Ok(Value::Object(out))
}

/// `.env` as `{KEY: "value"}` (dotenv syntax: quotes, comments, `export`; no expansion from
/// the server's own environment).
fn env(text: &str) -> Result<Value, String> {
    let mut out = Map::new();
    for item in dotenvy::from_read_iter(text.as_bytes()) {
        let (k, v) = item.map_err(|e| format!("invalid .env: {e}"))?;
        out.insert(k, Value::String(v));
    }
    Ok(Value::Object(out))
}

/// Deep merge: objects merge key by key; anything else in `over` replaces `base`.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

/// Escapes one JSON Pointer token (RFC 6901).
fn token(k: &str) -> String {
    k.replace('~', "~0").replace('/', "~1")
}

/// The leaves of `v` as (JSON Pointer, value); an empty object or an array is one leaf.
pub fn leaves(v: &Value) -> Vec<(String, Value)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    walk(&format!("{prefix}/{}", token(k)), x, out);
                }
            }
            _ => out.push((prefix.to_string(), v.clone())),
        }
    }
    let mut out = Vec::new();
    walk("", v, &mut out);
    out
}

/// A schema violation, located in the instance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SchemaError {
    /// JSON Pointer into `config_data` (`""` is the whole document).
    pub pointer: String,
    pub message: String,
}

/// Checks that a schema compiles (draft detected from `$schema`, 2020-12 otherwise); no
/// remote `$ref` is ever fetched.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err("must be a JSON Schema object".into());
    }
    jsonschema::validator_for(schema)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Every violation of `schema` by `instance`.
pub fn violations(schema: &Value, instance: &Value) -> Result<Vec<SchemaError>, String> {
    let v = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    Ok(v.iter_errors(instance)
        .take(100)
        .map(|e| SchemaError {
            pointer: e.instance_path().as_str().to_string(),
            message: e.to_string(),
        })
        .collect())
}

/// The notes a schema failure leaves on the configuration.
pub fn schema_notes(errors: &[SchemaError]) -> String {
    errors
        .iter()
        .map(|e| {
            let at = if e.pointer.is_empty() {
                "/"
            } else {
                &e.pointer
            };
            format!("schema violation at {at}: {}", e.message)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn five_formats() {
        let j = parse(".json", br#"{"a": {"b": 1}}"#).unwrap();
        assert_eq!(Value::Object(j), json!({"a": {"b": 1}}));
        let y = parse(".yaml", b"a:\n  b: 1\nlist: [1, 2]\n").unwrap();
        assert_eq!(Value::Object(y), json!({"a": {"b": 1}, "list": [1, 2]}));
        let t = parse(".toml", b"[a]\nb = 1\nc = \"x\"\n").unwrap();
        assert_eq!(Value::Object(t), json!({"a": {"b": 1, "c": "x"}}));
        let i = parse(".ini", b"top = 1\n[motor]\nspeed = 10\n").unwrap();
        assert_eq!(
            Value::Object(i),
            json!({"top": "1", "motor": {"speed": "10"}})
        );
        let e = parse(".env", b"# c\nA=1\nexport B=\"two words\"\n").unwrap();
        assert_eq!(Value::Object(e), json!({"A": "1", "B": "two words"}));
    }

    #[test]
    fn bad_files_say_why() {
        assert!(parse(".json", b"{").unwrap_err().contains("JSON"));
        assert!(parse(".json", b"[1]").unwrap_err().contains("top level"));
        assert!(parse(".toml", b"a = ").unwrap_err().contains("TOML"));
        assert!(parse(".yaml", b"a: [").unwrap_err().contains("YAML"));
        let alias = parse(".yaml", b"a: &x {b: 1}\nc: *x\n").unwrap_err();
        assert!(alias.contains("YAML"), "{alias}");
        assert!(parse(".env", b"A B C").is_err());
    }

    #[test]
    fn deep_merge_and_leaves() {
        let mut base = json!({"a": {"b": 1, "c": 2}, "l": [1], "s": "x"});
        merge(
            &mut base,
            &json!({"a": {"c": 3}, "l": [2], "n": {"x/y": 1}}),
        );
        assert_eq!(
            base,
            json!({"a": {"b": 1, "c": 3}, "l": [2], "s": "x", "n": {"x/y": 1}})
        );
        let l = leaves(&base);
        assert!(l.contains(&("/n/x~1y".to_string(), json!(1))));
        assert!(l.contains(&("/l".to_string(), json!([2]))));
    }

    #[test]
    fn schema_errors_are_located() {
        let schema = json!({"type": "object", "properties": {"motor": {"type": "object",
            "properties": {"speed": {"type": "integer", "maximum": 100}}}}});
        check_schema(&schema).unwrap();
        let errs = violations(&schema, &json!({"motor": {"speed": 500}})).unwrap();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].pointer, "/motor/speed");
        assert!(check_schema(&json!({"type": 5})).is_err());
    }
}
