//! The Rust type of each operation's request body and answer, as a schema generator.

use super::*;

/// A body's schema: a `$ref` into `components/schemas`, generated from the Rust type the
/// handler parses or serializes.
pub(super) type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

pub(super) fn ty<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// The plan takes a deployment's body and reports each rule it breaks as a blocker in its
/// 200, so its schema is that body's shape alone: the types, without the rules.
pub(super) fn plan_request(g: &mut SchemaGenerator) -> Schema {
    pub(super) fn shape(v: &Value) -> Value {
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
pub(super) fn types(op: Op) -> (Option<SchemaFn>, Option<SchemaFn>) {
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
