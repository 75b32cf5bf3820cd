//! [`AlertsHandle`]: the way into the alerting family (integrations, rules, alerts,
//! backtests), and what it starts: the rule evaluators' feed and the missed-rollout watch.

use super::*;

#[derive(Clone)]
pub struct AlertsHandle {
    pub(crate) projects: ProjectsHandle,
    pub(crate) store: Store,
    pub(crate) sealer: Sealer,
    pub(crate) sender: sender::Sender,
    pub(crate) clock: Clock,
    pub(crate) feed: evaluator::AlertFeed,
    /// What backtests may look back over, and when a device counts as offline.
    pub(crate) history_days: u64,
    /// At most one heartbeat per device per this many seconds is kept in the history.
    pub(crate) history_resolution_seconds: u64,
    pub(crate) evaluator_busy: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(crate) offline_after_ms: i64,
    /// Which package each device runs now (an alert shows its provenance).
    pub(crate) assignments: std::sync::Arc<crate::assignments::Assignments>,
}

impl AlertsHandle {
    /// Seconds the rule evaluators spent evaluating since start-up (writes and fsyncs left
    /// out), for `/metrics`.
    pub fn evaluator_busy_seconds(&self) -> f64 {
        self.evaluator_busy
            .load(std::sync::atomic::Ordering::Relaxed) as f64
            / 1e9
    }

    /// Makes the project's rule evaluator panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_evaluator_panic(&self, pid: u64) -> crate::error::Result<()> {
        let a = self.feed.evaluators.actor(pid).await?;
        a.cast(crate::mailbox::Envelope::cast(
            evaluator::EvaluatorMsg::Panic,
        ))
        .map_err(|_| crate::error::Error::Unavailable {
            retry_after_secs: 1,
        })
    }

    /// Makes every combined log pattern set built from now on fail, as one too large to
    /// compile would (tests of the per-rule fallback only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_log_set_failure(&self) {
        self.feed
            .fail_log_sets
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes the project's notifier panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_notifier_panic(&self, pid: u64) -> crate::error::Result<()> {
        let a = self.feed.notifiers.actor(pid).await?;
        a.cast(crate::mailbox::Envelope::cast(notifier::NotifierMsg::Panic))
            .map_err(|_| crate::error::Error::Unavailable {
                retry_after_secs: 1,
            })
    }

    /// The heartbeat history keeps at most one sample per device per this many seconds
    /// (`[alerts] history_resolution_seconds`): what a chart of it can show.
    pub fn history_resolution_seconds(&self) -> u64 {
        self.history_resolution_seconds
    }

    /// Log batches the evaluators did not see, over the byte budget (for `/metrics`).
    pub fn log_batches_dropped(&self) -> u64 {
        self.feed.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts any evaluator of a project with enabled rules, and any notifier of a project
    /// with owed notifications, that is not running (the housekeeper calls this each pass):
    /// both work on their own timers, so one down past its restart budget would otherwise
    /// wait for the next heartbeat or notification to be asked for again.
    pub(crate) async fn revive(&self) -> crate::error::Result<()> {
        let active: Vec<u64> = self.feed.active.iter().map(|e| *e.key()).collect();
        for pid in active {
            if self.store.project_retired(pid) {
                self.feed.stop_project(pid);
                continue;
            }
            let _ = self.feed.evaluators.actor(pid).await;
        }
        for pid in self.owed_projects()? {
            let _ = self.feed.notifiers.actor(pid).await;
        }
        Ok(())
    }

    /// The projects with owed notifications, each once.
    fn owed_projects(&self) -> crate::error::Result<Vec<u64>> {
        let mut owed: Vec<u64> = self
            .store
            .owed_notifications()?
            .iter()
            .map(|n| n.project_id)
            // A deleted organization's notifications are never sent; the purge drops them.
            .filter(|&pid| !self.store.project_retired(pid))
            .collect();
        owed.sort_unstable();
        owed.dedup();
        Ok(owed)
    }

    /// At start-up: the evaluators of every project with enabled rules (so silent devices
    /// still go offline), the notifiers of every project with owed notifications, and the
    /// forwarding of rollout results to the evaluators.
    pub(crate) async fn start(
        &self,
        rollouts: tokio::sync::broadcast::Receiver<crate::events::RolloutEvent>,
    ) -> crate::error::Result<()> {
        for pid in self.store.projects_with_alert_rules()? {
            self.feed.rules_changed_here(&self.store, pid).await;
        }
        if self.feed.bus.is_shared() {
            // Another node's change of a project's rules: this node signals its evaluator too.
            let mut changes = self
                .feed
                .bus
                .subscribe(remote::RULES_SUBJECT)
                .await
                .map_err(|e| crate::error::Error::Internal(e.to_string()))?;
            let (feed, store) = (self.feed.clone(), self.store.clone());
            tokio::spawn(async move {
                while let Some(m) = changes.next().await {
                    if let Some(pid) = m
                        .payload
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_be_bytes)
                    {
                        feed.rules_changed_here(&store, pid).await;
                    }
                }
            });
        }
        for pid in self.owed_projects()? {
            // One notifier that cannot start must not keep the server down; its
            // notifications stay owed in storage.
            if let Err(e) = self.feed.notifiers.actor(pid).await {
                tracing::error!(project = pid, error = %e, "a notifier did not start");
            }
        }
        let feed = self.feed.clone();
        let mut rx = rollouts;
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(e) => {
                        feed.signal(
                            e.project_id,
                            evaluator::EvaluatorMsg::Rollout {
                                device_id: e.device_id,
                                status: e.status,
                            },
                        )
                        .await
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(
                            missed = n,
                            "alert evaluators missed rollout results; reconciling from storage"
                        );
                        let active: Vec<u64> = feed.active.iter().map(|e| *e.key()).collect();
                        for pid in active {
                            feed.signal(pid, evaluator::EvaluatorMsg::RolloutsMissed)
                                .await;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        Ok(())
    }
}
