//! Alert rules: the bodies `http/` sends, their checks (a condition of a known type with
//! valid fields, a known severity), and the rules as shown. Whether the named integrations
//! and groups exist is decided by the project's actor when it writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AlertsHandle;
use super::evaluator::RuleHealth;
use crate::clock::fmt_ms;
use crate::error::{Error, Result};
use crate::project::AlertingMsg;
use crate::project::alerting::{RuleDraft, RulePatch};
use crate::rules::alert_conditions::Condition;
use fleetops_storage::{AlertRule, Severity};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RuleRequest {
    #[schemars(schema_with = "crate::rules::schemas::name")]
    pub name: String,
    #[schemars(with = "Condition")]
    pub condition: Value,
    #[schemars(with = "Severity")]
    pub severity: String,
    #[serde(default, deserialize_with = "crate::rules::whole::vec_u64")]
    #[schemars(schema_with = "crate::rules::schemas::ids::<100>")]
    pub integration_ids: Vec<u64>,
    #[serde(default, deserialize_with = "crate::rules::whole::opt_vec_u64")]
    #[schemars(schema_with = "crate::rules::schemas::opt_ids::<100>")]
    pub device_group_ids: Option<Vec<u64>>,
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// Any subset of the fields; others (such as `id` or `created_at` from a GET sent back) are
/// ignored, as for integrations.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct RulePatchRequest {
    #[serde(default)]
    #[schemars(schema_with = "crate::rules::schemas::opt_name")]
    pub name: Option<String>,
    #[serde(default)]
    #[schemars(with = "Option<Condition>")]
    pub condition: Option<Value>,
    #[serde(default)]
    #[schemars(with = "Option<Severity>")]
    pub severity: Option<String>,
    #[serde(default, deserialize_with = "crate::rules::whole::opt_vec_u64")]
    #[schemars(schema_with = "crate::rules::schemas::opt_ids::<100>")]
    pub integration_ids: Option<Vec<u64>>,
    #[serde(default, deserialize_with = "crate::rules::whole::opt_vec_u64")]
    #[schemars(schema_with = "crate::rules::schemas::opt_ids::<100>")]
    pub device_group_ids: Option<Vec<u64>>,
    pub enabled: Option<bool>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RuleView {
    pub id: u64,
    pub name: String,
    #[schemars(with = "Condition")]
    pub condition: Value,
    pub severity: Severity,
    pub integration_ids: Vec<u64>,
    pub device_group_ids: Vec<u64>,
    pub enabled: bool,
    /// `ok`: evaluated as written; `degraded`: evaluated, but not as efficiently as usual
    /// (a log rule matched apart from the project's others because their patterns could not
    /// be compiled together); `error`: not evaluated. `health_detail` says why.
    pub health: RuleHealthState,
    pub health_detail: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RuleHealthState {
    Ok,
    Degraded,
    Error,
}

impl RuleView {
    fn new(r: &AlertRule, health: Option<RuleHealth>) -> Self {
        let (health, health_detail) = match health {
            None => (RuleHealthState::Ok, None),
            Some(RuleHealth::Degraded(why)) => (RuleHealthState::Degraded, Some(why)),
            Some(RuleHealth::Error(why)) => (RuleHealthState::Error, Some(why)),
        };
        Self {
            id: r.id,
            name: r.name.clone(),
            condition: serde_json::from_slice(&r.condition_json).unwrap_or(Value::Null),
            severity: r.severity,
            integration_ids: r.integration_ids.clone(),
            device_group_ids: r.device_group_ids.clone(),
            enabled: r.enabled,
            health,
            health_detail,
            created_at: fmt_ms(r.created_at),
            updated_at: fmt_ms(r.updated_at),
        }
    }
}

fn severity(s: &str) -> Result<Severity> {
    Severity::parse(s)
        .ok_or_else(|| Error::unprocessable("severity", "must be critical, warning or info"))
}

/// A condition, with the log level checked against the levels logs carry.
pub fn condition(v: &Value) -> Result<Condition> {
    let c = Condition::parse(v)?;
    if let Condition::LogPattern {
        level: Some(level), ..
    } = &c
        && crate::logs::parse_level(level).is_none()
    {
        return Err(Error::unprocessable(
            "condition.level",
            "must be debug, info, warning or error",
        ));
    }
    Ok(c)
}

impl AlertsHandle {
    /// A rule with what its project's evaluator last recorded of it (a disabled rule, or
    /// one not loaded yet, is `ok`).
    fn rule_view(&self, r: &AlertRule) -> RuleView {
        let h = if r.enabled {
            self.feed
                .rule_health
                .get(&(r.project_id, r.id))
                .map(|h| h.clone())
        } else {
            None
        };
        RuleView::new(r, h)
    }

    pub fn rules(&self, pid: u64) -> Result<Vec<RuleView>> {
        Ok(self
            .store
            .project_alert_rules(pid)?
            .iter()
            .map(|r| self.rule_view(r))
            .collect())
    }

    pub fn rule(&self, pid: u64, id: u64) -> Result<RuleView> {
        self.store
            .alert_rule(pid, id)?
            .map(|r| self.rule_view(&r))
            .ok_or_else(|| Error::not_found("Alert rule"))
    }

    pub async fn create_rule(&self, pid: u64, req: RuleRequest) -> Result<RuleView> {
        let draft = RuleDraft {
            name: req.name,
            condition: condition(&req.condition)?,
            severity: severity(&req.severity)?,
            integration_ids: req.integration_ids,
            device_group_ids: req.device_group_ids.unwrap_or_default(),
            enabled: req.enabled.unwrap_or(true),
        };
        let r = self
            .projects
            .write(pid, |reply| AlertingMsg::CreateAlertRule {
                draft: Box::new(draft.clone()),
                reply,
            })
            .await?;
        self.feed.rules_changed(&self.store, pid).await;
        Ok(self.rule_view(&r))
    }

    pub async fn update_rule(&self, pid: u64, id: u64, req: RulePatchRequest) -> Result<RuleView> {
        let patch = RulePatch {
            name: req.name,
            condition: req.condition.as_ref().map(condition).transpose()?,
            severity: req.severity.as_deref().map(severity).transpose()?,
            integration_ids: req.integration_ids,
            device_group_ids: req.device_group_ids,
            enabled: req.enabled,
        };
        let r = self
            .projects
            .write(pid, |reply| AlertingMsg::UpdateAlertRule {
                id,
                patch: Box::new(patch.clone()),
                reply,
            })
            .await?;
        self.feed.rules_changed(&self.store, pid).await;
        Ok(self.rule_view(&r))
    }

    pub async fn delete_rule(&self, pid: u64, id: u64) -> Result<()> {
        self.projects
            .write(pid, |reply| AlertingMsg::DeleteAlertRule { id, reply })
            .await?;
        self.feed.rules_changed(&self.store, pid).await;
        Ok(())
    }
}
