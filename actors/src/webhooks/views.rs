//! What the webhook routes answer.

use crate::clock::fmt_ms;
use fleetops_storage::Installation;
use fleetops_storage::TestRun;
use serde::Serialize;
use serde_json::value::RawValue;

/// What `POST /scm/webhooks` answers with 202.
#[derive(Debug, Serialize)]
pub struct Accepted {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
}

/// A delivery in the log.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryView {
    pub delivery_id: String,
    pub event: String,
    pub action: Option<String>,
    pub received_at: String,
    pub status_code: u16,
    pub outcome: String,
    pub reason: Option<String>,
    pub installation_id: Option<u64>,
    pub repository: Option<String>,
    /// The resolved project's slug.
    pub project: Option<String>,
    pub test_run_id: Option<u64>,
    #[serde(skip)]
    pub(super) received_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryView,
    /// The body as received (a JSON string when it was not JSON; null when not kept).
    pub payload: Option<Box<RawValue>>,
}

#[derive(Debug, Default, Clone)]
pub struct DeliveryFilter {
    pub outcome: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct InstallationView {
    pub id: u64,
    pub account_login: String,
    pub account_type: String,
    pub repository_selection: String,
    pub state: String,
    pub repositories: Vec<String>,
}

impl From<&Installation> for InstallationView {
    fn from(i: &Installation) -> Self {
        Self {
            id: i.id,
            account_login: i.account_login.clone(),
            account_type: i.account_type.clone(),
            repository_selection: i.repository_selection.clone(),
            state: i.state.to_string(),
            repositories: i.repositories.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct RepoView {
    pub id: u64,
    pub full_name: String,
    /// pending (no installation holds it), connected, disconnected (removed; history kept).
    pub state: &'static str,
    pub installation_id: Option<u64>,
    pub branch_patterns: Vec<String>,
    pub include_drafts: bool,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Serialize)]
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

#[derive(Debug, Serialize)]
pub struct Rotated {
    pub webhook_secret: String,
    pub previous_valid_until: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct WebhooksStatus {
    pub secret_age_days: Option<i64>,
    pub rotation_due: bool,
    pub signature_failures_last_hour: usize,
    pub signature_failure_alert: bool,
}
