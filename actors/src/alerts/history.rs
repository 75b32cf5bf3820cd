//! The alert history: firing and resolved alerts, newest first, each with how its
//! notifications went (per integration, the latest notification's outcome).

use serde::Serialize;

use super::AlertsHandle;
use crate::clock::fmt_ms;
use crate::error::{Error, Result};
use crate::views::{Page, PageReq};
use fleetops_storage::{Alert, AlertEvent, AlertState, Severity};

#[derive(Debug, Default, Clone, Copy)]
pub struct AlertFilter {
    pub state: Option<AlertState>,
    pub rule_id: Option<u64>,
    /// One device's alerts (the console's device page).
    pub device_id: Option<u64>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RelatedDeploymentView {
    pub id: u64,
    pub name: String,
    pub activated_at: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct NotificationView {
    pub integration_id: u64,
    /// `false` while still owed (see `pending`) and after the last attempt failed.
    pub success: bool,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Still being delivered (attempts left).
    pub pending: bool,
    /// Which message this is: `firing` or `resolved`.
    pub event: AlertEvent,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AlertView {
    pub id: u64,
    pub rule_id: u64,
    pub rule_name: String,
    pub severity: Severity,
    pub state: AlertState,
    /// `null` for a server-wide alert (a `disk_space` rule's).
    pub device_id: Option<u64>,
    pub summary: String,
    pub fired_at: String,
    pub resolved_at: Option<String>,
    pub related_deployment: Option<RelatedDeploymentView>,
    pub notifications: Vec<NotificationView>,
    /// What the device should run now: package → capsule → commit → test runs (`None` when
    /// no package is assigned to it or the device was deleted).
    pub provenance: Option<crate::provenance::Provenance>,
}

impl AlertsHandle {
    fn alert_view(&self, a: &Alert) -> Result<AlertView> {
        let mut latest: Vec<NotificationView> = Vec::new();
        for n in self.store.alert_notifications(a.id)? {
            let v = NotificationView {
                integration_id: n.integration_id,
                success: n.success == Some(true),
                attempts: n.attempts,
                last_error: n.last_error.clone(),
                pending: n.success.is_none(),
                event: n.event,
            };
            // Oldest first: a later notification (the resolve) replaces the earlier one.
            match latest
                .iter_mut()
                .find(|x| x.integration_id == n.integration_id)
            {
                Some(x) => *x = v,
                None => latest.push(v),
            }
        }
        Ok(AlertView {
            id: a.id,
            rule_id: a.rule_id,
            rule_name: a.rule_name.clone(),
            severity: a.severity,
            state: a.state,
            device_id: crate::rules::alert_conditions::alert_device(a.device_id),
            summary: a.summary.clone(),
            fired_at: fmt_ms(a.fired_at),
            resolved_at: a.resolved_at.map(fmt_ms),
            related_deployment: a
                .related_deployment
                .as_ref()
                .map(|d| RelatedDeploymentView {
                    id: d.id,
                    name: d.name.clone(),
                    activated_at: fmt_ms(d.activated_at),
                }),
            notifications: latest,
            provenance: match crate::rules::alert_conditions::alert_device(a.device_id) {
                Some(d) => self.provenance_of(a.project_id, d)?,
                None => None,
            },
        })
    }

    fn provenance_of(
        &self,
        pid: u64,
        device: u64,
    ) -> Result<Option<crate::provenance::Provenance>> {
        // The device update API's cached answer: one map read while nothing changed.
        let package = match self.assignments.package_of(&self.store, pid, device) {
            Ok(p) => p,
            Err(crate::error::Error::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match package
            .map(|p| self.store.deployment(pid, p))
            .transpose()?
            .flatten()
        {
            Some(p) => crate::provenance::of_package(&self.store, &p).map(Some),
            None => Ok(None),
        }
    }

    pub async fn alerts(
        &self,
        pid: u64,
        f: &AlertFilter,
        page: PageReq,
    ) -> Result<Page<AlertView>> {
        let me = self.clone();
        let f = *f;
        crate::off_thread(move || me.alerts_now(pid, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn alerts_now(&self, pid: u64, f: &AlertFilter, page: PageReq) -> Result<Page<AlertView>> {
        let (alerts, total) = self.store.alerts_page(
            pid,
            f.state,
            f.rule_id,
            f.device_id,
            page.skip(),
            page.page_size,
        )?;
        let items = alerts
            .iter()
            .map(|a| self.alert_view(a))
            .collect::<Result<Vec<_>>>()?;
        Ok(page.of(items, total))
    }

    pub fn alert(&self, pid: u64, id: u64) -> Result<AlertView> {
        let a = self
            .store
            .alert(pid, id)?
            .ok_or_else(|| Error::not_found("Alert"))?;
        self.alert_view(&a)
    }
}
