//! The OpenAPI 3.1 document, generated from the route table at start-up, so every route that
//! exists is in it and nothing else is.
//!
//! Most of what an operation answers follows from the table: its security (401, 403, 429), its
//! path parameters (400 for a path that does not decode, 404 for the organization, project or
//! record they name) and its body (400, 408, 413, 422, and 503 for the shared body budget). The rest (other successes, 409, 503, query
//! validation, bodies that are not JSON) is decided per operation in [`doc`], one exhaustive
//! match, so that a new operation does not compile until it is described.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::router::{Op, RouteDef, Security};

/// The request body an operation takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqBody {
    None,
    /// A JSON body (400 malformed, 413 over the limit, 422 invalid).
    Json,
    /// As [`ReqBody::Json`], and an empty body is allowed.
    OptionalJson,
    /// A JSON array or NDJSON, one entry a line.
    Logs,
    /// Bytes of this media type, stored or checked as they are (400 unreadable, 413 too large).
    Raw(&'static str),
}

/// What the route table does not say about an operation.
struct Doc {
    /// Successful statuses besides the table's.
    also: &'static [u16],
    /// Error statuses besides those that follow from security, path parameters and body.
    errors: &'static [u16],
    /// Media types of the success body; empty for none.
    media: &'static [&'static str],
    body: Option<ReqBody>,
}

const JSON: &[&str] = &["application/json"];

/// Answers JSON; `errors` besides the derived ones; the table says whether a JSON body is taken.
const fn answers(errors: &'static [u16]) -> Doc {
    Doc {
        also: &[],
        errors,
        media: JSON,
        body: None,
    }
}

/// Only what follows from the table.
const PLAIN: Doc = answers(&[]);
/// A list or query whose parameters are validated.
const QUERY: Doc = answers(&[422]);
/// A write through an actor: 503 when it is overloaded, restarting or the flush fails.
const WRITE: Doc = answers(&[503]);
/// A write that can conflict (duplicate, state, in use).
const WRITE_409: Doc = answers(&[409, 503]);

fn doc(op: Op) -> Doc {
    use Op::*;
    match op {
        // 503 naming the parts of the supervision tree that are down.
        Healthz => answers(&[503]),
        OpenApi => PLAIN,
        Metrics => Doc {
            media: &[
                "text/plain; version=0.0.4",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ],
            // `[http] metrics_token` is set and not given.
            ..answers(&[401])
        },
        // Bad credentials; the per-address limiter.
        Login => answers(&[401, 429]),
        Refresh | ListApiKeys | Me | ListOrgs | ListProjects | GetDevice | ListGroups
        | GetGroup | GetSession | ListFiles | GetCapsule | GetConfig | PlanDeployment
        | GetDeployment | ScmStatus | ScmInstallations | ScmDelivery | GetRepo | GetRun
        | ProjectDelivery | ListIntegrations | GetIntegration | ListAlertRules | GetAlertRule
        | GetAlert => PLAIN,
        OrgDevices | ListDevices | ListSessions | QueryLogs | ListCapsules | ListConfigs
        | ListDeployments | ScmDeliveries | ListRepos | ListRuns | ProjectDeliveries
        | ListAlerts => QUERY,
        CreateApiKey | DeleteApiKey | RotateSecret | CreateDevice | PatchDevice | DeleteDevice
        | CreateGroup | PatchGroup | DeleteGroup | CreateSession | DeleteSession | AddTag
        | RemoveTag | ScmRotate | PatchRepo | DeleteRepo | CreateIntegration | PatchIntegration
        | DeleteIntegration | CreateAlertRule | PatchAlertRule | DeleteAlertRule => WRITE,
        // The target's refusal is `success: false` in a 200, never an error of the request.
        TestIntegration => PLAIN,
        // Reads only: 422 for a bad condition, window or group.
        BacktestRule => answers(&[422]),
        Heartbeat => Doc {
            body: Some(ReqBody::OptionalJson),
            ..WRITE
        },
        CreateUser | CreateOrg | AddMember | CreateProject | CompleteSession | CapsuleUploadUrl
        | DeleteCapsule | ConfigUploadUrl | ConfigConfirm | DeleteConfig | CreateDeployment
        | PatchDeployment | DeleteDeployment | ActivateDeployment | DeprecateDeployment
        | DeviceStatus | CreateRepo | RunHeartbeat | CompleteRun | Backup => WRITE_409,
        AppendLogs => Doc {
            body: Some(ReqBody::Logs),
            ..WRITE_409
        },
        // 204 when no run is queued.
        ClaimRun => Doc {
            also: &[204],
            ..WRITE
        },
        // A configuration whose lineage is broken.
        ExplainConfig => answers(&[409]),
        ExportLogs => Doc {
            media: &["application/json", "text/csv; charset=utf-8"],
            ..QUERY
        },
        PutFile => Doc {
            body: Some(ReqBody::Raw("*/*")),
            ..WRITE_409
        },
        GetFile => Doc {
            also: &[206],
            media: &["*/*"],
            ..answers(&[416])
        },
        DownloadFiles => Doc {
            media: &["application/zip"],
            ..PLAIN
        },
        // 400 when the request is not a WebSocket upgrade or its key is malformed, 426 for a
        // version other than 13 (RFC 6455); 422 for `replay`, `level`.
        LiveLogs => Doc {
            media: &[],
            ..answers(&[400, 422, 426, 503])
        },
        // 202 while a large capsule is validated in the background; 400 on a checksum mismatch.
        CapsuleConfirm => Doc {
            also: &[202],
            ..WRITE_409
        },
        // The signed link: 403 forged or for another purpose, 401 expired.
        Upload => Doc {
            body: Some(ReqBody::Raw("application/octet-stream")),
            ..answers(&[401, 403, 409, 503])
        },
        Download => Doc {
            media: &["*/*"],
            ..answers(&[401, 403])
        },
        // The signature is the credential: 401 invalid or a repeated delivery; 400 for a
        // delivery id that is not a UUID or a missing event.
        ScmWebhook => Doc {
            body: Some(ReqBody::Raw("application/json")),
            // Read whole before the signature can be checked: 408 and the body budget's 503.
            ..answers(&[401, 408, 503])
        },
    }
}

