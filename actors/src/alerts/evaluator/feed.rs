//! [`AlertFeed`]: how the handles and the pipeline reach a project's evaluator (heartbeats,
//! log batches under a byte budget, rollout results, rule changes), on this node and the others.

use super::*;

/// How the handles reach the evaluators: only projects with enabled rules get signals, so a
/// project without rules never starts one. Log batches are bounded in bytes: past
/// `[alerts] max_log_bytes_in_flight` a batch is not seen by the rules (counted on `/metrics`)
/// rather than queued without end.
#[derive(Clone)]
pub(crate) struct AlertFeed {
    pub evaluators: Keyed<RuleEvaluator>,
    pub notifiers: Keyed<crate::alerts::notifier::Notifier>,
    pub active: Arc<DashMap<u64, ()>>,
    pub log_bytes: Arc<AtomicUsize>,
    pub max_log_bytes: usize,
    pub dropped: Arc<AtomicU64>,
    /// What the evaluators record of rules not evaluated as written.
    pub rule_health: RuleHealthMap,
    /// Several nodes: every signal also goes to the other nodes, whose evaluator of the
    /// project may be the one judging it (`alerts::remote`).
    pub bus: crate::bus::Bus,
    /// See [`EvaluatorCtx::fail_log_sets`].
    #[cfg(feature = "fault-injection")]
    pub fail_log_sets: Arc<std::sync::atomic::AtomicBool>,
}

impl crate::signals::AlertSignals for AlertFeed {
    fn devices_changed(&self, pid: u64) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.signal(pid, EvaluatorMsg::DevicesChanged))
    }

    fn heartbeat(
        &self,
        pid: u64,
        device_id: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
    ) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(self.signal(
            pid,
            EvaluatorMsg::Heartbeat {
                device_id,
                at,
                metrics,
            },
        ))
    }

    fn logs(
        &self,
        pid: u64,
        device_id: u64,
        chunk: Arc<LogChunk>,
    ) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(AlertFeed::logs(self, pid, device_id, chunk))
    }
}

impl AlertFeed {
    /// A log batch for the project's rules, if the budget has room for it.
    pub(crate) async fn logs(&self, pid: u64, device_id: u64, chunk: Arc<LogChunk>) {
        if !self.active.contains_key(&pid) {
            return;
        }
        let bytes = chunk.text.len() + chunk.len() * 16 + 64;
        let before = self.log_bytes.fetch_add(bytes, Ordering::Relaxed);
        let budget = Budget {
            bytes,
            used: self.log_bytes.clone(),
        };
        if before + bytes > self.max_log_bytes {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.signal(
            pid,
            EvaluatorMsg::Logs {
                device_id,
                chunk,
                _budget: budget,
            },
        )
        .await;
    }

    /// Sends a signal to the project's evaluator (started if needed); never fails the caller.
    pub(crate) async fn signal(&self, pid: u64, msg: EvaluatorMsg) {
        if !self.active.contains_key(&pid) {
            return;
        }
        if self.bus.is_shared() {
            let remote = match &msg {
                EvaluatorMsg::Heartbeat {
                    device_id,
                    at,
                    metrics,
                } => Some(crate::alerts::remote::Signal::Heartbeat {
                    device_id: *device_id,
                    at: *at,
                    metrics: metrics.clone(),
                }),
                EvaluatorMsg::Logs {
                    device_id, chunk, ..
                } => Some(crate::alerts::remote::Signal::Logs {
                    device_id: *device_id,
                    chunk: chunk.clone(),
                }),
                EvaluatorMsg::Rollout { device_id, status } => {
                    Some(crate::alerts::remote::Signal::Rollout {
                        device_id: *device_id,
                        status: *status,
                    })
                }
                EvaluatorMsg::DevicesChanged => Some(crate::alerts::remote::Signal::DevicesChanged),
                _ => None,
            };
            match remote.as_ref().and_then(crate::alerts::remote::encode) {
                // Larger than a bus message may be: the other nodes' evaluators do not see it,
                // as when the byte budget is full.
                Some(m) if m.len() > crate::alerts::remote::MAX_MESSAGE => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                Some(m) => self.bus.publish(crate::alerts::remote::subject(pid), &m),
                None => {}
            }
        }
        match self.evaluators.actor(pid).await {
            Ok(a) => {
                let _ = a.cast(Envelope::cast(msg));
            }
            // Once per signal while it is down (heartbeats come often): debug, not warn; the
            // supervisor logs the failure itself.
            Err(e) => tracing::debug!(project = pid, error = %e, "alert evaluator unavailable"),
        }
    }

    /// Stops the project's evaluator and notifier and takes it off the active list: its
    /// organization is being deleted, and nothing may write into it while it is purged.
    pub(crate) fn stop_project(&self, pid: u64) {
        self.active.remove(&pid);
        self.rule_health.retain(|(p, _), _| *p != pid);
        if let Some(a) = self.evaluators.running(pid) {
            a.stop(None);
        }
        if let Some(a) = self.notifiers.running(pid) {
            a.stop(None);
        }
    }

    /// As [`AlertFeed::rules_changed_here`], and tells the other nodes (several nodes).
    pub(crate) async fn rules_changed(&self, store: &Store, pid: u64) {
        if self.bus.is_shared() {
            self.bus.publish(
                crate::alerts::remote::RULES_SUBJECT.into(),
                &pid.to_be_bytes(),
            );
        }
        self.rules_changed_here(store, pid).await;
    }

    /// Marks the project as having enabled rules (or not), from storage, and tells its
    /// evaluator to reload.
    pub(crate) async fn rules_changed_here(&self, store: &Store, pid: u64) {
        if store.project_retired(pid) {
            self.stop_project(pid);
            return;
        }
        let any = store
            .project_alert_rules(pid)
            .map(|r| r.iter().any(|r| r.enabled))
            .unwrap_or(true);
        let was = self.active.contains_key(&pid);
        if any {
            self.active.insert(pid, ());
        }
        if (any || was)
            && let Ok(a) = self.evaluators.actor(pid).await
        {
            let _ = a.cast(Envelope::cast(EvaluatorMsg::RulesChanged));
        }
        if !any {
            self.active.remove(&pid);
        }
    }
}
