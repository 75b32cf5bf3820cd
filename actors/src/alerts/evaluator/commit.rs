//! Firing and clearing alerts: their summaries, the owed notifications, the related
//! deployment, and the one batch that writes them before the notifier is told.

use super::*;

impl EvaluatorState {
    pub(super) fn summary(&self, l: &Loaded, device_name: &str) -> String {
        match &l.cond {
            Condition::DeviceStatus {
                status,
                duration_seconds,
            } => format!(
                "{device_name} has been {} for {duration_seconds} s",
                match status {
                    DeviceStatus::Online => "online",
                    DeviceStatus::Offline => "offline",
                }
            ),
            Condition::MetricThreshold {
                metric,
                operator,
                threshold,
                duration_seconds,
            } => format!(
                "{metric} {} {threshold} on {device_name} for {duration_seconds} s",
                operator.symbol()
            ),
            Condition::LogPattern {
                pattern,
                count,
                window_seconds,
                ..
            } => format!(
                "{count} log line(s) matching /{pattern}/ within {window_seconds} s on {device_name}"
            ),
            Condition::DeploymentStatus { status } => format!(
                "a deployment {} on {device_name}",
                match status {
                    RolloutOutcome::Succeeded => "succeeded",
                    RolloutOutcome::Failed => "failed",
                }
            ),
            Condition::DiskSpace {
                below_bytes,
                duration_seconds,
            } => format!(
                "the server's data directory has {} bytes free, below {below_bytes}, for \
                 {duration_seconds} s",
                self.ctx.disk.free_bytes()
            ),
        }
    }

    pub(super) fn notify(
        &self,
        l: &Loaded,
        alert: &Alert,
        event: AlertEvent,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let n = l.rule.integration_ids.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let first = self.store().new_ids(Seq::Notification, n)?;
        for (k, integration_id) in l.rule.integration_ids.iter().enumerate() {
            ch.notifications.push(Notification {
                id: first + k as u64,
                project_id: self.pid,
                alert_id: alert.id,
                integration_id: *integration_id,
                event,
                attempts: 0,
                success: None,
                last_error: None,
                next_attempt_at: now,
                created_at: now,
            });
        }
        Ok(())
    }

    /// The deployment package most recently activated for `device` within the correlation
    /// window before `now`, if any.
    pub(super) fn related(
        &self,
        device: &fleetops_storage::Device,
        now: i64,
    ) -> Result<Option<RelatedDeployment>> {
        let mut best: Option<RelatedDeployment> = None;
        for d in self.store().project_deployments(self.pid)? {
            let Some(at) = d.deployed_at else { continue };
            if at > now || now - at > self.ctx.correlation_window_ms {
                continue;
            }
            if best.as_ref().is_some_and(|b| b.activated_at >= at) {
                continue;
            }
            if crate::rules::deployments::targets_device(self.store(), &d, device)? {
                best = Some(RelatedDeployment {
                    id: d.id,
                    name: d.name.clone(),
                    activated_at: at,
                });
            }
        }
        Ok(best)
    }

    pub(super) fn fire(
        &mut self,
        i: usize,
        device: u64,
        since: i64,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let stored = match device {
            SERVER => None,
            _ => self.store().device(self.pid, device)?,
        };
        let related = match &stored {
            Some(d) => self.related(d, now)?,
            None => None,
        };
        let l = &self.rules[i];
        let name = stored.map_or_else(|| format!("device {device}"), |d| d.name);
        let id = self.store().new_id(Seq::Alert)?;
        let alert = Alert {
            id,
            project_id: self.pid,
            rule_id: l.rule.id,
            rule_name: l.rule.name.clone(),
            severity: l.rule.severity,
            state: AlertState::Firing,
            device_id: device,
            summary: self.summary(l, &name),
            fired_at: now,
            resolved_at: None,
            dedup_key: format!("fleetops-{}-{id}", self.slug),
            related_deployment: related,
        };
        self.notify(l, &alert, AlertEvent::Firing, now, ch)?;
        let st = ConditionState {
            rule_id: l.rule.id,
            device_id: device,
            since,
            alert_id: Some(id),
        };
        ch.states.push((st.rule_id, device, Some(st.clone())));
        self.states.insert((st.rule_id, device), st);
        ch.alerts.push(alert);
        Ok(())
    }

    pub(super) fn clear(
        &mut self,
        i: usize,
        device: u64,
        s: &ConditionState,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let rule_id = self.rules[i].rule.id;
        self.states.remove(&(rule_id, device));
        ch.states.push((rule_id, device, None));
        if let Some(a) = s.alert_id
            && let Some(mut alert) = self.store().alert(self.pid, a)?
            && alert.state == AlertState::Firing
        {
            alert.state = AlertState::Resolved;
            alert.resolved_at = Some(now);
            self.notify(&self.rules[i], &alert, AlertEvent::Resolved, now, ch)?;
            ch.alerts.push(alert);
        }
        Ok(())
    }

    /// Writes a step's changes in one batch, waits until they are on disk, then hands the
    /// owed notifications to the project's notifier.
    pub(super) async fn commit(&mut self, ch: Changes) -> Result<()> {
        if ch.states.is_empty() && ch.alerts.is_empty() && ch.notifications.is_empty() {
            return Ok(());
        }
        self.ctx.store.apply_evaluation(
            self.pid,
            &ch.states,
            &ch.alerts,
            &ch.notifications,
            self.lease.as_ref().map(|(f, _)| f),
        )?;
        self.ctx.store.durable().await?;
        if !ch.notifications.is_empty() {
            match self.ctx.notifiers.actor(self.pid).await {
                Ok(a) => {
                    let _ = a.cast(Envelope::cast(NotifierMsg::Owed(ch.notifications)));
                }
                // Stored as owed: the notifier takes them when it starts.
                Err(e) => tracing::warn!(project = self.pid, error = %e, "notifier unavailable"),
            }
        }
        Ok(())
    }
}
