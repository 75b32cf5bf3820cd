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
    let d = document(&routes(), &[]);
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
    let d = document(&routes(), &[]);
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

/// Every JSON body, sent or answered, has the schema of its Rust type; the `$ref`s resolve.
#[test]
fn every_json_body_is_typed() {
    let d = document(&routes(), &["free".into()]);
    let schemas = d["components"]["schemas"].as_object().unwrap();
    let resolves = |s: &Value, what: &str| {
        if let Some(r) = s["$ref"].as_str() {
            let name = r.strip_prefix("#/components/schemas/").unwrap();
            assert!(schemas.contains_key(name), "{what}: {r} does not resolve");
        } else {
            assert!(
                s.get("type").is_some() || s.get("title").is_some(),
                "{what}: {s}"
            );
        }
    };
    for (path, item) in d["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let what = format!("{method} {path}");
            if let Some(s) = op["requestBody"]["content"].get("application/json")
                && path != "/api/v1/scm/webhooks"
            {
                resolves(&s["schema"], &what);
            }
            for (status, r) in op["responses"].as_object().unwrap() {
                if let Some(s) = r["content"].get("application/json")
                    && path != "/api/v1/openapi.json"
                {
                    resolves(&s["schema"], &format!("{what} {status}"));
                }
            }
        }
    }
    // The formats the server checks are in the schemas.
    let dev = &schemas["CreateDevice"];
    assert_eq!(dev["properties"]["name"]["maxLength"], 200, "{dev}");
    assert_eq!(dev["required"], json!(["name"]));
    assert_eq!(
        schemas["CreateProject"]["properties"]["slug"]["pattern"],
        "^[a-z0-9][a-z0-9-]{0,62}$"
    );
    for body in ["CreateOrganization", "PatchOrganization"] {
        assert_eq!(
            schemas[body]["properties"]["tier"]["enum"],
            json!(["free", null])
        );
    }
    assert_eq!(
        schemas["Error"]["required"],
        json!(["detail", "status_code"])
    );
    assert_eq!(
        schemas["DeviceView"]["properties"]["id"]["maximum"],
        json!(u64::MAX)
    );
    // A create links to what it created.
    let p = "/api/v1/organizations/{org}/projects/{project}/devices";
    let links = &d["paths"][p]["post"]["responses"]["201"]["links"];
    assert_eq!(
        links["GetDevice"]["parameters"]["device_id"], "$response.body#/id",
        "{links}"
    );
    let p = "/api/v1/projects/{org}/{project}/capsules/upload-url";
    let links = &d["paths"][p]["post"]["responses"]["201"]["links"];
    assert_eq!(
        links["CapsuleConfirm"]["parameters"]["capsule_id"], "$response.body#/capsule_id",
        "{links}"
    );
}
