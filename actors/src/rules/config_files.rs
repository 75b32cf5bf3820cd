//! Configuration files: parsing the five formats into a JSON object, inheritance by deep
//! merge (with the provenance `explain` shows), and JSON Schema checks located by JSON
//! Pointer. Pure functions; the pipeline handle and the project's actor call them.

use serde_json::{Map, Value};

/// Configuration files are at most this large (1 MiB; larger is 413 at upload-url).
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
            toml_json(toml::Value::Table(t))
        }
        ".ini" => ini(text)?,
        ".env" => env(text)?,
        other => return Err(format!("unknown file format {other}")),
    };
    if depth(&v) > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    match v {
        Value::Object(m) => Ok(m),
        Value::Null if format == ".yaml" => Ok(Map::new()),
        _ => Err("the top level must be a mapping of keys to values".into()),
    }
}

/// Configurations nest at most this deep (stored JSON must read back within serde_json's
/// own recursion limit).
pub const MAX_DEPTH: usize = 64;

/// Nesting depth, without recursion.
pub fn depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Object(m) => stack.extend(m.values().map(|x| (x, d + 1))),
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

/// TOML to JSON; dates and times become their RFC 3339 text.
fn toml_json(v: toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.into_iter().map(toml_json).collect()),
        toml::Value::Table(t) => {
            Value::Object(t.into_iter().map(|(k, v)| (k, toml_json(v))).collect())
        }
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

/// `.env` as `{KEY: "value"}`: `KEY=value`, optional `export `, `#` comments, single quotes
/// (literal) and double quotes (`\n`, `\"`, `\\` escapes). Written here rather than with
/// dotenvy because dotenvy substitutes `${VAR}` from the server's own environment, which
/// would let an uploaded file read the server's secrets.
fn env(text: &str) -> Result<Value, String> {
    let mut out = Map::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let bad = |why: &str| format!("invalid .env at line {}: {why}", n + 1);
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| bad("expected KEY=value"))?;
        let k = k.trim();
        let key_ok = k.bytes().enumerate().all(|(i, b)| {
            b == b'_' || b.is_ascii_alphabetic() || (i > 0 && (b.is_ascii_digit() || b == b'.'))
        });
        if k.is_empty() || !key_ok {
            return Err(bad(
                "a key is letters, digits, '_' and '.', not starting with a digit",
            ));
        }
        let v = v.trim_start();
        let value = if let Some(rest) = v.strip_prefix('\'') {
            let end = rest
                .find('\'')
                .ok_or_else(|| bad("unterminated single quote"))?;
            rest.get(..end).unwrap_or_default().to_string()
        } else if let Some(rest) = v.strip_prefix('"') {
            let mut s = String::new();
            let mut chars = rest.chars();
            let mut closed = false;
            while let Some(c) = chars.next() {
                match c {
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some(o) => s.push(o),
                        None => break,
                    },
                    o => s.push(o),
                }
            }
            if !closed {
                return Err(bad("unterminated double quote"));
            }
            s
        } else {
            let cut = v.find(" #").unwrap_or(v.len());
            v.get(..cut).unwrap_or_default().trim_end().to_string()
        };
        out.insert(k.to_string(), Value::String(value));
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
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
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
            message: crate::text::clip(&e.to_string(), 300),
        })
        .collect())
}

/// The notes a schema failure leaves on the configuration.
pub fn schema_notes(errors: &[SchemaError]) -> String {
    errors
        .iter()
        .take(20)
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
        let e = parse(
            ".env",
            b"# c\nA=1\nexport B=\"two words\"\nC='${HOME}' # x\nD=${HOME} # note\nE=\"a\\nb\"\n",
        )
        .unwrap();
        assert_eq!(
            Value::Object(e),
            json!({"A": "1", "B": "two words", "C": "${HOME}", "D": "${HOME}", "E": "a\nb"})
        );
        let t = parse(".toml", b"when = 1979-05-27T07:32:00Z\n").unwrap();
        assert_eq!(Value::Object(t), json!({"when": "1979-05-27T07:32:00Z"}));
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
        assert!(parse(".env", b"A=\"open").is_err());
        let deep = format!("{}1{}", "[".repeat(70), "]".repeat(70));
        let deep = format!("{{\"a\": {deep}}}");
        assert!(
            parse(".json", deep.as_bytes())
                .unwrap_err()
                .contains("deeper")
        );
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
