//! Rollout results as conditions, and the reconciliation that finds results missed while the
//! evaluator was down.

use super::*;

impl EvaluatorState {
    pub(super) fn rollout(
        &mut self,
        device: u64,
        status: RolloutStatus,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        for i in 0..self.rules.len() {
            self.rollout_rule(i, device, status, None, now, ch)?;
        }
        Ok(())
    }

    /// One `deployment_status` rule (index `i`; any other rule is left alone) meeting a
    /// device's rollout result: as its event (`missed` is `None`), or as a result found in
    /// storage that its event may have missed, reported at `missed` (`reconcile_rollouts`).
    pub(super) fn rollout_rule(
        &mut self,
        i: usize,
        device: u64,
        status: RolloutStatus,
        missed: Option<i64>,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let Some(Condition::DeploymentStatus { status: want }) =
            self.rules.get(i).map(|r| r.cond.clone())
        else {
            return Ok(());
        };
        if !self.applies(&self.rules[i].rule, device)? {
            return Ok(());
        }
        let hit = matches!(
            (want, status),
            (RolloutOutcome::Succeeded, RolloutStatus::Succeeded)
                | (RolloutOutcome::Failed, RolloutStatus::Failed)
        );
        let made = self.rules[i].rule.created_at;
        let key = (self.rules[i].rule.id, device);
        // A missed result fires only if it is recent and the rule existed when it came, and
        // clears only a firing older than it, as its event would have.
        let fires = missed.is_none_or(|at| at >= made && at >= now - RECONCILE_WINDOW_MS);
        match (hit, self.states.get(&key).cloned()) {
            (true, None) if fires => self.fire(i, device, now, now, ch)?,
            (false, Some(s)) if missed.is_none_or(|at| at > s.since) => {
                self.clear(i, device, &s, now, ch)?
            }
            _ => {}
        }
        Ok(())
    }

    /// Each present device's latest stored rollout result (across the project's packages)
    /// that a reconciliation can act on, when the project has `deployment_status` rules: the
    /// results of the last [`RECONCILE_WINDOW_MS`] (the only ones that may fire), read from
    /// the project's time index, and the latest result of each device a `deployment_status`
    /// rule is firing for (the only ones an older result may clear), read by key in each of
    /// the project's packages. Older results of other devices change nothing, so they are not
    /// read: the cost follows the recent results, and the firing alerts times the project's
    /// packages, not every device and result the project keeps. On the blocking pool.
    pub(super) async fn latest_results(
        &self,
        now: i64,
    ) -> Result<HashMap<u64, (i64, RolloutStatus)>> {
        let rollout_rules: std::collections::HashSet<u64> = self
            .rules
            .iter()
            .filter(|r| matches!(r.cond, Condition::DeploymentStatus { .. }))
            .map(|r| r.rule.id)
            .collect();
        if rollout_rules.is_empty() {
            return Ok(HashMap::new());
        }
        let firing: std::collections::BTreeSet<u64> = self
            .states
            .keys()
            .filter(|(rule, _)| rollout_rules.contains(rule))
            .map(|&(_, device)| device)
            .collect();
        let (store, pid) = (self.ctx.store.clone(), self.pid);
        crate::off_thread(move || {
            // Of two results reported in the same millisecond, the newer package's is the
            // latest (as when every package was read newest first).
            let mut latest: HashMap<u64, (i64, u64, RolloutStatus)> = HashMap::new();
            let mut offer = |device: u64, v: (i64, u64, RolloutStatus)| {
                let e = latest.entry(device).or_insert(v);
                if (v.0, v.1) > (e.0, e.1) {
                    *e = v;
                }
            };
            for r in store.recent_results(pid, now.saturating_sub(RECONCILE_WINDOW_MS))? {
                offer(r.device_id, (r.reported_at, r.deployment_id, r.status));
            }
            if !firing.is_empty() {
                for dep in store.project_deployments(pid)? {
                    for &device in &firing {
                        if let Some(r) = store.device_result(dep.id, device)? {
                            offer(device, (r.reported_at, r.deployment_id, r.status));
                        }
                    }
                }
            }
            let mut present = HashMap::with_capacity(latest.len());
            for (device, (at, _, status)) in latest {
                if store.device(pid, device)?.is_some() {
                    present.insert(device, (at, status));
                }
            }
            Ok(present)
        })
        .await
    }

    /// Brings the `deployment_status` rules in step with the results an evaluator may have
    /// missed (`latest`, from `latest_results`): a result from the last
    /// [`RECONCILE_WINDOW_MS`], after the rule was made, fires a rule it matches; one after
    /// a firing that it does not match clears it. Older results are left alone, so a start
    /// does not wake results long past.
    pub(super) fn reconcile_rollouts(
        &mut self,
        latest: &HashMap<u64, (i64, RolloutStatus)>,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        for i in 0..self.rules.len() {
            for (&device, &(at, status)) in latest {
                self.rollout_rule(i, device, status, Some(at), now, ch)?;
            }
        }
        Ok(())
    }
}
