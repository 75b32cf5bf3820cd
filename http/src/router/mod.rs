//! The one route table. Every route is listed here once, with what the OpenAPI document says
//! about it, so the document cannot miss a route. matchit finds the path; the method is
//! checked after, so a known path with another method is 405 with `Allow`. The console's pages
//! are listed here too ([`pages`]), apart: they are HTML, not operations of the API, so the
//! OpenAPI document leaves them out, and the console answers a page it does not have with
//! its own 404 page.

use http::Method;

mod pages;

pub use pages::{Page, PageDef, pages};

/// Every operation the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Healthz,
    Readyz,
    Metrics,
    OpenApi,
    Login,
    Refresh,
    Logout,
    CreateApiKey,
    ListApiKeys,
    DeleteApiKey,
    Me,
    CreateUser,
    CreateOrg,
    ListOrgs,
    GetOrg,
    PatchOrg,
    DeleteOrg,
    AddMember,
    CreateProject,
    ListProjects,
    RotateSecret,
    OrgDevices,
    CreateDevice,
    ListDevices,
    GetDevice,
    PatchDevice,
    DeleteDevice,
    Heartbeat,
    CreateEnrollmentToken,
    ListEnrollmentTokens,
    DeleteEnrollmentToken,
    Enroll,
    CreateGroup,
    ListGroups,
    GetGroup,
    PatchGroup,
    DeleteGroup,
    CreateSession,
    ListSessions,
    GetSession,
    DeleteSession,
    AddTag,
    RemoveTag,
    AppendLogs,
    QueryLogs,
    CompleteSession,
    ExportLogs,
    PutFile,
    ListFiles,
    GetFile,
    DownloadFiles,
    LiveLogs,
    CapsuleUploadUrl,
    CapsuleConfirm,
    ListCapsules,
    GetCapsule,
    DeleteCapsule,
    Upload,
    Download,
    ConfigUploadUrl,
    ConfigConfirm,
    ListConfigs,
    GetConfig,
    ExplainConfig,
    DeleteConfig,
    CreateDeployment,
    PlanDeployment,
    ListDeployments,
    GetDeployment,
    PatchDeployment,
    DeleteDeployment,
    ActivateDeployment,
    DeprecateDeployment,
    DeviceStatus,
    DeviceUpdate,
    GetRollout,
    GetPolicy,
    GetLogRetention,
    PatchLogRetention,
    PatchPolicy,
    PauseRollout,
    ResumeRollout,
    AbortRollout,
    RetryDevice,
    DeviceUpdateStatus,
    DeviceHistory,
    ScmWebhook,
    ScmRotate,
    Backup,
    AdminOrgs,
    ScmStatus,
    ScmInstallations,
    BindInstallation,
    ScmDeliveries,
    ScmDelivery,
    CreateRepo,
    ListRepos,
    GetRepo,
    PatchRepo,
    DeleteRepo,
    ListRuns,
    GetRun,
    ClaimRun,
    RunHeartbeat,
    CompleteRun,
    ProjectDeliveries,
    ProjectDelivery,
    CreateIntegration,
    ListIntegrations,
    GetIntegration,
    PatchIntegration,
    DeleteIntegration,
    TestIntegration,
    CreateAlertRule,
    ListAlertRules,
    GetAlertRule,
    PatchAlertRule,
    DeleteAlertRule,
    ListAlerts,
    GetAlert,
    BacktestRule,
}

/// How a route authenticates, for the OpenAPI document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    None,
    /// JWT or API key (or a device token where the route allows it).
    Bearer,
    /// A JWT only.
    Jwt,
    /// `X-Project-Secret` only.
    ProjectSecret,
    /// The device's own token only (the device update API).
    Device,
    /// A project's enrollment token (a robot registering itself).
    Enrollment,
}

/// Whether a request to `op` with `method` writes to the data directory (refused with 507
/// below `[storage] min_free_bytes`): every POST, PUT and PATCH but signing in and out (a full
/// disk must not lock operators out of freeing it) and the two that only read or send (a
/// backtest, an integration's test alert). DELETE frees space and is never refused.
pub fn writes_disk(method: &Method, op: Op) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
        && !matches!(
            op,
            Op::Login | Op::Refresh | Op::Logout | Op::BacktestRule | Op::TestIntegration
        )
}

