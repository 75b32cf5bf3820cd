//! What the webhook routes answer.

use crate::clock::fmt_ms;
use fleetops_storage::TestRun;
use fleetops_storage::{DeliveryOutcome, Installation};
use serde::Serialize;
use serde_json::value::RawValue;

/// What `POST /scm/webhooks` answers with 202.
#[derive(Debug, Serialize, schemars::JsonSchema)]
#[schemars(rename = "DeliveryAccepted")]
pub struct Accepted {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
}

/// A delivery in the log.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DeliveryView {
    pub delivery_id: String,
    pub event: String,
    pub action: Option<String>,
    pub received_at: String,
    pub status_code: u16,
    pub outcome: LogOutcome,
    pub reason: Option<String>,
    pub installation_id: Option<u64>,
    pub repository: Option<String>,
    /// The resolved project's slug.
    pub project: Option<String>,
    pub test_run_id: Option<u64>,
    #[serde(skip)]
    pub(super) received_ms: i64,
}

/// The outcome the delivery log shows: a stored delivery's, or one of the two refusals kept
/// in memory only (they never became records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogOutcome {
    Stored(DeliveryOutcome),
    /// A bad or missing signature (401).
    Rejected,
    /// A delivery id already accepted (401).
    Duplicate,
}

impl LogOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            LogOutcome::Stored(o) => o.as_str(),
            LogOutcome::Rejected => "rejected",
            LogOutcome::Duplicate => "duplicate",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "rejected" => Some(LogOutcome::Rejected),
            "duplicate" => Some(LogOutcome::Duplicate),
            _ => DeliveryOutcome::parse(s).map(LogOutcome::Stored),
        }
    }

    /// Every name, for the 422 that answers an unknown one.
    pub fn names() -> Vec<&'static str> {
        let mut v: Vec<_> = DeliveryOutcome::ALL.iter().map(|o| o.as_str()).collect();
        v.extend(["rejected", "duplicate"]);
        v
    }
}

impl schemars::JsonSchema for LogOutcome {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LogOutcome".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "enum": LogOutcome::names()})
    }
}

impl Serialize for LogOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Whether a repository link is held by an installation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RepoState {
    /// No installation holds it yet.
    Pending,
    Connected,
    /// The installation removed it; its history is kept.
    Disconnected,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryView,
    /// The body as received (a JSON string when it was not JSON; null when not kept).
    pub payload: Option<Box<RawValue>>,
}

#[derive(Debug, Default, Clone)]
pub struct DeliveryFilter {
    pub outcome: Option<LogOutcome>,
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct InstallationView {
    pub id: u64,
    pub account_login: String,
    pub account_type: String,
    pub repository_selection: String,
    pub state: String,
    /// The slug of the organization it is bound to; null while unbound.
    pub organization: Option<String>,
    pub repositories: Vec<String>,
}

impl InstallationView {
    pub(super) fn new(i: &Installation, organization: Option<String>) -> Self {
        Self {
            id: i.id,
            account_login: i.account_login.clone(),
            account_type: i.account_type.clone(),
            repository_selection: i.repository_selection.clone(),
            state: i.state.to_string(),
            organization,
            repositories: i.repositories.clone(),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RepoView {
    pub id: u64,
    pub full_name: String,
    pub state: RepoState,
    pub installation_id: Option<u64>,
    pub branch_patterns: Vec<String>,
    pub include_drafts: bool,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct TestRunView {
    pub id: u64,
    pub repository: String,
    pub commit_sha: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub event: String,
    pub pull_request_number: Option<u64>,
    pub status: fleetops_storage::RunStatus,
    pub attempt: u32,
    pub idempotency_key: String,
    pub delivery_id: Option<String>,
    pub summary: Option<String>,
    pub urls: Box<RawValue>,
    pub lease_expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&TestRun> for TestRunView {
    fn from(r: &TestRun) -> Self {
        Self {
            id: r.id,
            repository: r.repository.clone(),
            commit_sha: r.commit_sha.clone(),
            git_ref: r.git_ref.clone(),
            event: r.event.clone(),
            pull_request_number: r.pull_request_number,
            status: r.status,
            attempt: r.attempt,
            idempotency_key: r.idempotency_key.clone(),
            delivery_id: r.delivery_id.clone(),
            summary: r.summary.clone(),
            urls: crate::views::raw_json(&r.urls_json, "{}"),
            lease_expires_at: r.lease_expires_at.map(fmt_ms),
            created_at: fmt_ms(r.created_at),
            updated_at: fmt_ms(r.updated_at),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct RunFilter {
    pub status: Option<fleetops_storage::RunStatus>,
    pub repository: Option<String>,
    pub commit_sha: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Rotated {
    pub webhook_secret: String,
    pub previous_valid_until: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct WebhooksStatus {
    pub secret_age_days: Option<i64>,
    pub rotation_due: bool,
    pub signature_failures_last_hour: usize,
    pub signature_failure_alert: bool,
}
