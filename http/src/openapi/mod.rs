//! The OpenAPI 3.1 document, generated from the route table at start-up, so every route that
//! exists is in it and nothing else is.
//!
//! Most of what an operation answers follows from the table: its security (401, 403, 429), its
//! path parameters (400 for a path that does not decode, 404 for the organization, project or
//! record they name) and its body (400, 408, 413, 422, and 503 for the shared body budget). The rest (other successes, 409, 503, query
//! validation, bodies that are not JSON) is decided per operation in [`doc`], one exhaustive
//! match, so that a new operation does not compile until it is described.

use std::collections::{BTreeMap, BTreeSet};

use fleetops_actors::{alerts, auth, backup, logs, pipeline, views, webhooks};
use schemars::generate::SchemaSettings;
use schemars::transform::RecursiveTransform;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::error::ErrorEnvelope;
use crate::handlers::{
    accounts, capsules, configurations, deployments as deploy, devices, links, ops, sessions,
    updates, webhooks as hooks,
};
use crate::router::{Op, RouteDef, Security};

/// `tiers` are the configured tier names, the values an organization's `tier` may take.
pub fn document(routes: &[RouteDef], tiers: &[String]) -> Value {
    let mut paths = Map::new();
    let ids = operation_ids(routes);
    let (mut res_gen, mut req_gen) = (generator(true), generator(false));
    let error_schema = ty::<ErrorEnvelope>(&mut res_gen).to_value();
    // Request bodies by (path, method), given their schemas once every name is known.
    let mut requests: Vec<(String, String, Value)> = Vec::new();
    for (r, id) in routes.iter().zip(ids) {
        let d = doc(r.op);
        let body = req_body(r, &d);
        let (req_t, res_t) = types(r.op);
        let res_schema = res_t.map(|f| f(&mut res_gen).to_value());
        let params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| match name.strip_prefix('*') {
                Some(n) => param(n, true),
                None => param(name, false),
            })
            .collect();
        let mut params = params;
        params.extend(query(r.op));
        if r.op == Op::LiveLogs {
            params.extend(handshake_headers());
        }
        if r.op == Op::AppendLogs {
            params.push(json!({"name": "X-Batch-Sequence", "in": "header", "required": false,
                "description": "The sender's number for this batch, rising within the session: a number the session already stored is answered 202 with `duplicate: true`, and nothing is stored again",
                "schema": {"type": "integer", "minimum": 1, "maximum": 9_007_199_254_740_991_u64}}));
        }
        let mut op = Map::new();
        op.insert("operationId".into(), json!(id));
        op.insert("summary".into(), json!(r.summary));
        op.insert("tags".into(), json!([r.tag]));
        if !params.is_empty() {
            op.insert("parameters".into(), Value::Array(params));
        }
        if let Some(b) = request_body(body, req_t.map(|f| f(&mut req_gen).to_value())) {
            requests.push((openapi_path(r.path), r.method.as_str().to_lowercase(), b));
        }
        let security = match r.security {
            Security::None if r.op == Op::Metrics => json!([{}, {"metricsToken": []}]),
            Security::None => json!([]),
            Security::Bearer => json!([{"bearer": []}, {"apiKey": []}]),
            Security::ProjectSecret => json!([{"projectSecret": []}]),
            Security::Jwt => json!([{"bearer": []}]),
            Security::Device => json!([{"deviceToken": []}]),
            Security::Enrollment => json!([{"enrollmentToken": []}]),
        };
        op.insert("security".into(), security);
        let (ok, err) = statuses(r, &d, body);
        let mut responses = Map::new();
        for s in ok {
            responses.insert(s.to_string(), success(s, d.media, res_schema.as_ref()));
        }
        for s in err {
            responses.insert(s.to_string(), error_ref(s));
        }
        responses.insert("default".into(), error_ref(500));
        op.insert("responses".into(), Value::Object(responses));
        let entry = paths
            .entry(openapi_path(r.path))
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(r.method.as_str().to_lowercase(), Value::Object(op));
        }
    }
    add_links(routes, &mut paths);
    // One set of names: a request schema whose name a different response schema took gets
    // `Input` appended.
    let mut schemas = res_gen.take_definitions(true);
    let mut renamed = BTreeMap::new();
    let req_defs = req_gen.take_definitions(true);
    // A request schema that differs from the response schema of its name, or refers to one
    // that does, is renamed (until nothing changes); a response schema is never replaced.
    loop {
        let before = renamed.len();
        for (name, v) in &req_defs {
            let mut v = v.clone();
            rename_refs(&mut v, &renamed);
            if schemas.get(name).is_some_and(|existing| *existing != v) {
                renamed.insert(name.clone(), format!("{name}Input"));
            }
        }
        if renamed.len() == before {
            break;
        }
    }
    for (name, mut v) in req_defs {
        rename_refs(&mut v, &renamed);
        let name = renamed.get(&name).cloned().unwrap_or(name);
        schemas.entry(name).or_insert(v);
    }
    for body in ["CreateOrganization", "PatchOrganization"] {
        if let Some(Value::Object(p)) = schemas.get_mut(body).and_then(|s| s.get_mut("properties"))
        {
            p.insert("tier".into(), json!({"type": ["string", "null"], "enum": tiers.iter().map(|t| Value::from(t.as_str())).chain([Value::Null]).collect::<Vec<_>>()}));
        }
    }
    for (path, method, mut b) in requests {
        rename_refs(&mut b, &renamed);
        if let Some(Value::Object(op)) = paths.get_mut(&path).and_then(|p| p.get_mut(&method)) {
            op.insert("requestBody".into(), b);
        }
    }
    integration_union(&mut schemas);
    for s in schemas.values_mut() {
        generator_friendly(s);
    }
    for item in paths.values_mut() {
        schemas_in_operations(item);
    }
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": error_schema.clone()}}
        })
    };
    let retry_after = json!({
        "description": "Seconds to wait before retrying",
        "schema": {"type": "integer"}
    });
    let mut upgrade_required =
        error("WebSocket version other than 13; `Sec-WebSocket-Version` names the one spoken");
    if let Value::Object(m) = &mut upgrade_required {
        m.insert(
            "headers".into(),
            json!({"Sec-WebSocket-Version": {"schema": {"type": "string", "const": "13"}}}),
        );
    }
    let mut rate_limited = error("Rate limit exceeded; the body adds `retry_after`");
    let mut unavailable = error("Temporarily unavailable (overloaded, restarting or not durable)");
    for r in [&mut rate_limited, &mut unavailable] {
        if let Value::Object(m) = r {
            m.insert(
                "headers".into(),
                json!({"Retry-After": retry_after.clone()}),
            );
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "fleetops",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Operate fleets of robots: devices, sessions, logs, deployments, webhooks, alerts."
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "JWT, API key (fops_...) or device token (fopsd_...)"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "projectSecret": {"type": "apiKey", "in": "header", "name": "X-Project-Secret"},
                "enrollmentToken": {"type": "http", "scheme": "bearer", "description": "A project's enrollment token (fopse_...), made by an admin; a robot registers itself with it"},
                "deviceToken": {"type": "http", "scheme": "bearer", "description": "The device's own token (fopsd_...), also taken in X-API-Key; a user's JWT or API key is 403"},
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "`[http] metrics_token`, when configured"}
            },
            "schemas": schemas,
            "responses": {
                "BadRequest": error("A body, header, path or parameter that does not parse"),
                "Unauthorized": error("Missing, invalid or expired credentials"),
                "Forbidden": error("Not enough permissions"),
                "NotFound": error("The organization, project or record does not exist"),
                "Conflict": error("Duplicate, state transition not allowed, or still referenced"),
                "RequestTimeout": error("The request body did not arrive within [http] body_timeout_seconds"),
                "TooLarge": error("Request body over the limit, or over the storage quota"),
                "RangeNotSatisfiable": error("The Range cannot be satisfied"),
                "Unprocessable": error("Parsed input that breaks a rule; `detail` names the field"),
                "UpgradeRequired": upgrade_required,
                "RateLimited": rate_limited,
                "Unavailable": unavailable,
                "InsufficientStorage": error("The data directory is below [storage] min_free_bytes (or full): nothing was written; reads and deletes still work"),
                "Error": error("Any other error (an internal fault is 500)")
            }
        }
    })
}

mod answers;
mod paths;
mod query;
mod schemas;
mod types;

use answers::*;
use paths::*;
pub use paths::{openapi_path, operation_ids};
use query::*;
use schemas::*;
use types::*;

#[cfg(test)]
mod tests;
