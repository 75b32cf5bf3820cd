//! [`ProjectMsg`]: what the handles ask of a project's writer, in one sub-enum per family
//! ([`DevicesMsg`], [`SessionsMsg`], [`PipelineMsg`], [`AlertingMsg`]), one variant per change,
//! each with the reply port its caller waits on. The writer applies each family's in its own
//! `apply_*` (`mod.rs`).

use super::*;

/// What a project's writer is asked, one sub-enum per family, each built only by that
/// family's handle (the layering test holds it), plus the supervision tests' faults.
pub(crate) enum ProjectMsg {
    Devices(DevicesMsg),
    Sessions(SessionsMsg),
    Pipeline(PipelineMsg),
    Alerting(AlertingMsg),
    /// Fault injection for supervision tests.
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Fault injection: holds the actor up, as a slow disk would (deadline tests).
    #[cfg(feature = "fault-injection")]
    Stall(std::time::Duration),
}

/// Changes to devices, groups and enrollment; built only by `project::handle` (devices, groups,
/// enrollment).
pub(crate) enum DevicesMsg {
    CreateDevice {
        name: String,
        labels: BTreeMap<String, String>,
        reply: Reply<(Device, String)>,
    },
    UpdateDevice {
        id: u64,
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        reply: Reply<Device>,
    },
    DeleteDevice {
        id: u64,
        reply: Reply<()>,
    },
    Heartbeat {
        id: u64,
        metrics: BTreeMap<String, f64>,
        reply: Reply<i64>,
    },
    CreateEnrollmentToken {
        spec: Box<enrollment::TokenSpec>,
        reply: Reply<(
            fleetops_storage::devices::enrollment::EnrollmentToken,
            String,
        )>,
    },
    DeleteEnrollmentToken {
        id: u64,
        reply: Reply<()>,
    },
    /// A robot registers itself with the enrollment token whose SHA-256 is `hash`.
    Enroll {
        hash: [u8; 32],
        name: String,
        labels: BTreeMap<String, String>,
        attempt: Option<[u8; 32]>,
        reply: Reply<(Device, String)>,
    },
    CreateGroup {
        name: String,
        device_ids: Vec<u64>,
        reply: Reply<DeviceGroup>,
    },
    UpdateGroup {
        id: u64,
        name: Option<String>,
        device_ids: Option<Vec<u64>>,
        reply: Reply<DeviceGroup>,
    },
    DeleteGroup {
        id: u64,
        reply: Reply<()>,
    },
}

impl From<DevicesMsg> for ProjectMsg {
    fn from(m: DevicesMsg) -> Self {
        ProjectMsg::Devices(m)
    }
}

/// Changes to session records and a project's log retention; built only by `session::handle`.
pub(crate) enum SessionsMsg {
    CreateSession {
        device_id: u64,
        tags: Vec<String>,
        package_id: Option<u64>,
        reply: Reply<Session>,
    },
    /// Marks an active session completed or failed.
    EndSession {
        id: u64,
        status: SessionStatus,
        reply: Reply<Session>,
    },
    Tag {
        id: u64,
        tag: String,
        add: bool,
        reply: Reply<Session>,
    },
    DeleteSession {
        id: u64,
        reply: Reply<Vec<String>>,
    },
    /// The project's own retention of ended sessions.
    SetLogRetention {
        retention: fleetops_storage::sessions::LogRetention,
        reply: Reply<fleetops_storage::sessions::LogRetention>,
    },
}

impl From<SessionsMsg> for ProjectMsg {
    fn from(m: SessionsMsg) -> Self {
        ProjectMsg::Sessions(m)
    }
}

