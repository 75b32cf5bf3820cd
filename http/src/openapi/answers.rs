//! What each operation answers beyond what the route table implies: one exhaustive match
//! ([`doc`]), so a new operation does not compile until it is described.

use super::*;

/// The request body an operation takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReqBody {
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
pub(super) struct Doc {
    /// Successful statuses besides the table's.
    pub(super) also: &'static [u16],
    /// Error statuses besides those that follow from security, path parameters and body.
    pub(super) errors: &'static [u16],
    /// Media types of the success body; empty for none.
    pub(super) media: &'static [&'static str],
    pub(super) body: Option<ReqBody>,
}

pub(super) const JSON: &[&str] = &["application/json"];

/// Answers JSON; `errors` besides the derived ones; the table says whether a JSON body is taken.
pub(super) const fn answers(errors: &'static [u16]) -> Doc {
    Doc {
        also: &[],
        errors,
        media: JSON,
        body: None,
    }
}

/// Only what follows from the table.
pub(super) const PLAIN: Doc = answers(&[]);
/// A list or query whose parameters are validated.
pub(super) const QUERY: Doc = answers(&[422]);
/// A write through an actor: 503 when it is overloaded, restarting or the flush fails.
pub(super) const WRITE: Doc = answers(&[503]);
/// A write that can conflict (duplicate, state, in use).
pub(super) const WRITE_409: Doc = answers(&[409, 503]);

pub(super) fn doc(op: Op) -> Doc {
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

pub(super) fn req_body(r: &RouteDef, d: &Doc) -> ReqBody {
    match d.body {
        Some(b) => b,
        None if r.body => ReqBody::Json,
        None => ReqBody::None,
    }
}
