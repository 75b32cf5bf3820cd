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

/// A body's schema: a `$ref` into `components/schemas`, generated from the Rust type the
/// handler parses or serializes.
type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn ty<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The plan takes a deployment's body and reports each rule it breaks as a blocker in its
/// 200, so its schema is that body's shape alone: the types, without the rules.
fn plan_request(g: &mut SchemaGenerator) -> Schema {
    fn shape(v: &Value) -> Value {
        let Value::Object(m) = v else {
            return v.clone();
        };
        let mut out = Map::new();
        for (k, x) in m {
            match k.as_str() {
                "type" | "required" | "description" | "format" | "minimum" | "maximum" => {
                    out.insert(k.clone(), x.clone());
                }
                "properties" => {
                    let props = x
                        .as_object()
                        .map(|p| p.iter().map(|(n, s)| (n.clone(), shape(s))).collect())
                        .unwrap_or_default();
                    out.insert(k.clone(), Value::Object(props));
                }
                _ => {}
            }
        }
        Value::Object(out)
    }
    let mut full = deploy::CreateBody::json_schema(g);
    // Transforms run on definitions, not on a schema taken directly.
    schemars::transform::Transform::transform(&mut RecursiveTransform(integer_range), &mut full);
    let mut plan = shape(&full.to_value());
    if let Value::Object(m) = &mut plan {
        m.insert("title".into(), json!("DeploymentPlanRequest"));
    }
    Schema::try_from(plan).unwrap_or_default()
}

