//! The ProjectActor's state changes for alerting: integrations (merged, validated and sealed
//! here, so concurrent patches cannot lose each other's keys) and alert rules (whose
//! integrations and device groups must exist in the project when written).

use serde_json::{Map, Value};

use super::ProjectState;
use crate::error::{Error, Result};
use crate::rules;
use crate::rules::alert_conditions::Condition;
use crate::rules::notifications::{IntegrationConfig, mask, secret_field};
use crate::secrets::Sealer;
use fleetops_storage::accounts::Seq;
use fleetops_storage::{AlertRule, Integration, IntegrationType, Severity};

/// What the project actors need to write integrations.
#[derive(Clone)]
pub(crate) struct AlertingCtx {
    pub sealer: Sealer,
    pub allow_private_targets: bool,
    /// At most one heartbeat sample per device per this many milliseconds is kept.
    pub history_resolution_ms: i64,
    /// `[alerts] max_rules_per_project`.
    pub max_rules: usize,
    /// `[alerts] max_integrations_per_rule` (at most [`rules::MAX_RULE_REFS`]).
    pub max_integrations_per_rule: usize,
}

/// The associated data a sealed secret is bound to.
pub(crate) fn seal_context(project: u64, id: u64) -> Vec<u8> {
    format!("integration/{project}/{id}").into_bytes()
}

/// The sealed secret of an integration, opened (`None` for types without one).
pub(crate) fn open_secret(sealer: &Sealer, i: &Integration) -> Result<Option<String>> {
    if i.sealed_secrets.is_empty() {
        return Ok(None);
    }
    let plain = sealer.open(&seal_context(i.project_id, i.id), &i.sealed_secrets)?;
    String::from_utf8(plain)
        .map(Some)
        .map_err(|_| Error::Internal("a sealed secret is not text".into()))
}

/// The whole config of an integration, secret opened.
pub(crate) fn full_config(sealer: &Sealer, i: &Integration) -> Result<IntegrationConfig> {
    let public: Value = serde_json::from_slice(&i.config_json)
        .map_err(|e| Error::Internal(format!("integration config: {e}")))?;
    let secret = open_secret(sealer, i)?;
    let whole = IntegrationConfig::join(i.kind, &public, secret.as_deref());
    // Stored configs were validated when written; private targets were allowed then.
    IntegrationConfig::parse(i.kind, &whole, true)
}

/// An alert rule as a handle hands it over: shape checked, references not yet.
#[derive(Debug, Clone)]
pub struct RuleDraft {
    pub name: String,
    pub condition: Condition,
    pub severity: Severity,
    pub integration_ids: Vec<u64>,
    pub device_group_ids: Vec<u64>,
    pub enabled: bool,
}

/// Any subset of a rule's fields.
#[derive(Debug, Clone, Default)]
pub struct RulePatch {
    pub name: Option<String>,
    pub condition: Option<Condition>,
    pub severity: Option<Severity>,
    pub integration_ids: Option<Vec<u64>>,
    pub device_group_ids: Option<Vec<u64>>,
    pub enabled: Option<bool>,
}

fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl ProjectState {
    fn integration(&self, id: u64) -> Result<Integration> {
        self.store
            .integration(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Integration"))
    }

    fn seal(&self, id: u64, secret: Option<&str>) -> Result<Vec<u8>> {
        match secret {
            None => Ok(Vec::new()),
            Some(s) => self
                .alerting
                .sealer
                .seal(&seal_context(self.pid(), id), s.as_bytes()),
        }
    }

    pub(super) fn create_integration(
        &self,
        kind: IntegrationType,
        name: String,
        enabled: bool,
        config: Value,
    ) -> Result<Integration> {
        let name = rules::name("name", &name, 200)?;
        let cfg = IntegrationConfig::parse(kind, &config, self.alerting.allow_private_targets)?;
        let (public, secret) = cfg.split();
        let id = self.store.new_id(Seq::Integration)?;
        let now = self.clock.now_ms();
        let i = Integration {
            id,
            project_id: self.pid(),
            kind,
            name,
            enabled,
            config_json: serde_json::to_vec(&public).map_err(|e| Error::Internal(e.to_string()))?,
            sealed_secrets: self.seal(id, secret.as_deref())?,
            created_at: now,
            updated_at: now,
        };
        self.store.put_integration(&i)?;
        Ok(i)
    }

    /// Merges `config` key by key into the stored one: a null removes an optional key, and
    /// the secret field omitted or equal to its mask keeps the stored secret.
    pub(super) fn update_integration(
        &self,
        id: u64,
        kind: Option<IntegrationType>,
        name: Option<String>,
        enabled: Option<bool>,
        config: Option<Map<String, Value>>,
    ) -> Result<Integration> {
        let mut i = self.integration(id)?;
        if kind.is_some_and(|k| k != i.kind) {
            return Err(Error::unprocessable(
                "type",
                "cannot change; delete the integration and create another",
            ));
        }
        if let Some(n) = name {
            i.name = rules::name("name", &n, 200)?;
        }
        if let Some(e) = enabled {
            i.enabled = e;
        }
        if let Some(patch) = config {
            let current = full_config(&self.alerting.sealer, &i)?;
            let (public, secret) = current.split();
            let mut whole = IntegrationConfig::join(i.kind, &public, secret.as_deref())
                .as_object()
                .cloned()
                .unwrap_or_default();
            let secret_key = secret_field(i.kind);
            for (k, v) in patch {
                let keeps_secret = Some(k.as_str()) == secret_key
                    && secret
                        .as_deref()
                        .is_some_and(|s| v.as_str() == Some(mask(i.kind, s).as_str()));
                if keeps_secret {
                    continue;
                }
                if v.is_null() {
                    whole.remove(&k);
                } else {
                    whole.insert(k, v);
                }
            }
            let cfg = IntegrationConfig::parse(
                i.kind,
                &Value::Object(whole),
                self.alerting.allow_private_targets,
            )?;
            let (public, secret) = cfg.split();
            i.config_json =
                serde_json::to_vec(&public).map_err(|e| Error::Internal(e.to_string()))?;
            i.sealed_secrets = self.seal(i.id, secret.as_deref())?;
        }
        i.updated_at = self.clock.now_ms();
        self.store.put_integration(&i)?;
        Ok(i)
    }

    /// Deletes an integration and takes it out of every rule, in one write.
    pub(super) fn delete_integration(&self, id: u64) -> Result<()> {
        let i = self.integration(id)?;
        let now = self.clock.now_ms();
        let rules: Vec<AlertRule> = self
            .store
            .project_alert_rules(self.pid())?
            .into_iter()
            .filter(|r| r.integration_ids.contains(&id))
            .map(|mut r| {
                r.integration_ids.retain(|x| *x != id);
                r.updated_at = now;
                r
            })
            .collect();
        self.store.delete_integration(&i, &rules)?;
        Ok(())
    }

    fn alert_rule(&self, id: u64) -> Result<AlertRule> {
        self.store
            .alert_rule(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Alert rule"))
    }

    /// The rule's integrations and groups exist in the project and are within their caps;
    /// `held` integrations (a rule's own before a patch) may stay above today's
    /// `max_integrations_per_rule`, so a rule written under a higher cap can still be
    /// changed, never grown.
    fn check_references(&self, integrations: &[u64], groups: &[u64], held: usize) -> Result<()> {
        let most = self
            .alerting
            .max_integrations_per_rule
            .clamp(1, rules::MAX_RULE_REFS)
            .max(held.min(rules::MAX_RULE_REFS));
        rules::at_most("integration_ids", integrations.len(), most)?;
        rules::at_most("device_group_ids", groups.len(), rules::MAX_RULE_REFS)?;
        for id in integrations {
            if self.store.integration(self.pid(), *id)?.is_none() {
                return Err(Error::unprocessable(
                    "integration_ids",
                    format!("integration {id} does not exist in this project"),
                ));
            }
        }
        for id in groups {
            if self.store.group(self.pid(), *id)?.is_none() {
                return Err(Error::unprocessable(
                    "device_group_ids",
                    format!("device group {id} does not exist in this project"),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn create_alert_rule(&self, d: RuleDraft) -> Result<AlertRule> {
        let name = rules::name("name", &d.name, 200)?;
        // Counted by the project's one writer, so two creations at once cannot both pass.
        let held = self.store.project_alert_rules(self.pid())?.len();
        if held >= self.alerting.max_rules {
            return Err(Error::Unprocessable(format!(
                "a project has at most {} alert rules ([alerts] max_rules_per_project); delete one first",
                self.alerting.max_rules
            )));
        }
        let (integration_ids, device_group_ids) =
            (sorted(d.integration_ids), sorted(d.device_group_ids));
        self.check_references(&integration_ids, &device_group_ids, 0)?;
        let now = self.clock.now_ms();
        let r = AlertRule {
            id: self.store.new_id(Seq::AlertRule)?,
            project_id: self.pid(),
            name,
            condition_json: serde_json::to_vec(&d.condition)
                .map_err(|e| Error::Internal(e.to_string()))?,
            severity: d.severity,
            integration_ids,
            device_group_ids,
            enabled: d.enabled,
            created_at: now,
            updated_at: now,
        };
        self.store.put_alert_rule(&r)?;
        Ok(r)
    }

    pub(super) fn update_alert_rule(&self, id: u64, p: RulePatch) -> Result<AlertRule> {
        let mut r = self.alert_rule(id)?;
        let held = r.integration_ids.len();
        if let Some(n) = p.name {
            r.name = rules::name("name", &n, 200)?;
        }
        if let Some(c) = p.condition {
            r.condition_json =
                serde_json::to_vec(&c).map_err(|e| Error::Internal(e.to_string()))?;
        }
        if let Some(s) = p.severity {
            r.severity = s;
        }
        if let Some(ids) = p.integration_ids {
            r.integration_ids = sorted(ids);
        }
        if let Some(ids) = p.device_group_ids {
            r.device_group_ids = sorted(ids);
        }
        if let Some(e) = p.enabled {
            r.enabled = e;
        }
        self.check_references(&r.integration_ids, &r.device_group_ids, held)?;
        r.updated_at = self.clock.now_ms();
        self.store.put_alert_rule(&r)?;
        Ok(r)
    }

    pub(super) fn delete_alert_rule(&self, id: u64) -> Result<()> {
        let r = self.alert_rule(id)?;
        if let Some((d, _)) = self.plan_naming(|p| p.gate_alert_rule_ids.contains(&id))? {
            return Err(Error::Conflict(format!(
                "Alert rule {} ({}) gates the rollout of deployment {} ({})",
                r.id, r.name, d.id, d.name
            )));
        }
        self.store.delete_alert_rule(&r)?;
        Ok(())
    }

    /// The rule that keeps a group from being deleted, if any.
    pub(super) fn rule_naming_group(&self, group: u64) -> Result<Option<AlertRule>> {
        Ok(self
            .store
            .project_alert_rules(self.pid())?
            .into_iter()
            .find(|r| r.device_group_ids.contains(&group)))
    }
}
