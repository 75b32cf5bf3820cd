//! Query parameters of each operation, the WebSocket handshake's headers, and the links
//! between operations.

use super::*;

/// The query parameters an operation reads, as its handler checks them (422 naming the
/// parameter otherwise).
pub(super) fn query(op: Op) -> Vec<Value> {
    use Op::*;
    let param = |name: &str, schema: Value, description: &str| {
        json!({"name": name, "in": "query", "required": false, "description": description,
               "schema": schema})
    };
    let int = |name: &str, min: u64, max: u64, description: &str| {
        param(
            name,
            json!({"type": "integer", "minimum": min, "maximum": max}),
            description,
        )
    };
    let one_of = |name: &str, values: &[&str], description: &str| {
        param(name, json!({"type": "string", "enum": values}), description)
    };
    let text = |name: &str, description: &str| param(name, json!({"type": "string"}), description);
    let time = |name: &str, description: &str| {
        param(
            name,
            json!({"type": "string", "format": "date-time"}),
            description,
        )
    };
    let page = || {
        vec![
            int("page", 1, u64::MAX, "1-based page (default 1)"),
            int(
                "page_size",
                1,
                views::PageReq::MAX_PAGE_SIZE as u64,
                "Items a page (default 50)",
            ),
        ]
    };
    // Levels, comma-separated, any case (`warning` is `warn`); blanks around them are ignored.
    let level = || {
        let ws = "[\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000]*";
        let l = "([Dd][Ee][Bb][Uu][Gg]|[Ii][Nn][Ff][Oo]|[Ww][Aa][Rr][Nn]([Ii][Nn][Gg])?|[Ee][Rr][Rr][Oo][Rr])";
        let part = format!("{ws}({l}{ws})?");
        param(
            "level",
            json!({"type": "string", "pattern": format!("^{part}(,{part})*$")}),
            "Levels, comma-separated (debug, info, warn, error)",
        )
    };
    let logs = || {
        vec![
            level(),
            text("module", "Exact module"),
            text("search", "Case-insensitive substring of the message"),
            time("since", "Inclusive, RFC 3339"),
            time("until", "Exclusive, RFC 3339"),
        ]
    };
    let with_page = |mut v: Vec<Value>| {
        v.extend(page());
        v
    };
    match op {
        OrgDevices | ListDevices => with_page(vec![
            one_of("status", &["online", "offline"], "Online or offline"),
            text("name", "Exact name"),
        ]),
        ListSessions => with_page(vec![
            int("device_id", 0, u64::MAX, "The device's sessions"),
            one_of(
                "status",
                &["active", "completed", "failed"],
                "Session status",
            ),
            time("since", "Started at or after, RFC 3339"),
            time("until", "Started before, RFC 3339"),
        ]),
        QueryLogs => {
            let mut v = logs();
            v.push(int(
                "limit",
                1,
                fleetops_actors::logs::MAX_QUERY_LIMIT as u64,
                "Entries (default 100)",
            ));
            v.push(int(
                "offset",
                0,
                u64::MAX,
                "Matches to skip (default 0; offset + limit at most [sessions] max_result_window, \
                 1,000,000 by default, else 422)",
            ));
            v
        }
        ExportLogs => {
            let mut v = logs();
            v.push(one_of("format", &["json", "csv"], "json (default) or csv"));
            v
        }
        LiveLogs => vec![
            level(),
            text("module", "Exact module"),
            int(
                "replay",
                0,
                crate::ws::MAX_REPLAY,
                "Stored entries sent first (default 0)",
            ),
            text(
                "token",
                "The credential, for browsers that cannot set headers",
            ),
        ],
        ListCapsules => vec![
            text("name", "Capsule name"),
            one_of("type", &["SW", "FW", "OS"], "Capsule type"),
            one_of(
                "latest_only",
                &["true", "false", "1", "0"],
                "Only each name's latest version",
            ),
        ],
        ListConfigs => with_page(vec![
            int("capsule_id", 0, u64::MAX, "Configurations of this capsule"),
            param(
                "environment",
                json!({"type": "string", "minLength": 1}),
                "Environment",
            ),
        ]),
        ListDeployments => with_page(vec![one_of(
            "deployment_status",
            &["draft", "active", "deprecated"],
            "Package status",
        )]),
        ScmDeliveries | ProjectDeliveries => with_page(vec![
            param(
                "outcome",
                json!({"type": "string", "enum": webhooks::LogOutcome::names()}),
                "Delivery outcome",
            ),
            text("reason", "Outcome reason"),
        ]),
        ListRuns => with_page(vec![
            one_of(
                "status",
                &["queued", "running", "passed", "failed", "cancelled"],
                "Run status",
            ),
            text("repository", "owner/name"),
            text("commit_sha", "Commit"),
        ]),
        ListRepos => page(),
        ListAlerts => with_page(vec![
            one_of("state", &["firing", "resolved"], "Alert state"),
            int("rule_id", 0, u64::MAX, "The rule's alerts"),
        ]),
        _ => Vec::new(),
    }
}

/// The headers of a WebSocket handshake as `ws::handshake_key` reads them (RFC 6455): a
/// plain request is 400, another version 426.
pub(super) fn handshake_headers() -> Vec<Value> {
    let header = |name: &str, pattern: &str, description: &str| {
        json!({"name": name, "in": "header", "required": true, "description": description,
               "schema": {"type": "string", "pattern": pattern}})
    };
    vec![
        header(
            "Upgrade",
            "^([\\t -+\\--~]*,)*[\\t ]*[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt][\\t ]*(,[\\t -+\\--~]*)*$",
            "`websocket`",
        ),
        header("Sec-WebSocket-Version", "^[\\t ]*13[\\t ]*$", "`13`"),
        header(
            "Sec-WebSocket-Key",
            "^[\\t ]*[A-Za-z0-9+/]{21}[AQgw]==[\\t ]*$",
            "The base64 of 16 random bytes",
        ),
    ]
}

/// OpenAPI links from each create (201) to the operations on what it created, so a client
/// (or a stateful tester) can follow the id: `POST .../devices` gives `id`, which
/// `GET .../devices/{device_id}` takes; an `upload-url` gives `capsule_id` or `config_id`.
pub(super) fn add_links(routes: &[RouteDef], paths: &mut Map<String, Value>) {
    let ids = operation_ids(routes);
    for r in routes
        .iter()
        .filter(|r| r.method == http::Method::POST && r.status == 201)
    {
        let base = r.path.strip_suffix("/upload-url").unwrap_or(r.path);
        let mut links = Map::new();
        for (t, id) in routes.iter().zip(&ids) {
            let Some(rest) = t.path.strip_prefix(base).and_then(|x| x.strip_prefix("/{")) else {
                continue;
            };
            let Some((param, _)) = rest.split_once('}') else {
                continue;
            };
            if !param.ends_with("_id") {
                continue;
            }
            let field = if base == r.path { "id" } else { param };
            links.insert(
                id.clone(),
                json!({"operationId": id, "parameters": {param: format!("$response.body#/{field}")}}),
            );
        }
        if links.is_empty() {
            continue;
        }
        let method = r.method.as_str().to_lowercase();
        if let Some(Value::Object(created)) = paths
            .get_mut(&openapi_path(r.path))
            .and_then(|p| p.get_mut(&method))
            .and_then(|o| o.get_mut("responses"))
            .and_then(|x| x.get_mut("201"))
        {
            created.insert("links".into(), Value::Object(links));
        }
    }
}