/// Changes to capsules, configurations, uploads, deployments and rollouts; built only by the
/// pipeline's handles (`pipeline/`) including its rollout controllers (`pipeline::controller`).
pub(crate) enum PipelineMsg {
    CreateCapsule {
        capsule: Box<Capsule>,
        /// Where its code came from, if declared.
        source: Option<fleetops_storage::pipeline::rollouts::CapsuleSource>,
        /// The organization's quota turn, released once this message is written or dropped
        /// unapplied (never while the record may still appear).
        turn: Arc<Turn>,
        reply: Reply<Capsule>,
    },
    /// The bytes of a capsule or configuration were stored (refused once confirmed).
    Uploaded {
        kind: UploadKind,
        id: u64,
        size: u64,
        reply: Reply<()>,
    },
    /// Records confirm's verdict and recomputes `is_latest` for the name. `blob_key`: the
    /// sealed copy the verdict is about (S3), recorded in the same write; `None` keeps it.
    SettleCapsule {
        id: u64,
        size: u64,
        checksum: String,
        passed: bool,
        notes: String,
        blob_key: Option<String>,
        reply: Reply<Capsule>,
    },
    /// A confirm answered 202: the validation is owed (resumed at start-up until settled).
    ValidationPending {
        id: u64,
        checksum: String,
        reply: Reply<()>,
    },
    CreateConfiguration {
        config: Box<Configuration>,
        /// As for `CreateCapsule`.
        turn: Arc<Turn>,
        reply: Reply<Configuration>,
    },
    /// Confirm's hashing and parsing done; inherit, check, record (`blob_key` as for
    /// `SettleCapsule`).
    SettleConfiguration {
        id: u64,
        checksum: String,
        size: u64,
        blob_key: Option<String>,
        parsed: std::result::Result<serde_json::Map<String, serde_json::Value>, String>,
        notes: Vec<String>,
        reply: Reply<Configuration>,
    },
    /// Removes a capsule or configuration record; replies with the blob key to delete once
    /// durable. With `only_expired`, only a never-confirmed upload whose link has expired goes
    /// (`None`: kept). Each kind refuses while something still refers to it.
    DeleteUpload {
        kind: UploadKind,
        id: u64,
        only_expired: bool,
        reply: Reply<Option<String>>,
    },
    CreateDeployment {
        spec: Box<DeploymentSpec>,
        reply: Reply<Deployment>,
    },
    UpdateDeployment {
        id: u64,
        patch: Box<DeploymentPatch>,
        reply: Reply<Deployment>,
    },
    DeleteDeployment {
        id: u64,
        reply: Reply<()>,
    },
    TransitionDeployment {
        id: u64,
        to: Transition,
        reply: Reply<Deployment>,
    },
    /// A device's report on a package; `any_state` admits the intermediate states.
    ReportRollout {
        id: u64,
        device_id: u64,
        status: String,
        message: Option<String>,
        any_state: bool,
        reply: Reply<fleetops_storage::pipeline::rollouts::DeviceProgress>,
    },
    /// The project's rollout policy.
    SetPolicy {
        policy: fleetops_storage::pipeline::rollouts::ProjectPolicy,
        reply: Reply<fleetops_storage::pipeline::rollouts::ProjectPolicy>,
    },
    /// A member offers a failed package again to one device; replies with its offer count.
    RetryDevice {
        id: u64,
        device_id: u64,
        /// Who asked (the history's entry names them).
        by: String,
        reply: Reply<u32>,
    },
    /// A rollout's step (its controller) or a member's action on it.
    Rollout {
        id: u64,
        action: crate::rules::rollouts::RolloutAction,
        /// A controller's lease, which the write checks (several nodes); `None` for a member.
        fence: Option<fleetops_storage::leases::Fence>,
        reply: Reply<(fleetops_storage::pipeline::rollouts::Rollout, bool)>,
    },
}

impl From<PipelineMsg> for ProjectMsg {
    fn from(m: PipelineMsg) -> Self {
        ProjectMsg::Pipeline(m)
    }
}

/// Changes to alert integrations and rules; built only by `alerts::integrations` and
/// `alerts::rules`.
pub(crate) enum AlertingMsg {
    CreateIntegration {
        kind: fleetops_storage::IntegrationType,
        name: String,
        enabled: bool,
        config: serde_json::Value,
        reply: Reply<fleetops_storage::Integration>,
    },
    UpdateIntegration {
        id: u64,
        kind: Option<fleetops_storage::IntegrationType>,
        name: Option<String>,
        enabled: Option<bool>,
        config: Option<serde_json::Map<String, serde_json::Value>>,
        reply: Reply<fleetops_storage::Integration>,
    },
    /// Also takes it out of every rule.
    DeleteIntegration {
        id: u64,
        reply: Reply<()>,
    },
    CreateAlertRule {
        draft: Box<alerting::RuleDraft>,
        reply: Reply<fleetops_storage::AlertRule>,
    },
    UpdateAlertRule {
        id: u64,
        patch: Box<alerting::RulePatch>,
        reply: Reply<fleetops_storage::AlertRule>,
    },
    DeleteAlertRule {
        id: u64,
        reply: Reply<()>,
    },
}

impl From<AlertingMsg> for ProjectMsg {
    fn from(m: AlertingMsg) -> Self {
        ProjectMsg::Alerting(m)
    }
}

impl ProjectMsg {
    /// Answers the request with `e()`, unapplied (its project's organization was deleted
    /// after the request got past its lookup).
    pub(super) fn refuse(self, e: impl Fn() -> crate::Error) {
        match self {
            ProjectMsg::Devices(m) => m.refuse(e),
            ProjectMsg::Sessions(m) => m.refuse(e),
            ProjectMsg::Pipeline(m) => m.refuse(e),
            ProjectMsg::Alerting(m) => m.refuse(e),
            #[cfg(feature = "fault-injection")]
            ProjectMsg::Panic | ProjectMsg::Stall(_) => {}
        }
    }
}

/// Each family's `refuse`: every variant carries its reply port.
macro_rules! refuse {
    ($t:ident: $($v:ident),*) => {
        impl $t {
            fn refuse(self, e: impl Fn() -> crate::Error) {
                match self {
                    $($t::$v { reply, .. } => {
                        let _ = reply.send(Err(e()));
                    })*
                }
            }
        }
    };
}
refuse!(
    DevicesMsg:
    CreateDevice, UpdateDevice, DeleteDevice, Heartbeat, CreateEnrollmentToken,
    DeleteEnrollmentToken, Enroll, CreateGroup, UpdateGroup, DeleteGroup
);
refuse!(
    SessionsMsg:
    CreateSession, EndSession, Tag, DeleteSession, SetLogRetention
);
refuse!(
    PipelineMsg:
    CreateCapsule, Uploaded, SettleCapsule, ValidationPending, CreateConfiguration,
    SettleConfiguration, DeleteUpload, CreateDeployment, UpdateDeployment, DeleteDeployment,
    TransitionDeployment, ReportRollout, SetPolicy, RetryDevice, Rollout
);
refuse!(
    AlertingMsg:
    CreateIntegration, UpdateIntegration, DeleteIntegration, CreateAlertRule,
    UpdateAlertRule, DeleteAlertRule
);
