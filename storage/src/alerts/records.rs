//! Integrations, alert rules, alerts, their notifications and condition states.

use serde::{Deserialize, Serialize};

/// An alert integration of a project: where notifications go.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Integration {
    pub id: u64,
    pub project_id: u64,
    pub kind: crate::IntegrationType,
    pub name: String,
    pub enabled: bool,
    /// The config fields that are not secret, as a JSON object.
    pub config_json: Vec<u8>,
    /// The secret config fields as a JSON object, sealed with the data directory's
    /// secret-encryption key (nonce, ciphertext and tag); never stored in the clear.
    pub sealed_secrets: Vec<u8>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// An alert rule of a project.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AlertRule {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    /// The condition as the client sent it once validated, as a JSON object.
    pub condition_json: Vec<u8>,
    pub severity: crate::Severity,
    /// Sorted, unique; integrations of the same project.
    pub integration_ids: Vec<u64>,
    /// Sorted, unique; empty means every device of the project.
    pub device_group_ids: Vec<u64>,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The deployment package most recently activated for a device, named by an alert that
/// fired soon after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelatedDeployment {
    pub id: u64,
    pub name: String,
    pub activated_at: i64,
}

/// One firing (and later resolution) of a rule for a device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Alert {
    pub id: u64,
    pub project_id: u64,
    pub rule_id: u64,
    pub rule_name: String,
    pub severity: crate::Severity,
    pub state: crate::AlertState,
    pub device_id: u64,
    pub summary: String,
    pub fired_at: i64,
    pub resolved_at: Option<i64>,
    /// Pairs an incident's trigger and resolve.
    pub dedup_key: String,
    pub related_deployment: Option<RelatedDeployment>,
}

/// One notification of an alert to one integration, and its delivery so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    pub id: u64,
    pub project_id: u64,
    pub alert_id: u64,
    pub integration_id: u64,
    pub event: crate::AlertEvent,
    pub attempts: u32,
    /// `None` while delivery is still owed.
    pub success: Option<bool>,
    pub last_error: Option<String>,
    /// Unix milliseconds of the next attempt while owed.
    pub next_attempt_at: i64,
    pub created_at: i64,
}

/// The evaluator's durable state of one (rule, device): the condition has held since `since`;
/// `alert_id` once it fired. Absent when the condition does not hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionState {
    pub rule_id: u64,
    pub device_id: u64,
    pub since: i64,
    pub alert_id: Option<u64>,
}