pub struct RouteDef {
    pub method: Method,
    pub path: &'static str,
    pub op: Op,
    pub tag: &'static str,
    pub summary: &'static str,
    pub security: Security,
    /// The success status.
    pub status: u16,
    /// Whether the route takes a JSON body.
    pub body: bool,
}

macro_rules! route {
    ($m:ident $path:expr, $op:ident, $tag:literal, $sec:ident, $status:literal, $body:literal, $summary:literal) => {
        RouteDef {
            method: Method::$m,
            path: $path,
            op: Op::$op,
            tag: $tag,
            summary: $summary,
            security: Security::$sec,
            status: $status,
            body: $body,
        }
    };
}

/// The route table.
pub fn routes() -> Vec<RouteDef> {
    vec![
        route!(GET "/healthz", Healthz, "operations", None, 200, false, "Liveness: 200 once the server accepts requests"),
        route!(GET "/readyz", Readyz, "operations", None, 200, false, "Readiness: 200 while this node reaches its database, blob store and bus; 503 naming what it cannot reach"),
        route!(GET "/metrics", Metrics, "operations", None, 200, false, "Prometheus metrics"),
        route!(GET "/api/v1/openapi.json", OpenApi, "operations", None, 200, false, "This document"),
        route!(POST "/api/v1/auth/login", Login, "auth", None, 200, true, "Log in with e-mail and password"),
        route!(POST "/api/v1/auth/refresh", Refresh, "auth", Jwt, 200, false, "A new access token (within 7 days of login)"),
        route!(POST "/api/v1/auth/logout", Logout, "auth", Jwt, 204, false, "Sign out: this token's sign-in ends, so it and every token refreshed from it are refused from now on"),
        route!(POST "/api/v1/auth/api-keys", CreateApiKey, "auth", Jwt, 201, true, "Create an API key (shown once)"),
        route!(GET "/api/v1/auth/api-keys", ListApiKeys, "auth", Bearer, 200, false, "List the caller's API keys"),
        route!(DELETE "/api/v1/auth/api-keys/{key_id}", DeleteApiKey, "auth", Jwt, 204, false, "Revoke an API key"),
        route!(GET "/api/v1/users/me", Me, "users", Bearer, 200, false, "The caller and their organizations"),
        route!(POST "/api/v1/users", CreateUser, "users", Bearer, 201, true, "Create a user (superuser)"),
        route!(POST "/api/v1/organizations", CreateOrg, "organizations", Bearer, 201, true, "Create an organization"),
        route!(GET "/api/v1/organizations", ListOrgs, "organizations", Bearer, 200, false, "The caller's organizations"),
        route!(GET "/api/v1/organizations/{org}", GetOrg, "organizations", Bearer, 200, false, "An organization (member)"),
        route!(PATCH "/api/v1/organizations/{org}", PatchOrg, "organizations", Bearer, 200, true, "Rename an organization (admin) or change its tier (superuser)"),
        route!(DELETE "/api/v1/organizations/{org}", DeleteOrg, "organizations", Bearer, 204, false, "Delete an organization (owner): gone at once, its projects' data purged in the background"),
        route!(POST "/api/v1/organizations/{org}/members", AddMember, "organizations", Bearer, 201, true, "Add a member (admin)"),
        route!(POST "/api/v1/organizations/{org}/projects", CreateProject, "organizations", Bearer, 201, true, "Create a project (admin); the secret is shown once"),
        route!(GET "/api/v1/organizations/{org}/projects", ListProjects, "organizations", Bearer, 200, false, "List projects"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/rotate-secret", RotateSecret, "organizations", Bearer, 200, false, "Rotate the project secret (admin)"),
        route!(GET "/api/v1/organizations/{org}/devices", OrgDevices, "devices", Bearer, 200, false, "Devices of every project of the organization"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/devices", CreateDevice, "devices", Bearer, 201, true, "Register a device; its token is shown once"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/devices", ListDevices, "devices", Bearer, 200, false, "List devices (status, name, page, page_size)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}", GetDevice, "devices", Bearer, 200, false, "A device"),
        route!(PATCH "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}", PatchDevice, "devices", Bearer, 200, true, "Rename or relabel a device"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}", DeleteDevice, "devices", Bearer, 204, false, "Delete a device (its sessions are kept)"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}/heartbeat", Heartbeat, "devices", Bearer, 202, true, "Heartbeat with metrics (device token or member)"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/enrollment-tokens", CreateEnrollmentToken, "devices", Bearer, 201, true, "Create an enrollment token (admin); the token is shown once"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/enrollment-tokens", ListEnrollmentTokens, "devices", Bearer, 200, false, "List the project's enrollment tokens (admin)"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/enrollment-tokens/{token_id}", DeleteEnrollmentToken, "devices", Bearer, 204, false, "Revoke an enrollment token (admin)"),
        route!(POST "/api/v1/device/enroll", Enroll, "devices", Enrollment, 201, true, "A robot registers itself with an enrollment token: its device, with its device token shown once"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/device-groups", CreateGroup, "devices", Bearer, 201, true, "Create a device group"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/device-groups", ListGroups, "devices", Bearer, 200, false, "List device groups"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/device-groups/{group_id}", GetGroup, "devices", Bearer, 200, false, "A device group"),
        route!(PATCH "/api/v1/organizations/{org}/projects/{project}/device-groups/{group_id}", PatchGroup, "devices", Bearer, 200, true, "Rename a group or replace its devices"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/device-groups/{group_id}", DeleteGroup, "devices", Bearer, 204, false, "Delete a device group"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/sessions", CreateSession, "sessions", Bearer, 201, true, "Start a session (device token or member)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions", ListSessions, "sessions", Bearer, 200, false, "List sessions (device_id, status, since, until, page, page_size)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}", GetSession, "sessions", Bearer, 200, false, "Session detail with metrics"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/log-retention", GetLogRetention, "sessions", Bearer, 200, false, "How long the project's ended sessions are kept"),
        route!(PATCH "/api/v1/organizations/{org}/projects/{project}/log-retention", PatchLogRetention, "sessions", Bearer, 200, true, "Set how long ended sessions are kept, with their logs and files (admin; null: the server's default, 0: for good)"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}", DeleteSession, "sessions", Bearer, 204, false, "Delete a session with its logs and artifacts, for good"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/tags", AddTag, "sessions", Bearer, 200, true, "Add a tag"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/tags/{tag}", RemoveTag, "sessions", Bearer, 200, false, "Remove a tag"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/logs", AppendLogs, "logs", Bearer, 202, true, "Append a batch of log entries (JSON array or NDJSON), durable on 202"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/logs", QueryLogs, "logs", Bearer, 200, false, "Query logs (level, module, search, since, until, limit, offset)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/logs/export", ExportLogs, "logs", Bearer, 200, false, "Download matching logs as JSON or CSV (format=json|csv), streamed"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/files", ListFiles, "artifacts", Bearer, 200, false, "List a session's artifact files, sorted by path"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/files/download", DownloadFiles, "artifacts", Bearer, 200, false, "Every artifact as one ZIP, streamed"),
        route!(PUT "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/files/download", PutFile, "artifacts", Bearer, 201, true, "Upload a file whose path is exactly `download` (readable only through the ZIP)"),
        route!(PUT "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/files/{*path}", PutFile, "artifacts", Bearer, 201, true, "Upload an artifact (raw bytes; Content-Type kept or guessed), replacing the same path"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/files/{*path}", GetFile, "artifacts", Bearer, 200, false, "Download an artifact (a single Range gives 206)"),
        route!(GET "/api/v1/ws/organizations/{org}/projects/{project}/sessions/{session_id}/logs", LiveLogs, "logs", Bearer, 101, false, "WebSocket: live logs (replay, level, module; token= for browsers)"),
        route!(POST "/api/v1/projects/{org}/{project}/capsules/upload-url", CapsuleUploadUrl, "capsules", ProjectSecret, 201, true, "Create a capsule version and a presigned upload URL (X-Project-Secret)"),
        route!(POST "/api/v1/projects/{org}/{project}/capsules/{capsule_id}/confirm", CapsuleConfirm, "capsules", ProjectSecret, 200, true, "Confirm an upload with its SHA-256; validates the capsule"),
        route!(GET "/api/v1/projects/{org}/{project}/capsules", ListCapsules, "capsules", Bearer, 200, false, "List capsule versions (name, type, latest_only)"),
        route!(GET "/api/v1/projects/{org}/{project}/capsules/{capsule_id}", GetCapsule, "capsules", Bearer, 200, false, "A capsule version with all_versions and a 15-minute download_url"),
        route!(DELETE "/api/v1/projects/{org}/{project}/capsules/{capsule_id}", DeleteCapsule, "capsules", Bearer, 204, false, "Delete a capsule version"),
        route!(PUT "/api/v1/uploads/{token}", Upload, "capsules", None, 200, true, "The presigned upload URL of the local backend"),
        route!(GET "/api/v1/downloads/{token}", Download, "capsules", None, 200, false, "The presigned download URL of the local backend"),
        route!(POST "/api/v1/projects/{org}/{project}/configurations/upload-url", ConfigUploadUrl, "configurations", ProjectSecret, 201, true, "Create a configuration version and a presigned upload URL (X-Project-Secret)"),
        route!(POST "/api/v1/projects/{org}/{project}/configurations/{config_id}/confirm", ConfigConfirm, "configurations", ProjectSecret, 200, true, "Confirm an upload with its SHA-256; parses, inherits and validates"),
        route!(GET "/api/v1/projects/{org}/{project}/configurations", ListConfigs, "configurations", Bearer, 200, false, "List configurations (capsule_id, environment, page, page_size)"),
        route!(GET "/api/v1/projects/{org}/{project}/configurations/{config_id}", GetConfig, "configurations", Bearer, 200, false, "A configuration with a 15-minute download_url"),
        route!(GET "/api/v1/projects/{org}/{project}/configurations/{config_id}/explain", ExplainConfig, "configurations", Bearer, 200, false, "The effective configuration, who set each leaf, and schema errors by JSON Pointer"),
        route!(DELETE "/api/v1/projects/{org}/{project}/configurations/{config_id}", DeleteConfig, "configurations", Bearer, 204, false, "Delete a configuration (409 while referenced)"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments", CreateDeployment, "deployments", Bearer, 201, true, "Create a deployment package (draft)"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/plan", PlanDeployment, "deployments", Bearer, 200, true, "The devices a deployment body would target and every reason it would be blocked; creates nothing"),
        route!(GET "/api/v1/projects/{org}/{project}/deployments", ListDeployments, "deployments", Bearer, 200, false, "List deployment packages (deployment_status, page, page_size)"),
        route!(GET "/api/v1/projects/{org}/{project}/deployments/{deployment_id}", GetDeployment, "deployments", Bearer, 200, false, "A deployment package with device_results"),
        route!(PATCH "/api/v1/projects/{org}/{project}/deployments/{deployment_id}", PatchDeployment, "deployments", Bearer, 200, true, "Change a draft"),
        route!(DELETE "/api/v1/projects/{org}/{project}/deployments/{deployment_id}", DeleteDeployment, "deployments", Bearer, 204, false, "Delete a draft"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/activate", ActivateDeployment, "deployments", Bearer, 200, false, "draft -> active (sets deployed_at)"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/deprecate", DeprecateDeployment, "deployments", Bearer, 200, false, "active -> deprecated (sets deprecated_at)"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/device-status", DeviceStatus, "deployments", Bearer, 202, true, "A device's rollout result (device token or member)"),
        route!(GET "/api/v1/projects/{org}/{project}/policy", GetPolicy, "deployments", Bearer, 200, false, "The project's rollout policy"),
        route!(PATCH "/api/v1/projects/{org}/{project}/policy", PatchPolicy, "deployments", Bearer, 200, true, "Change the rollout policy (admin): require_passed_test_run"),
        route!(GET "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/rollout", GetRollout, "deployments", Bearer, 200, false, "A phased rollout: phases with their devices, states and counts, and the gate decisions"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/rollout/pause", PauseRollout, "deployments", Bearer, 200, false, "Pause a running rollout"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/rollout/resume", ResumeRollout, "deployments", Bearer, 200, false, "Resume a paused rollout (the phase's gate starts over)"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/rollout/abort", AbortRollout, "deployments", Bearer, 200, false, "Stop a rollout for good (devices already in keep the package)"),
        route!(POST "/api/v1/projects/{org}/{project}/deployments/{deployment_id}/rollout/devices/{device_id}/retry", RetryDevice, "deployments", Bearer, 200, false, "Offer the package again to a device that failed it"),
        route!(GET "/api/v1/device/deployment", DeviceUpdate, "device updates", Device, 200, false, "The package this device should run now (its own device token only); ETag, 304 when unchanged, 204 when nothing is assigned"),
        route!(POST "/api/v1/device/deployment/{deployment_id}/status", DeviceUpdateStatus, "device updates", Device, 202, true, "This device's state with a package: downloading, installing, rebooting, succeeded or failed (its own device token only)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/devices/{device_id}/history", DeviceHistory, "devices", Bearer, 200, false, "The packages a device ran, with its reports"),
        route!(POST "/api/v1/scm/webhooks", ScmWebhook, "webhooks", None, 202, true, "Inbound host webhook (X-Hub-Signature-256 over the raw body; X-Host-* or X-GitHub-* headers)"),
        route!(GET "/api/v1/admin/organizations", AdminOrgs, "operations", Bearer, 200, false, "Every organization of the service, newest first, with the purges still under way (superuser)"),
        route!(POST "/api/v1/admin/backup", Backup, "operations", Bearer, 201, true, "A consistent copy of the data directory at `to`, an absolute path on the server's host outside the data directory (superuser); writes wait while it is made"),
        route!(POST "/api/v1/scm/webhook-secret/rotate", ScmRotate, "webhooks", Bearer, 200, false, "Rotate the webhook secret (superuser); the previous verifies during the grace period"),
        route!(GET "/api/v1/scm/status", ScmStatus, "webhooks", Bearer, 200, false, "Secret age, rotation due, signature failures (superuser)"),
        route!(GET "/api/v1/scm/installations", ScmInstallations, "webhooks", Bearer, 200, false, "Host installations (superuser)"),
        route!(PUT "/api/v1/scm/installations/{installation_id}/organization", BindInstallation, "webhooks", Bearer, 200, true, "Bind an installation to an organization (superuser); its deliveries resolve only to that organization's links"),
        route!(GET "/api/v1/scm/deliveries", ScmDeliveries, "webhooks", Bearer, 200, false, "The delivery log (superuser; outcome, reason, page, page_size)"),
        route!(GET "/api/v1/scm/deliveries/{delivery_id}", ScmDelivery, "webhooks", Bearer, 200, false, "One accepted delivery with its payload (superuser)"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/repositories", CreateRepo, "webhooks", Bearer, 201, true, "Link a repository to the project"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/repositories", ListRepos, "webhooks", Bearer, 200, false, "Linked repositories"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/repositories/{repo_id}", GetRepo, "webhooks", Bearer, 200, false, "A linked repository"),
        route!(PATCH "/api/v1/organizations/{org}/projects/{project}/repositories/{repo_id}", PatchRepo, "webhooks", Bearer, 200, true, "Change branch patterns or the draft policy"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/repositories/{repo_id}", DeleteRepo, "webhooks", Bearer, 204, false, "Unlink a repository (its runs are kept)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/test-runs", ListRuns, "webhooks", Bearer, 200, false, "Test runs (status, repository, commit_sha, page, page_size)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/test-runs/{run_id}", GetRun, "webhooks", Bearer, 200, false, "A test run"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/test-runs/claim", ClaimRun, "webhooks", Bearer, 200, false, "A runner takes the oldest queued run (204 when none)"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/test-runs/{run_id}/heartbeat", RunHeartbeat, "webhooks", Bearer, 200, false, "Renew a running run's lease"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/test-runs/{run_id}/complete", CompleteRun, "webhooks", Bearer, 200, true, "Finish a running run as passed or failed"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/webhook-deliveries", ProjectDeliveries, "webhooks", Bearer, 200, false, "Deliveries resolved to this project"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/webhook-deliveries/{delivery_id}", ProjectDelivery, "webhooks", Bearer, 200, false, "One delivery of this project with its payload"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/integrations", CreateIntegration, "alerts", Bearer, 201, true, "Create an integration (chat, incident, email, webhook)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/integrations", ListIntegrations, "alerts", Bearer, 200, false, "Integrations, secrets masked"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/integrations/{integration_id}", GetIntegration, "alerts", Bearer, 200, false, "An integration, secrets masked"),
        route!(PATCH "/api/v1/organizations/{org}/projects/{project}/integrations/{integration_id}", PatchIntegration, "alerts", Bearer, 200, true, "Rename, enable or disable, or merge config keys"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/integrations/{integration_id}", DeleteIntegration, "alerts", Bearer, 204, false, "Delete an integration (and take it out of every rule)"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/integrations/{integration_id}/test", TestIntegration, "alerts", Bearer, 200, false, "Send one test alert now"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/alert-rules", CreateAlertRule, "alerts", Bearer, 201, true, "Create an alert rule"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/alert-rules", ListAlertRules, "alerts", Bearer, 200, false, "Alert rules"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/alert-rules/backtest", BacktestRule, "alerts", Bearer, 200, true, "When a draft rule would have fired and resolved over the stored history"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/alert-rules/{rule_id}", GetAlertRule, "alerts", Bearer, 200, false, "An alert rule"),
        route!(PATCH "/api/v1/organizations/{org}/projects/{project}/alert-rules/{rule_id}", PatchAlertRule, "alerts", Bearer, 200, true, "Change any subset of a rule's fields"),
        route!(DELETE "/api/v1/organizations/{org}/projects/{project}/alert-rules/{rule_id}", DeleteAlertRule, "alerts", Bearer, 204, false, "Delete an alert rule"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/alerts", ListAlerts, "alerts", Bearer, 200, false, "Alert history (state, rule_id, page, page_size)"),
        route!(GET "/api/v1/organizations/{org}/projects/{project}/alerts/{alert_id}", GetAlert, "alerts", Bearer, 200, false, "One alert with its notifications"),
        route!(POST "/api/v1/organizations/{org}/projects/{project}/sessions/{session_id}/complete", CompleteSession, "sessions", Bearer, 200, true, "End a session as completed or failed"),
    ]
}

/// What a request path and method resolve to.
pub enum Resolved {
    /// The operation, its path template (a metrics label) and the path's parameters.
    Found(Op, &'static str, Vec<(String, String)>),
    /// The path exists with other methods (the `Allow` value).
    WrongMethod(String),
    NotFound,
}

pub struct Router {
    paths: matchit::Router<usize>,
    /// The console's pages, per path: (method, page) pairs.
    pages: matchit::Router<Vec<(Method, Page)>>,
    /// Per path: its template, methods and operations.
    methods: Vec<(&'static str, Vec<(Method, Op)>)>,
}

impl Router {
    pub fn new(routes: &[RouteDef], pages: &[PageDef]) -> Result<Self, matchit::InsertError> {
        let mut by_path: Vec<(&'static str, Vec<(Method, Page)>)> = Vec::new();
        for p in pages {
            match by_path.iter_mut().find(|(path, _)| *path == p.path) {
                Some((_, m)) => m.push((p.method.clone(), p.page)),
                None => by_path.push((p.path, vec![(p.method.clone(), p.page)])),
            }
        }
        let mut page_paths = matchit::Router::new();
        for (path, m) in by_path {
            page_paths.insert(path, m)?;
        }
        let mut paths = matchit::Router::new();
        let mut methods: Vec<(&'static str, Vec<(Method, Op)>)> = Vec::new();
        let mut index: Vec<&str> = Vec::new();
        for r in routes {
            match index.iter().position(|p| *p == r.path) {
                Some(i) => {
                    if let Some((_, m)) = methods.get_mut(i) {
                        m.push((r.method.clone(), r.op));
                    }
                }
                None => {
                    paths.insert(r.path, index.len())?;
                    index.push(r.path);
                    methods.push((r.path, vec![(r.method.clone(), r.op)]));
                }
            }
        }
        Ok(Self {
            paths,
            pages: page_paths,
            methods,
        })
    }

    /// The console page `method` and `path` ask for, with its path parameters (still
    /// percent-encoded); `None` for a path or method the console does not serve.
    pub fn page(&self, method: &Method, path: &str) -> Option<(Page, Vec<(String, String)>)> {
        let m = self.pages.at(path).ok()?;
        let (_, page) = m.value.iter().find(|(mm, _)| mm == method)?;
        let params = m
            .params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some((*page, params))
    }

    pub fn resolve(&self, method: &Method, path: &str) -> Resolved {
        let Ok(m) = self.paths.at(path) else {
            return Resolved::NotFound;
        };
        let Some((template, ops)) = self.methods.get(*m.value) else {
            return Resolved::NotFound;
        };
        // HEAD is answered like GET (hyper drops the body).
        let want = if method == Method::HEAD {
            &Method::GET
        } else {
            method
        };
        match ops.iter().find(|(mm, _)| mm == want) {
            Some((_, op)) => Resolved::Found(
                *op,
                template,
                m.params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            None => Resolved::WrongMethod(
                ops.iter()
                    .map(|(m, _)| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        }
    }
}

#[cfg(test)]
mod tests;