/// The request and success-response body types of an operation: the very types its handler
/// parses and serializes, so the document follows the code. `None` where there is no JSON
/// body (raw bytes, streams, 204, text).
fn types(op: Op) -> (Option<SchemaFn>, Option<SchemaFn>) {
    use Op::*;
    use alerts::{
        BacktestRequest, BacktestView, IntegrationPatch, IntegrationRequest, IntegrationView,
        RulePatchRequest, RuleRequest, RuleView, TestResult,
    };
    use pipeline::configurations::{
        ConfigUploadUrl, ConfigurationDetail, ConfigurationView, Explain,
    };
    use pipeline::deployments::{DeploymentDetail, DeploymentView, Plan, ResultAccepted};
    use pipeline::{CapsuleDetail, CapsuleItem, CapsuleView, UploadUrl};
    use views::*;
    use webhooks::{
        Accepted as DeliveryAccepted, DeliveryDetail, DeliveryView, InstallationView, RepoView,
        Rotated, TestRunView, WebhooksStatus,
    };
    let none: Option<SchemaFn> = None;
    match op {
        Healthz => (none, Some(ty::<ops::Health>)),
        Readyz => (none, Some(ty::<ops::Ready>)),
        Metrics | OpenApi => (none, none),
        Login => (Some(ty::<accounts::LoginBody>), Some(ty::<auth::Token>)),
        Refresh => (none, Some(ty::<auth::Token>)),
        CreateApiKey => (Some(ty::<accounts::NameBody>), Some(ty::<ApiKeyCreated>)),
        ListApiKeys => (none, Some(ty::<Items<ApiKeyView>>)),
        DeleteApiKey | Logout => (none, none),
        Me => (none, Some(ty::<views::Me>)),
        CreateUser => (Some(ty::<accounts::UserBody>), Some(ty::<UserView>)),
        CreateOrg => (Some(ty::<accounts::OrgBody>), Some(ty::<OrgView>)),
        ListOrgs => (none, Some(ty::<Items<OrgView>>)),
        AdminOrgs => (none, Some(ty::<views::AllOrgs>)),
        GetOrg => (none, Some(ty::<OrgView>)),
        PatchOrg => (Some(ty::<accounts::OrgPatchBody>), Some(ty::<OrgView>)),
        DeleteOrg => (none, none),
        AddMember => (Some(ty::<accounts::MemberBody>), Some(ty::<MemberView>)),
        CreateProject => (Some(ty::<accounts::ProjectBody>), Some(ty::<ProjectView>)),
        ListProjects => (none, Some(ty::<Items<ProjectView>>)),
        RotateSecret => (none, Some(ty::<ProjectSecret>)),
        OrgDevices | ListDevices => (none, Some(ty::<Page<DeviceView>>)),
        CreateDevice => (Some(ty::<devices::CreateBody>), Some(ty::<DeviceView>)),
        GetDevice => (none, Some(ty::<DeviceView>)),
        CreateEnrollmentToken => (
            Some(ty::<devices::EnrollmentTokenBody>),
            Some(ty::<views::EnrollmentTokenView>),
        ),
        ListEnrollmentTokens => (none, Some(ty::<Items<views::EnrollmentTokenView>>)),
        DeleteEnrollmentToken => (none, none),
        Enroll => (
            Some(ty::<devices::EnrollBody>),
            Some(ty::<views::EnrolledView>),
        ),
        PatchDevice => (Some(ty::<devices::PatchBody>), Some(ty::<DeviceView>)),
        DeleteDevice | DeleteGroup | DeleteSession | DeleteCapsule | DeleteConfig
        | DeleteDeployment | DeleteRepo | DeleteIntegration | DeleteAlertRule => (none, none),
        Heartbeat => (Some(ty::<devices::HeartbeatBody>), Some(ty::<HeartbeatAck>)),
        CreateGroup => (Some(ty::<devices::GroupBody>), Some(ty::<GroupView>)),
        ListGroups => (none, Some(ty::<Items<GroupView>>)),
        GetGroup => (none, Some(ty::<GroupView>)),
        PatchGroup => (Some(ty::<devices::GroupPatch>), Some(ty::<GroupView>)),
        CreateSession => (Some(ty::<sessions::CreateBody>), Some(ty::<SessionDetail>)),
        ListSessions => (none, Some(ty::<Page<SessionItem>>)),
        GetSession | RemoveTag => (none, Some(ty::<SessionDetail>)),
        AddTag => (Some(ty::<sessions::TagBody>), Some(ty::<SessionDetail>)),
        CompleteSession => (
            Some(ty::<sessions::CompleteBody>),
            Some(ty::<SessionDetail>),
        ),
        AppendLogs => (Some(logs::batch_schema), Some(ty::<views::Accepted>)),
        QueryLogs => (none, Some(ty::<LogPage>)),
        ExportLogs => (none, Some(ty::<Vec<logs::LogEntryView>>)),
        PutFile => (none, Some(ty::<ArtifactView>)),
        ListFiles => (none, Some(ty::<Items<ArtifactView>>)),
        GetFile | DownloadFiles | LiveLogs | Download => (none, none),
        CapsuleUploadUrl => (Some(ty::<capsules::UploadUrlBody>), Some(ty::<UploadUrl>)),
        CapsuleConfirm => (Some(ty::<capsules::ConfirmBody>), Some(ty::<CapsuleView>)),
        ListCapsules => (none, Some(ty::<Vec<CapsuleItem>>)),
        GetCapsule => (none, Some(ty::<CapsuleDetail>)),
        Upload => (none, Some(ty::<links::Uploaded>)),
        ConfigUploadUrl => (
            Some(ty::<configurations::UploadUrlBody>),
            Some(ty::<ConfigUploadUrl>),
        ),
        ConfigConfirm => (
            Some(ty::<capsules::ConfirmBody>),
            Some(ty::<ConfigurationView>),
        ),
        ListConfigs => (none, Some(ty::<Page<ConfigurationView>>)),
        GetConfig => (none, Some(ty::<ConfigurationDetail>)),
        ExplainConfig => (none, Some(ty::<Explain>)),
        CreateDeployment => (Some(ty::<deploy::CreateBody>), Some(ty::<DeploymentView>)),
        PlanDeployment => (Some(plan_request), Some(ty::<Plan>)),
        ListDeployments => (none, Some(ty::<Page<DeploymentView>>)),
        GetDeployment => (none, Some(ty::<DeploymentDetail>)),
        PatchDeployment => (Some(ty::<deploy::PatchBody>), Some(ty::<DeploymentView>)),
        ActivateDeployment | DeprecateDeployment => (none, Some(ty::<DeploymentView>)),
        DeviceStatus => (
            Some(ty::<deploy::DeviceStatusBody>),
            Some(ty::<ResultAccepted>),
        ),
        DeviceUpdate => (none, Some(ty::<pipeline::updates::UpdateBody<'static>>)),
        DeviceUpdateStatus => (Some(ty::<updates::ReportBody>), Some(ty::<ResultAccepted>)),
        DeviceHistory => (none, Some(ty::<pipeline::updates::DeviceHistory>)),
        GetPolicy => (none, Some(ty::<pipeline::rollouts::PolicyView>)),
        GetLogRetention => (none, Some(ty::<views::LogRetentionView>)),
        PatchLogRetention => (
            Some(ty::<sessions::RetentionBody>),
            Some(ty::<views::LogRetentionView>),
        ),
        PatchPolicy => (
            Some(ty::<deploy::PolicyBody>),
            Some(ty::<pipeline::rollouts::PolicyView>),
        ),
        GetRollout | PauseRollout | ResumeRollout | AbortRollout => {
            (none, Some(ty::<pipeline::rollouts::RolloutView>))
        }
        RetryDevice => (none, Some(ty::<pipeline::rollouts::Retried>)),
        ScmWebhook => (none, Some(ty::<DeliveryAccepted>)),
        ScmRotate => (none, Some(ty::<Rotated>)),
        Backup => (
            Some(ty::<ops::BackupBody>),
            Some(ty::<backup::BackupReport>),
        ),
        ScmStatus => (none, Some(ty::<WebhooksStatus>)),
        ScmInstallations => (none, Some(ty::<Items<InstallationView>>)),
        BindInstallation => (Some(ty::<hooks::BindBody>), Some(ty::<InstallationView>)),
        ScmDeliveries | ProjectDeliveries => (none, Some(ty::<Page<DeliveryView>>)),
        ScmDelivery | ProjectDelivery => (none, Some(ty::<DeliveryDetail>)),
        CreateRepo => (Some(ty::<hooks::RepoBody>), Some(ty::<RepoView>)),
        ListRepos => (none, Some(ty::<Page<RepoView>>)),
        GetRepo => (none, Some(ty::<RepoView>)),
        PatchRepo => (Some(ty::<hooks::RepoPatchBody>), Some(ty::<RepoView>)),
        ListRuns => (none, Some(ty::<Page<TestRunView>>)),
        GetRun | ClaimRun | RunHeartbeat => (none, Some(ty::<TestRunView>)),
        CompleteRun => (Some(ty::<hooks::CompleteBody>), Some(ty::<TestRunView>)),
        CreateIntegration => (Some(ty::<IntegrationRequest>), Some(ty::<IntegrationView>)),
        ListIntegrations => (none, Some(ty::<Items<IntegrationView>>)),
        GetIntegration => (none, Some(ty::<IntegrationView>)),
        PatchIntegration => (Some(ty::<IntegrationPatch>), Some(ty::<IntegrationView>)),
        TestIntegration => (none, Some(ty::<TestResult>)),
        CreateAlertRule => (Some(ty::<RuleRequest>), Some(ty::<RuleView>)),
        ListAlertRules => (none, Some(ty::<Items<RuleView>>)),
        GetAlertRule => (none, Some(ty::<RuleView>)),
        PatchAlertRule => (Some(ty::<RulePatchRequest>), Some(ty::<RuleView>)),
        ListAlerts => (none, Some(ty::<Page<alerts::AlertView>>)),
        GetAlert => (none, Some(ty::<alerts::AlertView>)),
        BacktestRule => (Some(ty::<BacktestRequest>), Some(ty::<BacktestView>)),
    }
}

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
        // 503 naming the engines this node cannot reach.
        Readyz => answers(&[503]),
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
        Refresh | ListApiKeys | Me | ListOrgs | GetOrg | ListProjects | GetDevice | ListGroups
        | GetGroup | GetSession | ListFiles | GetCapsule | GetConfig | PlanDeployment
        | GetDeployment | ScmStatus | ScmInstallations | ScmDelivery | GetRepo | GetRun
        | ProjectDelivery | ListIntegrations | GetIntegration | ListAlertRules | GetAlertRule
        | GetAlert | DeviceHistory | GetRollout | GetPolicy | GetLogRetention | AdminOrgs => PLAIN,
        PatchPolicy | PatchLogRetention => WRITE,
        // 409 when the rollout's state does not allow the action.
        PauseRollout | ResumeRollout | AbortRollout | RetryDevice => answers(&[409]),
        // 204 when nothing is assigned, 304 when `If-None-Match` names the current ETag.
        DeviceUpdate => Doc {
            also: &[204, 304],
            ..PLAIN
        },
        OrgDevices | ListDevices | ListSessions | QueryLogs | ListCapsules | ListConfigs
        | ListDeployments | ScmDeliveries | ListRepos | ListRuns | ProjectDeliveries
        | ListAlerts => QUERY,
        CreateEnrollmentToken => WRITE_409,
        DeleteEnrollmentToken | Enroll => WRITE,
        ListEnrollmentTokens => PLAIN,
        CreateApiKey | DeleteApiKey | Logout | PatchOrg | DeleteOrg | RotateSecret
        | CreateDevice | PatchDevice | DeleteDevice | CreateGroup | PatchGroup | DeleteGroup
        | CreateSession | DeleteSession | AddTag | RemoveTag | ScmRotate | BindInstallation
        | PatchRepo | DeleteRepo | CreateIntegration | PatchIntegration | DeleteIntegration
        | CreateAlertRule | PatchAlertRule | DeleteAlertRule => WRITE,
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
        | DeviceStatus | DeviceUpdateStatus | CreateRepo | RunHeartbeat | CompleteRun | Backup => {
            WRITE_409
        }
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
            ..answers(&[401, 403, 409])
        },
        // A single `Range` resumes a download (206, or 416 past the end).
        Download => Doc {
            also: &[206],
            media: &["*/*"],
            ..answers(&[401, 403, 416])
        },
        // The signature is the credential: 401 invalid or a repeated delivery; 400 for a
        // delivery id that is not a UUID or a missing event.
        ScmWebhook => Doc {
            body: Some(ReqBody::Raw("application/json")),
            ..answers(&[401])
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

fn success(status: u16, media: &[&str], schema: Option<&Value>) -> Value {
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
        507 => "InsufficientStorage",
        _ => "Error",
    };
    json!({"$ref": format!("#/components/responses/{name}")})
}

fn request_body(body: ReqBody, schema: Option<Value>) -> Option<Value> {
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

/// The query parameters an operation reads, as its handler checks them (422 naming the
/// parameter otherwise).
fn query(op: Op) -> Vec<Value> {
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
fn handshake_headers() -> Vec<Value> {
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
fn add_links(routes: &[RouteDef], paths: &mut Map<String, Value>) {
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

/// Schemas under `components/schemas`, as they serialize (responses) or deserialize
/// (requests): a field with a default is optional in a request and present in a response.
fn generator(serialize: bool) -> SchemaGenerator {
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
fn integer_range(s: &mut Schema) {
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
fn integration_union(schemas: &mut Map<String, Value>) {
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
fn generator_friendly(s: &mut Value) {
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
fn schemas_in_operations(v: &mut Value) {
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
fn rename_refs(v: &mut Value, renamed: &BTreeMap<String, String>) {
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
}
