//! The OpenAPI 3.1 document, generated from the route table at start-up, so every route that
//! exists is in it and nothing else is.

use serde_json::{Map, Value, json};

use crate::router::{RouteDef, Security};

pub fn document(routes: &[RouteDef]) -> Value {
    let mut paths = Map::new();
    for r in routes {
        let params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| {
                let name = name.trim_start_matches('*');
                let schema = if name.ends_with("_id") {
                    json!({"type": "integer"})
                } else {
                    json!({"type": "string"})
                };
                json!({"name": name, "in": "path", "required": true, "schema": schema})
            })
            .collect();
        let mut op = Map::new();
        op.insert("operationId".into(), json!(format!("{:?}", r.op)));
        op.insert("summary".into(), json!(r.summary));
        op.insert("tags".into(), json!([r.tag]));
        if !params.is_empty() {
            op.insert("parameters".into(), Value::Array(params));
        }
        if r.body {
            op.insert(
                "requestBody".into(),
                json!({"required": true, "content": {"application/json": {"schema": {"type": "object"}}}}),
            );
        }
        let mut responses = Map::new();
        let ok = if r.status == 204 {
            json!({"description": "No content"})
        } else {
            json!({"description": "Success", "content": {"application/json": {"schema": {}}}})
        };
        responses.insert(r.status.to_string(), ok);
        let err = json!({"$ref": "#/components/responses/Error"});
        match r.security {
            Security::None => {
                op.insert("security".into(), json!([]));
            }
            Security::Bearer => {
                op.insert("security".into(), json!([{"bearer": []}, {"apiKey": []}]));
                for s in ["401", "403", "429"] {
                    responses.insert(s.into(), err.clone());
                }
            }
            Security::ProjectSecret => {
                op.insert("security".into(), json!([{"projectSecret": []}]));
                for s in ["401", "429"] {
                    responses.insert(s.into(), err.clone());
                }
            }
            Security::Jwt => {
                op.insert("security".into(), json!([{"bearer": []}]));
                for s in ["401", "403", "429"] {
                    responses.insert(s.into(), err.clone());
                }
            }
        }
        if r.body {
            for s in ["400", "413", "422"] {
                responses.insert(s.into(), err.clone());
            }
        }
        op.insert("responses".into(), Value::Object(responses));
        let entry = paths
            .entry(r.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(r.method.as_str().to_lowercase(), Value::Object(op));
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
                "projectSecret": {"type": "apiKey", "in": "header", "name": "X-Project-Secret"}
            },
            "responses": {
                "Error": {
                    "description": "Error envelope",
                    "content": {"application/json": {"schema": {
                        "type": "object",
                        "required": ["detail", "status_code"],
                        "properties": {
                            "detail": {"type": "string"},
                            "status_code": {"type": "integer"},
                            "retry_after": {"type": "integer"}
                        }
                    }}}
                }
            }
        }
    })
}
