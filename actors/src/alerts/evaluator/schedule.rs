//! The deadline heap and what it schedules: device status and held metrics, the server's
//! disk space, reloads of rules and devices.

use super::*;

impl EvaluatorState {
    pub(super) fn store(&self) -> &Store {
        &self.ctx.store
    }

    /// Whether `rule` covers `device` (no groups: every device).
    pub(super) fn applies(&self, rule: &AlertRule, device: u64) -> Result<bool> {
        if rule.device_group_ids.is_empty() {
            return Ok(true);
        }
        let groups = self.store().project_groups(self.pid)?;
        Ok(groups.iter().any(|g| {
            rule.device_group_ids.binary_search(&g.id).is_ok()
                && g.device_ids.binary_search(&device).is_ok()
        }))
    }

    pub(super) fn schedule(&mut self, due: Due, at: i64) {
        if self.scheduled.get(&due).is_some_and(|t| *t <= at) {
            return;
        }
        self.scheduled.insert(due, at);
        self.heap.push(Reverse((at, due)));
    }

    pub(super) fn online(&self, device: u64, now: i64) -> Option<bool> {
        self.last_seen
            .get(&device)
            .map(|ls| now < ls + self.ctx.offline_after_ms)
    }

    pub(super) fn heartbeat(
        &mut self,
        device: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        if self.online(device, at) != Some(true) {
            self.online_since.insert(device, at);
        }
        let prev = self.last_seen.get(&device).copied().unwrap_or(i64::MIN);
        self.last_seen.insert(device, at.max(prev));
        self.metrics.insert(device, metrics);
        self.check_device(device, now, ch)
    }

    /// Re-judges every status and metric rule for `device` now, fires or resolves, and
    /// schedules the next moment anything can change.
    pub(super) fn check_device(&mut self, device: u64, now: i64, ch: &mut Changes) -> Result<()> {
        let mut next: Option<i64> = None;
        let mut want = |t: i64| next = Some(next.map_or(t, |n: i64| n.min(t)));
        let online = self.online(device, now);
        if online == Some(true)
            && let Some(ls) = self.last_seen.get(&device)
        {
            // Going offline changes status rules.
            want(ls + self.ctx.offline_after_ms);
        }
        let mut verdicts = Vec::new();
        for (i, l) in self.rules.iter().enumerate() {
            let since = match &l.cond {
                Condition::DeviceStatus { status, .. } => match (status, online) {
                    (DeviceStatus::Offline, Some(false)) => self
                        .last_seen
                        .get(&device)
                        .map(|ls| ls + self.ctx.offline_after_ms),
                    (DeviceStatus::Online, Some(true)) => self.online_since.get(&device).copied(),
                    _ => None,
                },
                Condition::MetricThreshold {
                    metric,
                    operator,
                    threshold,
                    ..
                } => {
                    let holds = self
                        .metrics
                        .get(&device)
                        .and_then(|m| m.get(metric))
                        .is_some_and(|v| operator.holds(*v, *threshold));
                    holds.then(|| {
                        self.states
                            .get(&(l.rule.id, device))
                            .map_or(now, |s| s.since)
                    })
                }
                _ => continue,
            };
            // A rule that no longer covers the device (it left the group) does not hold.
            let since = if self.applies(&l.rule, device)? {
                since
            } else {
                None
            };
            verdicts.push((i, since));
        }
        for (i, since) in verdicts {
            let rule_id = self.rules[i].rule.id;
            let dur = self.rules[i].cond.duration_ms();
            let cur = self.states.get(&(rule_id, device)).cloned();
            match (since, cur) {
                (None, Some(s)) => self.clear(i, device, &s, now, ch)?,
                (None, None) => {}
                (Some(_), Some(s)) if s.alert_id.is_some() => {}
                (Some(since), cur) => {
                    let since = cur.map_or(since, |c| c.since);
                    if now >= since + dur {
                        self.fire(i, device, since, now, ch)?;
                    } else {
                        self.hold(rule_id, device, since, ch);
                        want(since + dur);
                    }
                }
            }
        }
        if let Some(t) = next {
            self.schedule(Due::Device(device), t);
        }
        Ok(())
    }

