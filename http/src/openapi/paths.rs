//! Paths, parameters, operation ids, and the statuses and responses of an operation.

use super::*;

/// The path as OpenAPI writes it: matchit's catch-all `{*path}` is an ordinary `{path}`.
pub fn openapi_path(path: &str) -> String {
    path.replace("{*", "{")
}

/// The names of a route's path parameters, in order.
pub(super) fn param_names(path: &str) -> Vec<&str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| name.trim_start_matches('*'))
        .collect()
}

pub(super) fn param(name: &str, catch_all: bool) -> Value {
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
pub(super) fn camel(seg: &str) -> String {
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
pub(super) fn statuses(r: &RouteDef, d: &Doc, body: ReqBody) -> (BTreeSet<u16>, BTreeSet<u16>) {
    let ok: BTreeSet<u16> = std::iter::once(r.status)
        .chain(d.also.iter().copied())
        .collect();
    let mut err: BTreeSet<u16> = d.errors.iter().copied().collect();
    let authenticated = matches!(
        r.security,
        Security::Bearer | Security::Jwt | Security::Device
    );
    match r.security {
        Security::Bearer | Security::Jwt | Security::Device => err.extend([401, 403, 429]),
        Security::ProjectSecret | Security::Enrollment => err.extend([401, 429]),
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
        // Streamed or read whole: 408 for a body that stalls or comes slower than the minimum
        // rate, 503 when the body budget cannot hold its buffer.
        ReqBody::Raw(_) => err.extend([400, 408, 413, 503]),
        ReqBody::None => {}
    }
    if crate::router::writes_disk(&r.method, r.op) {
        // The data directory below `[storage] min_free_bytes`, or full.
        err.insert(507);
    }
    (ok, err)
}

pub(super) fn success(status: u16, media: &[&str], schema: Option<&Value>) -> Value {
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
            let schema = match schema {
                Some(s) if m.contains("json") => s.clone(),
                _ if m.contains("json") => json!({}),
                _ if m.contains("text") => json!({"type": "string"}),
                _ => json!({"type": "string", "format": "binary"}),
            };
            (m.to_string(), json!({"schema": schema}))
        })
        .collect();
    json!({"description": description, "content": content})
}

pub(super) fn error_ref(status: u16) -> Value {
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
        507 => "InsufficientStorage",
        _ => "Error",
    };
    json!({"$ref": format!("#/components/responses/{name}")})
}

pub(super) fn request_body(body: ReqBody, schema: Option<Value>) -> Option<Value> {
    let any = json!({"schema": {}});
    let bytes = json!({"schema": {"type": "string", "format": "binary"}});
    let schema = schema.unwrap_or_else(|| json!({"type": "object"}));
    match body {
        ReqBody::None => None,
        ReqBody::Json => Some(json!({"required": true, "content": {
            "application/json": {"schema": schema}
        }})),
        ReqBody::OptionalJson => Some(json!({"required": false, "content": {
            "application/json": {"schema": schema}
        }})),
        ReqBody::Logs => Some(json!({"required": true, "content": {
            "application/json": {"schema": schema},
            "application/x-ndjson": {"schema": {"type": "string"}}
        }})),
        ReqBody::Raw(m) => {
            let mut content = Map::new();
            // Bytes may be empty (an empty artifact or upload); a webhook delivery may not.
            let json = m.contains("json");
            content.insert(m.into(), if json { any } else { bytes });
            Some(json!({"required": json, "content": content}))
        }
    }
}