fn req_body(r: &RouteDef, d: &Doc) -> ReqBody {
    match d.body {
        Some(b) => b,
        None if r.body => ReqBody::Json,
        None => ReqBody::None,
    }
}

/// The path as OpenAPI writes it: matchit's catch-all `{*path}` is an ordinary `{path}`.
pub fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The names of a route's path parameters, in order.
fn param_names(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| name.trim_start_matches('*'))
        .collect()
}

fn param(name: &str, catch_all: bool) -> Value {
    let (schema, description) = match name {
        "org" => (json!({"type": "string"}), "Organization slug".to_string()),
        "project" => (json!({"type": "string"}), "Project slug".to_string()),
        "delivery_id" => (
            json!({"type": "string", "format": "uuid"}),
            "Delivery id (the host's X-Host-Delivery)".to_string(),
        ),
        "token" => (
            json!({"type": "string"}),
            "Signed link token (the credential of this route)".to_string(),
        ),
        "tag" => (json!({"type": "string"}), "Session tag".to_string()),
        "path" if catch_all => (
            json!({"type": "string"}),
            "Artifact path, relative; its `/` separators are part of the value".to_string(),
        ),
        n if n.ends_with("_id") => (
            json!({"type": "integer", "minimum": 0}),
            format!("{} id", camel(n.trim_end_matches("_id"))),
        ),
        _ => (json!({"type": "string"}), String::new()),
    };
    let mut p = json!({"name": name, "in": "path", "required": true, "schema": schema});
    if !description.is_empty()
        && let Value::Object(m) = &mut p
    {
        m.insert("description".into(), json!(description));
    }
    p
}

