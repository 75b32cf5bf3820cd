//! Integrations: what `http/` sends in, what it gets back (secrets masked), and the test
//! endpoint, which renders and sends one test alert at once, with no retries.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::AlertsHandle;
use crate::clock::fmt_ms;
use crate::error::{Error, Result};
use crate::project::AlertingMsg;
use crate::project::alerting::{full_config, open_secret};
use crate::rules::notifications::{AlertMessage, IntegrationConfig, mask, render, secret_field};
use fleetops_storage::{AlertEvent, Integration, IntegrationType, Severity};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct IntegrationRequest {
    #[serde(rename = "type")]
    #[schemars(with = "IntegrationType")]
    pub kind: String,
    #[schemars(schema_with = "crate::rules::schemas::name")]
    pub name: String,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub config: Value,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct IntegrationPatch {
    #[serde(rename = "type", default)]
    #[schemars(with = "Option<IntegrationType>")]
    pub kind: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "crate::rules::schemas::opt_name")]
    pub name: Option<String>,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub config: Option<Value>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct IntegrationView {
    pub id: u64,
    #[serde(rename = "type")]
    pub kind: IntegrationType,
    pub name: String,
    pub enabled: bool,
    pub created_at: String,
    pub updated_at: String,
    /// The config with its secret masked.
    pub config: Value,
}

/// What `POST /integrations/{id}/test` answers.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct TestResult {
    pub success: bool,
    pub message: String,
}

fn kind(s: &str) -> Result<IntegrationType> {
    IntegrationType::parse(s)
        .ok_or_else(|| Error::unprocessable("type", "must be chat, incident, email or webhook"))
}

impl AlertsHandle {
    fn view(&self, i: &Integration) -> Result<IntegrationView> {
        let public: Value = serde_json::from_slice(&i.config_json)
            .map_err(|e| Error::Internal(format!("integration config: {e}")))?;
        let masked = open_secret(&self.sealer, i)?.map(|s| mask(i.kind, &s));
        Ok(IntegrationView {
            id: i.id,
            kind: i.kind,
            name: i.name.clone(),
            enabled: i.enabled,
            created_at: fmt_ms(i.created_at),
            updated_at: fmt_ms(i.updated_at),
            config: IntegrationConfig::join(i.kind, &public, masked.as_deref()),
        })
    }

    fn stored(&self, pid: u64, id: u64) -> Result<Integration> {
        self.store
            .integration(pid, id)?
            .ok_or_else(|| Error::not_found("Integration"))
    }

    pub fn integrations(&self, pid: u64) -> Result<Vec<IntegrationView>> {
        self.store
            .project_integrations(pid)?
            .iter()
            .map(|i| self.view(i))
            .collect()
    }

    pub fn integration(&self, pid: u64, id: u64) -> Result<IntegrationView> {
        self.view(&self.stored(pid, id)?)
    }

    pub async fn create_integration(
        &self,
        pid: u64,
        req: IntegrationRequest,
    ) -> Result<IntegrationView> {
        let kind = kind(&req.kind)?;
        if !req.config.is_object() {
            return Err(Error::unprocessable("config", "must be an object"));
        }
        let i = self
            .projects
            .write(pid, |reply| AlertingMsg::CreateIntegration {
                kind,
                name: req.name.clone(),
                enabled: req.enabled.unwrap_or(true),
                config: req.config.clone(),
                reply,
            })
            .await?;
        self.view(&i)
    }

    pub async fn update_integration(
        &self,
        pid: u64,
        id: u64,
        patch: IntegrationPatch,
    ) -> Result<IntegrationView> {
        let kind = patch.kind.as_deref().map(kind).transpose()?;
        let config: Option<Map<String, Value>> = match patch.config {
            None => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => return Err(Error::unprocessable("config", "must be an object")),
        };
        let i = self
            .projects
            .write(pid, |reply| AlertingMsg::UpdateIntegration {
                id,
                kind,
                name: patch.name.clone(),
                enabled: patch.enabled,
                config: config.clone(),
                reply,
            })
            .await?;
        self.view(&i)
    }

    /// Also takes it out of every rule, so the evaluator reloads them.
    pub async fn delete_integration(&self, pid: u64, id: u64) -> Result<()> {
        self.projects
            .write(pid, |reply| AlertingMsg::DeleteIntegration { id, reply })
            .await?;
        self.feed.rules_changed(&self.store, pid).await;
        Ok(())
    }

    /// Sends one test alert (severity info) and answers how it went; a refusal or a timeout
    /// is `success: false` with the reason, never an error of this request.
    pub async fn test_integration(&self, pid: u64, id: u64, project: &str) -> Result<TestResult> {
        let i = self.stored(pid, id)?;
        let cfg = full_config(&self.sealer, &i)?;
        let now = self.clock.now_ms();
        let msg = AlertMessage {
            event: AlertEvent::Test,
            alert_id: None,
            rule_id: None,
            rule_name: "test".into(),
            severity: Severity::Info,
            project: project.into(),
            device_id: None,
            device_name: None,
            summary: format!("Test alert from fleetops for integration \"{}\"", i.name),
            fired_at: now,
            resolved_at: None,
            dedup_key: format!("fleetops-test-{}", uuid::Uuid::new_v4()),
            related_deployment: None,
        };
        let out = render(
            &cfg,
            &msg,
            self.sender.pagerduty_url(),
            &uuid::Uuid::new_v4().to_string(),
            now / 1000,
        );
        Ok(match self.sender.send(&out).await {
            Ok(how) => TestResult {
                success: true,
                message: format!("Test alert sent ({how})"),
            },
            Err(e) => TestResult {
                success: false,
                message: e.message().to_string(),
            },
        })
    }
}

/// The secret field of `kind`, for documentation and tests.
pub fn secret_of(kind: IntegrationType) -> Option<&'static str> {
    secret_field(kind)
}