    /// The reread of storage owed, if any.
    pub(super) fn flush_pending(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        match std::mem::take(&mut self.pending) {
            Pending::Rules => self.reload(now, ch),
            Pending::Devices => self.refresh_devices(now, ch),
            Pending::Nothing => Ok(()),
        }
    }

    /// Loads the enabled rules and builds the log rules' matcher, recording in the shared
    /// health map each rule not evaluated as written.
    pub(super) fn load(&mut self) -> Result<Vec<Loaded>> {
        let (rules, mut health) = load_rules(self.store(), self.pid)?;
        #[cfg(feature = "fault-injection")]
        let fail = self.ctx.fail_log_sets.load(Ordering::Relaxed);
        #[cfg(not(feature = "fault-injection"))]
        let fail = false;
        let (log_rules, matcher, apart) = log_set(&rules, fail);
        (self.log_rules, self.log_set) = (log_rules, matcher);
        health.extend(apart);
        let pid = self.pid;
        self.ctx.rule_health.retain(|(p, _), _| *p != pid);
        for (id, h) in health {
            self.ctx.rule_health.insert((pid, id), h);
        }
        Ok(rules)
    }

    pub(super) fn tick(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        while let Some(Reverse((at, due))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            if self.scheduled.get(&due) != Some(&at) {
                continue; // superseded
            }
            self.scheduled.remove(&due);
            match due {
                Due::Device(d) => self.check_device(d, now, ch)?,
                Due::Window(r, d) => self.window_due(r, d, now, ch)?,
            }
        }
        self.check_server(now, ch)
    }

    /// Judges the server-wide (`disk_space`) rules against the data directory's free space
    /// (read at most every quarter second, shared with the edge's floor): a tick with no such
    /// rule reads nothing.
    pub(super) fn check_server(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let mut free = None;
        for i in 0..self.rules.len() {
            let Condition::DiskSpace { below_bytes, .. } = self.rules[i].cond else {
                continue;
            };
            let free = *free.get_or_insert_with(|| self.ctx.disk.free_bytes());
            let rule_id = self.rules[i].rule.id;
            let cur = self.states.get(&(rule_id, SERVER)).cloned();
            match (free < below_bytes, cur) {
                (false, Some(s)) => self.clear(i, SERVER, &s, now, ch)?,
                (false, None) => {}
                (true, Some(s)) if s.alert_id.is_some() => {}
                (true, cur) => {
                    let since = cur.map_or(now, |c| c.since);
                    if now >= since + self.rules[i].cond.duration_ms() {
                        self.fire(i, SERVER, since, now, ch)?;
                    } else {
                        self.hold(rule_id, SERVER, since, ch);
                    }
                }
            }
        }
        Ok(())
    }

    /// After the rules changed: states of rules that are gone, disabled or changed (condition
    /// or groups) are
    /// cleared (a firing alert of theirs is resolved without notifications: the rule that
    /// would be resolved no longer exists as it was), then everything is judged again.
    pub(super) fn reload(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let fresh = self.load()?;
        // What a rule's states depend on: its condition and its devices.
        let shape = |l: &Loaded| {
            (
                l.rule.condition_json.clone(),
                l.rule.device_group_ids.clone(),
            )
        };
        let kept: HashMap<u64, _> = fresh.iter().map(|l| (l.rule.id, shape(l))).collect();
        let old: HashMap<u64, _> = self.rules.iter().map(|l| (l.rule.id, shape(l))).collect();
        let changed = |r: &u64| !kept.contains_key(r) || kept.get(r) != old.get(r);
        let stale: Vec<(u64, u64)> = self
            .states
            .keys()
            .filter(|(r, _)| changed(r))
            .copied()
            .collect();
        for key in stale {
            // Resolved through the rule as it was, so its integrations hear the resolve.
            if let (Some(s), Some(i)) = (
                self.states.get(&key).cloned(),
                self.rules.iter().position(|l| l.rule.id == key.0),
            ) {
                self.clear(i, key.1, &s, now, ch)?;
            }
        }
        self.windows.retain(|(r, _), _| !changed(r));
        self.rules = fresh;
        self.refresh_devices(now, ch)
    }