/// `upload-url` → `UploadUrl`.
fn camel(seg: &str) -> String {
    seg.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// One unique `operationId` per route: the operation's name, and where one operation serves
/// several routes, the ones ending in a literal segment add it (`PutFile` on `files/{*path}`,
/// `PutFileDownload` on `files/download`).
pub fn operation_ids(routes: &[RouteDef]) -> Vec<String> {
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut ids = Vec::with_capacity(routes.len());
    for r in routes {
        let mut id = format!("{:?}", r.op);
        let shared = routes.iter().filter(|o| o.op == r.op).count() > 1;
        let last = r.path.rsplit('/').next().unwrap_or_default();
        if shared && !last.starts_with('{') {
            id.push_str(&camel(last));
        }
        let mut unique = id.clone();
        let mut n = 2;
        while used.contains(&unique) {
            unique = format!("{id}{n}");
            n += 1;
        }
        used.insert(unique.clone());
        ids.push(unique);
    }
    ids
}

/// Every status an operation answers, successes first.
fn statuses(r: &RouteDef, d: &Doc, body: ReqBody) -> (BTreeSet<u16>, BTreeSet<u16>) {
    let ok: BTreeSet<u16> = std::iter::once(r.status)
        .chain(d.also.iter().copied())
        .collect();
    let mut err: BTreeSet<u16> = d.errors.iter().copied().collect();
    let authenticated = matches!(r.security, Security::Bearer | Security::Jwt);
    match r.security {
        Security::Bearer | Security::Jwt => err.extend([401, 403, 429]),
        Security::ProjectSecret => err.extend([401, 429]),
        Security::None => {}
    }
    let params = param_names(r.path);
    if !params.is_empty() {
        // A percent-encoded parameter that is not UTF-8.
        err.insert(400);
    }
    // An unknown organization or project is 404 once authorized (on the project-secret
    // routes it is 401); any other parameter names a record.
    if params.iter().any(|p| {
        (authenticated && matches!(*p, "org" | "project")) || !matches!(*p, "org" | "project")
    }) {
        err.insert(404);
    }
    match body {
        // Read whole: 408 past the body deadline, 503 over the shared body budget.
        ReqBody::Json | ReqBody::OptionalJson | ReqBody::Logs => {
            err.extend([400, 408, 413, 422, 503])
        }
        ReqBody::Raw(_) => err.extend([400, 413]),
        ReqBody::None => {}
    }
    (ok, err)
}

fn success(status: u16, media: &[&str]) -> Value {
    let description = match status {
        101 => "Switching Protocols: the WebSocket",
        200 => "Success",
        201 => "Created",
        202 => "Accepted",
        204 => "No content",
        206 => "Partial content (a single byte range)",
        _ => "Success",
    };
    if matches!(status, 101 | 204) || media.is_empty() {
        return json!({"description": description});
    }
    let content: Map<String, Value> = media
        .iter()
        .map(|m| {
            let schema = if m.contains("json") {
                json!({})
            } else if m.contains("text") {
                json!({"type": "string"})
            } else {
                json!({"type": "string", "format": "binary"})
            };
            (m.to_string(), json!({"schema": schema}))
        })
        .collect();
    json!({"description": description, "content": content})
}

fn error_ref(status: u16) -> Value {
    let name = match status {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        408 => "RequestTimeout",
        413 => "TooLarge",
        416 => "RangeNotSatisfiable",
        422 => "Unprocessable",
        426 => "UpgradeRequired",
        429 => "RateLimited",
        503 => "Unavailable",
        _ => "Error",
    };
    json!({"$ref": format!("#/components/responses/{name}")})
}

fn request_body(body: ReqBody) -> Option<Value> {
    let any = json!({"schema": {}});
    let bytes = json!({"schema": {"type": "string", "format": "binary"}});
    match body {
        ReqBody::None => None,
        ReqBody::Json => Some(json!({"required": true, "content": {
            "application/json": {"schema": {"type": "object"}}
        }})),
        ReqBody::OptionalJson => Some(json!({"required": false, "content": {
            "application/json": {"schema": {"type": "object"}}
        }})),
        ReqBody::Logs => Some(json!({"required": true, "content": {
            "application/json": {"schema": {"type": "array", "items": {"type": "object"}}},
            "application/x-ndjson": {"schema": {"type": "string"}}
        }})),
        ReqBody::Raw(m) => {
            let mut content = Map::new();
            content.insert(m.into(), if m.contains("json") { any } else { bytes });
            Some(json!({"required": true, "content": content}))
        }
    }
}

pub fn document(routes: &[RouteDef]) -> Value {
    let mut paths = Map::new();
    let ids = operation_ids(routes);
    for (r, id) in routes.iter().zip(ids) {
        let d = doc(r.op);
        let body = req_body(r, &d);
        let params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| match name.strip_prefix('*') {
                Some(n) => param(n, true),
                None => param(name, false),
            })
            .collect();
        let mut op = Map::new();
        op.insert("operationId".into(), json!(id));
        op.insert("summary".into(), json!(r.summary));
        op.insert("tags".into(), json!([r.tag]));
        if !params.is_empty() {
            op.insert("parameters".into(), Value::Array(params));
        }
        if let Some(b) = request_body(body) {
            op.insert("requestBody".into(), b);
        }
        let security = match r.security {
            Security::None if r.op == Op::Metrics => json!([{}, {"metricsToken": []}]),
            Security::None => json!([]),
            Security::Bearer => json!([{"bearer": []}, {"apiKey": []}]),
            Security::ProjectSecret => json!([{"projectSecret": []}]),
            Security::Jwt => json!([{"bearer": []}]),
        };
        op.insert("security".into(), security);
        let (ok, err) = statuses(r, &d, body);
        let mut responses = Map::new();
        for s in ok {
            responses.insert(s.to_string(), success(s, d.media));
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
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
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
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "`[http] metrics_token`, when configured"}
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["detail", "status_code"],
                    "properties": {
                        "detail": {"type": "string"},
                        "status_code": {"type": "integer"},
                        "retry_after": {"type": "integer"}
                    }
                }
            },
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
                "Error": error("Any other error (an internal fault is 500)")
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::routes;

    fn responses<'a>(d: &'a Value, path: &str, method: &str) -> &'a Map<String, Value> {
        d["paths"][path][method]["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{method} {path} missing"))
    }

    #[test]
    fn operation_ids_are_unique() {
        let routes = routes();
        let ids = operation_ids(&routes);
        let set: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(set.len(), ids.len(), "{ids:?}");
        assert!(ids.contains(&"PutFile".to_string()));
        assert!(ids.contains(&"PutFileDownload".to_string()));
    }

    #[test]
    fn every_template_parameter_is_declared() {
        let d = document(&routes());
        for (path, item) in d["paths"].as_object().unwrap() {
            assert!(!path.contains('*'), "{path}");
            let names: Vec<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            for (method, op) in item.as_object().unwrap() {
                let declared: Vec<&str> = op["parameters"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|p| p["in"] == "path" && p["required"] == true)
                            .filter_map(|p| p["name"].as_str())
                            .collect()
                    })
                    .unwrap_or_default();
                assert_eq!(declared, names, "{method} {path}");
            }
        }
    }

    #[test]
    fn statuses_routes_answer() {
        let d = document(&routes());
        let p = "/api/v1/organizations/{org}/projects/{project}";
        let has = |path: &str, method: &str, codes: &[&str]| {
            let r = responses(&d, path, method);
            for c in codes {
                assert!(r.contains_key(*c), "{method} {path}: {c} missing");
            }
        };
        has(
            &format!("{p}/test-runs/claim"),
            "post",
            &["200", "204", "401", "403", "404", "429", "503"],
        );
        has(
            "/api/v1/scm/webhooks",
            "post",
            &["202", "400", "401", "413", "503"],
        );
        has(
            "/api/v1/uploads/{token}",
            "put",
            &["200", "400", "401", "403", "404", "409", "413"],
        );
        has(
            "/api/v1/downloads/{token}",
            "get",
            &["200", "401", "403", "404"],
        );
        has(
            "/api/v1/auth/login",
            "post",
            &["200", "400", "401", "413", "422", "429"],
        );
        has(
            "/api/v1/ws/organizations/{org}/projects/{project}/sessions/{session_id}/logs",
            "get",
            &["101", "400", "401", "403", "404", "422", "426", "429"],
        );
        has(
            &format!("{p}/devices/{{device_id}}"),
            "get",
            &["200", "401", "403", "404", "429"],
        );
        has(
            &format!("{p}/sessions/{{session_id}}/files/{{path}}"),
            "get",
            &["200", "206", "404", "416"],
        );
        has(
            &format!("{p}/sessions/{{session_id}}/files/{{path}}"),
            "put",
            &["201", "400", "404", "409", "413"],
        );
        has(
            "/api/v1/organizations/{org}/devices",
            "get",
            &["404", "422"],
        );
        has(
            "/api/v1/projects/{org}/{project}/capsules/{capsule_id}/confirm",
            "post",
            &[
                "200", "202", "400", "401", "404", "409", "413", "422", "429",
            ],
        );
        // No 404 from the slugs of a project-secret route (unknown is 401), no 403, no 429 on
        // the webhook; health answers 200, or 503 naming a part that is down.
        let r = responses(
            &d,
            "/api/v1/projects/{org}/{project}/capsules/upload-url",
            "post",
        );
        assert!(!r.contains_key("404") && !r.contains_key("403"));
        assert!(!responses(&d, "/api/v1/scm/webhooks", "post").contains_key("429"));
        let h: Vec<&String> = responses(&d, "/healthz", "get").keys().collect();
        assert_eq!(h, ["200", "503", "default"]);
        let m = &d["paths"]["/metrics"]["get"]["responses"]["200"]["content"];
        assert!(m.get("text/plain; version=0.0.4").is_some(), "{m}");
        assert!(
            m.get("application/openmetrics-text; version=1.0.0; charset=utf-8")
                .is_some()
        );
    }
}
