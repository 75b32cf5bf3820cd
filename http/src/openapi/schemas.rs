//! The generator's settings and the passes over the generated schemas (integer ranges, the
//! integration union, what client generators need, renamed references).

use super::*;

/// Schemas under `components/schemas`, as they serialize (responses) or deserialize
/// (requests): a field with a default is optional in a request and present in a response.
pub(super) fn generator(serialize: bool) -> SchemaGenerator {
    let s = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .with_transform(RecursiveTransform(integer_range));
    if serialize {
        s.for_serialize().into_generator()
    } else {
        s.for_deserialize().into_generator()
    }
}

/// The range of a fixed-width integer, which schemars names only by `format`: past it the
/// server refuses the number (422), so the document bounds it.
pub(super) fn integer_range(s: &mut Schema) {
    let (min, max): (Value, Value) = match s.get("format").and_then(Value::as_str) {
        Some("uint64" | "uint") => (0.into(), u64::MAX.into()),
        Some("uint32") => (0.into(), u32::MAX.into()),
        Some("uint16") => (0.into(), u16::MAX.into()),
        Some("uint8") => (0.into(), u8::MAX.into()),
        Some("int64" | "int") => (i64::MIN.into(), i64::MAX.into()),
        Some("int32") => (i32::MIN.into(), i32::MAX.into()),
        _ => return,
    };
    let m = s.ensure_object();
    m.entry("minimum").or_insert(min);
    m.entry("maximum").or_insert(max);
}

/// An integration request as client generators read unions: one named object per `type`
/// (its config a named schema too), joined by `oneOf` with a discriminator on `type`.
pub(super) fn integration_union(schemas: &mut Map<String, Value>) {
    let Some(Value::Object(base)) = schemas.remove("IntegrationRequest") else {
        return;
    };
    let base_props = base.get("properties").cloned().unwrap_or_else(|| json!({}));
    let required = base.get("required").cloned().unwrap_or_else(|| json!([]));
    let (mut one_of, mut mapping) = (Vec::new(), Map::new());
    for (kind, config) in fleetops_actors::rules::notifications::config_schemas() {
        let title = {
            let mut c = kind.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        };
        let (request, config_name) = (
            format!("{title}IntegrationRequest"),
            format!("{title}IntegrationConfig"),
        );
        let mut props = base_props.clone();
        if let Value::Object(p) = &mut props {
            p.insert("type".into(), json!({"type": "string", "enum": [kind]}));
            p.insert(
                "config".into(),
                json!({"$ref": format!("#/components/schemas/{config_name}")}),
            );
        }
        schemas.insert(config_name, config);
        schemas.insert(
            request.clone(),
            json!({"type": "object", "required": required, "properties": props}),
        );
        let r = format!("#/components/schemas/{request}");
        mapping.insert(kind.into(), Value::from(r.clone()));
        one_of.push(json!({"$ref": r}));
    }
    schemas.insert(
        "IntegrationRequest".into(),
        json!({"oneOf": one_of, "discriminator": {"propertyName": "type", "mapping": mapping}}),
    );
}

/// A schema as client generators take it: the boolean schema `true` (anything) written `{}`
/// and `false` as `{"not": {}}` (`additionalProperties` keeps its boolean), and an array
/// that says nothing of its items saying so with `items: {}`.
pub(super) fn generator_friendly(s: &mut Value) {
    const ONE: [&str; 12] = [
        "items",
        "additionalProperties",
        "not",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contentSchema",
        "additionalItems",
    ];
    const MANY: [&str; 4] = [
        "properties",
        "patternProperties",
        "$defs",
        "dependentSchemas",
    ];
    const LISTS: [&str; 4] = ["allOf", "anyOf", "oneOf", "prefixItems"];
    match s {
        Value::Bool(true) => *s = json!({}),
        Value::Bool(false) => *s = json!({"not": {}}),
        Value::Object(m) => {
            let is_array = match m.get("type") {
                Some(Value::String(t)) => t == "array",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "array"),
                _ => false,
            };
            if is_array && !m.contains_key("items") && !m.contains_key("prefixItems") {
                m.insert("items".into(), json!({}));
            }
            for (k, v) in m.iter_mut() {
                if ONE.contains(&k.as_str()) {
                    if !(k == "additionalProperties" && v.is_boolean()) {
                        generator_friendly(v);
                    }
                } else if MANY.contains(&k.as_str()) {
                    if let Value::Object(each) = v {
                        each.values_mut().for_each(generator_friendly);
                    }
                } else if LISTS.contains(&k.as_str())
                    && let Value::Array(each) = v
                {
                    each.iter_mut().for_each(generator_friendly);
                }
            }
        }
        _ => {}
    }
}

/// [`generator_friendly`] for every `schema` of a path item's operations (parameters,
/// bodies, responses, headers).
pub(super) fn schemas_in_operations(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "schema" {
                    generator_friendly(x);
                } else {
                    schemas_in_operations(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(schemas_in_operations),
        _ => {}
    }
}

/// Rewrites `$ref`s to renamed request schemas.
pub(super) fn rename_refs(v: &mut Value, renamed: &BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match x {
                    Value::String(r) if k == "$ref" => {
                        if let Some(name) = r.strip_prefix("#/components/schemas/")
                            && let Some(new) = renamed.get(name)
                        {
                            *r = format!("#/components/schemas/{new}");
                        }
                    }
                    _ => rename_refs(x, renamed),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rename_refs(x, renamed)),
        _ => {}
    }
}