    /// Rereads the devices (their last heartbeat and metrics) and reconciles the states: a
    /// state whose device is gone, whose rule no longer covers the device, or whose rule is
    /// gone is cleared (resolving its alert); then everything is judged again.
    pub(super) fn refresh_devices(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let devices = self.store().project_devices(self.pid)?;
        let present: std::collections::HashSet<u64> = devices.iter().map(|d| d.id).collect();
        let before = std::mem::take(&mut self.last_seen);
        self.metrics.clear();
        for d in devices {
            if let Some(ls) = d.last_seen_at {
                self.last_seen.insert(d.id, ls);
                // Online since the stored heartbeat when it went offline between the one this
                // evaluator knew and that one (the stored heartbeat may be the very one whose
                // event comes next, which then finds the device online already).
                let back = before
                    .get(&d.id)
                    .is_some_and(|&prev| ls >= prev + self.ctx.offline_after_ms);
                let since = match self.online_since.get(&d.id) {
                    Some(&s) if !back => s.min(ls),
                    _ => ls,
                };
                self.online_since.insert(d.id, since);
                self.metrics.insert(d.id, Arc::new(d.metrics));
            }
        }
        self.online_since.retain(|d, _| present.contains(d));
        self.windows.retain(|(_, d), _| present.contains(d));
        let keys: Vec<(u64, u64)> = self.states.keys().copied().collect();
        for (r, d) in keys {
            let Some(s) = self.states.get(&(r, d)).cloned() else {
                continue;
            };
            match self.rules.iter().position(|l| l.rule.id == r) {
                // A server-wide rule's state is judged by the tick, not by devices.
                Some(_) if d == SERVER => {}
                Some(i) => {
                    if !present.contains(&d) || !self.applies(&self.rules[i].rule, d)? {
                        self.clear(i, d, &s, now, ch)?;
                    }
                }
                None => {
                    // A rule deleted or disabled while no evaluator ran: nothing to notify
                    // through; the alert is closed.
                    self.states.remove(&(r, d));
                    ch.states.push((r, d, None));
                    if let Some(a) = s.alert_id
                        && let Some(mut alert) = self.store().alert(self.pid, a)?
                        && alert.state == AlertState::Firing
                    {
                        alert.state = AlertState::Resolved;
                        alert.resolved_at = Some(now);
                        ch.alerts.push(alert);
                    }
                }
            }
        }
        self.recheck_everything(now, ch)
    }

    pub(super) fn recheck_everything(&mut self, now: i64, ch: &mut Changes) -> Result<()> {
        let devices: Vec<u64> = self.last_seen.keys().copied().collect();
        for d in devices {
            self.check_device(d, now, ch)?;
        }
        // A firing log alert whose window was lost with a restart resolves once a whole
        // window passes without matches.
        let firing_logs: Vec<(u64, u64, i64)> = self
            .states
            .keys()
            .filter_map(|(r, d)| {
                self.rules
                    .iter()
                    .find(|l| l.rule.id == *r)
                    .and_then(|l| match l.cond {
                        Condition::LogPattern { window_seconds, .. } => {
                            Some((*r, *d, (window_seconds as i64).saturating_mul(1000)))
                        }
                        _ => None,
                    })
            })
            .collect();
        for (r, d, w) in firing_logs {
            if let std::collections::hash_map::Entry::Vacant(e) = self.windows.entry((r, d)) {
                e.insert(VecDeque::from([now]));
                self.schedule(Due::Window(r, d), now + w);
            }
        }
        Ok(())
    }

    pub(super) fn hold(&mut self, rule_id: u64, device: u64, since: i64, ch: &mut Changes) {
        let st = ConditionState {
            rule_id,
            device_id: device,
            since,
            alert_id: None,
        };
        if self.states.get(&(rule_id, device)) != Some(&st) {
            self.states.insert((rule_id, device), st.clone());
            ch.states.push((rule_id, device, Some(st)));
        }
    }
}
