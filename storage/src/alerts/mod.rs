//! Alerting records: integrations and rules (written by the project's actor), alerts and the
//! evaluator's condition states (written by the project's rule evaluator), notifications
//! (created by the evaluator, then updated by the notifier only).

pub mod records;

use crate::lists::{Entry, ListId, Listed, Query};
use crate::{
    Alert, AlertRule, ConditionState, Integration, Notification, Result, Store, Writes, codec, keys,
};

fn alert_list(project: u64) -> ListId {
    ListId::new("al").id(project)
}
fn alert_state_list(project: u64, s: crate::AlertState) -> ListId {
    ListId::new("als").id(project).str(s.as_str())
}
fn alert_rule_list(project: u64, rule: u64) -> ListId {
    ListId::new("alr").id(project).id(rule)
}

impl Listed for Alert {
    fn entries(&self) -> Vec<Entry> {
        let (p, id) = (self.project_id, self.id);
        vec![
            Entry::at(alert_list(p), id, id),
            Entry::at(alert_state_list(p, self.state), id, id),
            Entry::at(alert_rule_list(p, self.rule_id), id, id),
        ]
    }
}

impl Store {
    pub fn integration(&self, project: u64, id: u64) -> Result<Option<Integration>> {
        self.get(&keys::integration(project, id))
    }

    /// A project's integrations, newest first.
    pub fn project_integrations(&self, project: u64) -> Result<Vec<Integration>> {
        self.scan_rev(&keys::integration_prefix(project))
    }

    /// Every integration of every project (sealing them again with a new key).
    pub fn all_integrations(&self) -> Result<Vec<Integration>> {
        self.scan_rev(&keys::all_integrations_prefix())
    }

    /// Writes `items` in one batch.
    pub fn put_integrations(&self, items: &[Integration]) -> Result<()> {
        let mut w = Writes::new();
        for i in items {
            w.put(keys::integration(i.project_id, i.id), i)?;
        }
        self.apply(w)
    }

    pub fn put_integration(&self, i: &Integration) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::integration(i.project_id, i.id), i)?;
        self.apply(w)
    }

    /// Deletes an integration and rewrites the rules that named it, atomically.
    pub fn delete_integration(&self, i: &Integration, rules: &[AlertRule]) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::integration(i.project_id, i.id));
        for r in rules {
            w.put(keys::alert_rule(r.project_id, r.id), r)?;
        }
        self.apply(w)
    }

    pub fn alert_rule(&self, project: u64, id: u64) -> Result<Option<AlertRule>> {
        self.get(&keys::alert_rule(project, id))
    }

    /// A project's rules, newest first.
    pub fn project_alert_rules(&self, project: u64) -> Result<Vec<AlertRule>> {
        self.scan_rev(&keys::alert_rule_prefix(project))
    }

    /// The projects that have alert rules (the evaluators to start with the server).
    pub fn projects_with_alert_rules(&self) -> Result<Vec<u64>> {
        let prefix = keys::alert_rule_all_prefix();
        let mut out: Vec<u64> = Vec::new();
        for kv in self.inner.records.scan_prefix(&prefix) {
            let (k, _) = kv?;
            let pid = k
                .get(prefix.len()..prefix.len() + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes);
            if let Some(pid) = pid
                && out.last() != Some(&pid)
            {
                out.push(pid);
            }
        }
        Ok(out)
    }

    pub fn put_alert_rule(&self, r: &AlertRule) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::alert_rule(r.project_id, r.id), r)?;
        self.apply(w)
    }

    pub fn delete_alert_rule(&self, r: &AlertRule) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::alert_rule(r.project_id, r.id));
        self.apply(w)
    }

    pub fn alert(&self, project: u64, id: u64) -> Result<Option<Alert>> {
        self.get(&keys::alert(project, id))
    }

    /// A page of a project's alerts, newest first, and how many match.
    pub fn alerts_page(
        &self,
        project: u64,
        state: Option<crate::AlertState>,
        rule: Option<u64>,
        device: Option<u64>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<Alert>, u64)> {
        let keep = |a: &Alert| {
            state.is_none_or(|s| a.state == s)
                && rule.is_none_or(|r| a.rule_id == r)
                && device.is_none_or(|d| a.device_id == d)
        };
        let key = |id| keys::alert(project, id);
        let mut candidates = Vec::new();
        if let Some(s) = state {
            candidates.push(alert_state_list(project, s));
        }
        if let Some(r) = rule {
            candidates.push(alert_rule_list(project, r));
        }
        Query {
            unlisted: false,
            candidates,
            all: alert_list(project),
            lo: 0,
            hi: None,
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    /// A project's alerts, newest first.
    pub fn project_alerts(&self, project: u64) -> Result<Vec<Alert>> {
        self.scan_rev(&keys::alert_prefix(project))
    }

    /// Every condition state of a project (the evaluator's start-up).
    pub fn condition_states(&self, project: u64) -> Result<Vec<ConditionState>> {
        self.scan_rev(&keys::condition_prefix(project))
    }

    /// One evaluator step, atomically: condition states set (`Some`) or cleared (`None`),
    /// alerts written, and new notifications recorded as owed; with several servers, only
    /// while the evaluator's lease is still its own (`fence`).
    pub fn apply_evaluation(
        &self,
        project: u64,
        states: &[(u64, u64, Option<ConditionState>)],
        alerts: &[Alert],
        notifications: &[Notification],
        fence: Option<&crate::leases::Fence>,
    ) -> Result<()> {
        let mut w = Writes::new();
        if let Some(f) = fence {
            w.fence(f);
        }
        for (rule, device, st) in states {
            match st {
                Some(st) => w.put(keys::condition(project, *rule, *device), st)?,
                None => w.delete(keys::condition(project, *rule, *device)),
            }
        }
        for a in alerts {
            w.put_listed(keys::alert(a.project_id, a.id), a)?;
            if let (crate::AlertState::Resolved, Some(t)) = (a.state, a.resolved_at) {
                w.0.insert(keys::alert_expiry(t, a.project_id, a.id), Vec::new());
            }
        }
        for n in notifications {
            let k = keys::notification(n.alert_id, n.id);
            w.put(k.clone(), n)?;
            if n.success.is_none() {
                w.0.insert(keys::owed_notification(n.id), k);
            }
        }
        self.apply(w)
    }

    /// Deletes at most `limit` alerts resolved before `before` (ms), with their notifications;
    /// an alert with a notification still owed is left for a later pass (and does not count,
    /// so a run of them does not hold back the rest; a pass reads at most `4 * limit` index
    /// entries). How many went.
    /// Resolved alerts are final (the evaluator rewrites only firing ones), so nothing else
    /// writes what this deletes.
    pub fn prune_alerts(&self, before: i64, limit: usize) -> Result<usize> {
        let prefix = keys::alert_expiry_prefix();
        let end = keys::alert_expiry(before, 0, 0);
        let mut w = Writes::new();
        let mut n = 0;
        let scan = self
            .inner
            .records
            .range(prefix.clone()..end)
            .take(limit.saturating_mul(4));
        for kv in scan {
            if n >= limit {
                break;
            }
            let (k, _) = kv?;
            let field = |i: usize| {
                k.get(prefix.len() + i * 9..prefix.len() + i * 9 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
            };
            let (Some(p), Some(id)) = (field(1), field(2)) else {
                w.delete(k.to_vec());
                continue;
            };
            let notifications = self.alert_notifications(id)?;
            if notifications.iter().any(|x| x.success.is_none()) {
                continue;
            }
            if self.alert(p, id)?.is_some() {
                w.delete_listed::<Alert>(keys::alert(p, id));
            }
            for x in notifications {
                w.delete(keys::notification(x.alert_id, x.id));
            }
            w.delete(k.to_vec());
            n += 1;
        }
        if n > 0 {
            self.apply(w)?;
        }
        Ok(n)
    }

    /// Indexes the resolved alerts of a store written before the expiry index existed (once;
    /// a marker in `meta` says it is kept from then on).
    pub(crate) fn ensure_alert_expiry(&self) -> Result<()> {
        const MARK: &[u8] = b"alert-expiry";
        if self.inner.meta.get(MARK)?.is_some() {
            return Ok(());
        }
        // In batches, so a large store is not indexed in one batch held in memory.
        let mut w = Writes::new();
        let mut pending = 0;
        for kv in self.inner.records.scan_prefix(keys::all_alerts_prefix()) {
            let (_, v) = kv?;
            let Ok(a) = crate::codec::decode::<Alert>(&v) else {
                continue;
            };
            if let (crate::AlertState::Resolved, Some(t)) = (a.state, a.resolved_at) {
                w.0.insert(keys::alert_expiry(t, a.project_id, a.id), Vec::new());
                pending += 1;
                if pending == 10_000 {
                    self.apply(std::mem::replace(&mut w, Writes::new()))?;
                    pending = 0;
                }
            }
        }
        self.apply(w)?;
        self.inner.meta.insert(MARK, b"1".as_slice())?;
        Ok(())
    }

    /// The condition states of one rule (cleared when the rule goes or changes).
    pub fn rule_condition_states(&self, project: u64, rule: u64) -> Result<Vec<ConditionState>> {
        self.scan_rev(&keys::condition_rule_prefix(project, rule))
    }

    /// An alert's notifications, oldest first.
    pub fn alert_notifications(&self, alert: u64) -> Result<Vec<Notification>> {
        let mut v: Vec<Notification> = self.scan_rev(&keys::notification_prefix(alert))?;
        v.reverse();
        Ok(v)
    }

    /// Rewrites a notification after an attempt; once it has an outcome it is no longer owed.
    pub fn put_notification(&self, n: &Notification) -> Result<()> {
        let mut w = Writes::new();
        let k = keys::notification(n.alert_id, n.id);
        w.put(k.clone(), n)?;
        match n.success {
            None => w.0.insert(keys::owed_notification(n.id), k),
            Some(_) => w.delete(keys::owed_notification(n.id)),
        }
        self.apply(w)
    }

    /// Every notification still owed, oldest first (the notifier's start-up).
    pub fn owed_notifications(&self) -> Result<Vec<Notification>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::owed_notification_prefix())
        {
            let (_, k) = kv?;
            if let Some(v) = self.inner.records.get(&k)? {
                out.push(codec::decode(&v)?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Alert, AlertEvent, AlertState, Notification, Severity, Store};

    use crate::testing::on_each_engine;

    /// The project's alert ids, newest first.
    fn ids(store: &Store) -> Vec<u64> {
        store
            .project_alerts(1)
            .unwrap()
            .iter()
            .map(|a| a.id)
            .collect()
    }

    fn alert(id: u64, resolved_at: Option<i64>) -> Alert {
        Alert {
            id,
            project_id: 1,
            rule_id: 1,
            rule_name: "r".into(),
            severity: Severity::Warning,
            state: if resolved_at.is_some() {
                AlertState::Resolved
            } else {
                AlertState::Firing
            },
            device_id: 1,
            summary: "s".into(),
            fired_at: 0,
            resolved_at,
            dedup_key: format!("k{id}"),
            related_deployment: None,
        }
    }

    fn note(id: u64, alert_id: u64, success: Option<bool>) -> Notification {
        Notification {
            id,
            project_id: 1,
            alert_id,
            integration_id: 1,
            event: AlertEvent::Resolved,
            attempts: 1,
            success,
            last_error: None,
            next_attempt_at: 0,
            created_at: 0,
        }
    }

    /// Old resolved alerts go with their notifications; a firing one, a young one and one
    /// still owing a notification stay; the owed one does not hold back the rest of the pass,
    /// and goes once its notification has an outcome.
    fn resolved_alerts_expire_after_their_notifications_are_settled() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let alerts = [
            alert(1, Some(100)),
            alert(2, Some(200)),
            alert(3, None),
            alert(4, Some(10_000)),
            alert(5, Some(300)),
        ];
        let notes = [
            note(1, 1, None),
            note(2, 2, Some(true)),
            note(3, 5, Some(false)),
        ];
        store
            .apply_evaluation(1, &[], &alerts, &notes, None)
            .unwrap();
        assert_eq!(store.prune_alerts(1_000, 1).unwrap(), 1);
        assert_eq!(store.prune_alerts(1_000, 10).unwrap(), 1);
        let left = ids(&store);
        assert_eq!(left, vec![4, 3, 1]);
        assert!(store.alert_notifications(2).unwrap().is_empty());
        assert!(store.alert_notifications(5).unwrap().is_empty());
        store.put_notification(&note(1, 1, Some(true))).unwrap();
        assert_eq!(store.prune_alerts(1_000, 10).unwrap(), 1);
        let left = ids(&store);
        assert_eq!(left, vec![4, 3]);
        assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    }
    on_each_engine!(resolved_alerts_expire_after_their_notifications_are_settled);

    /// A store written before the index existed is indexed once when opened.
    fn an_older_store_is_indexed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = crate::testing::open(dir.path());
            store
                .apply_evaluation(1, &[], &[alert(1, Some(100)), alert(2, None)], &[], None)
                .unwrap();
            // As written before: no index, no marker.
            let mut b = crate::engine::Batch::default();
            for k in store
                .inner
                .records
                .scan_prefix(crate::keys::alert_expiry_prefix())
                .keys()
            {
                b.remove(k.unwrap());
            }
            store.inner.records.apply_batch(b).unwrap();
            store.inner.meta.remove("alert-expiry").unwrap();
            assert_eq!(store.prune_alerts(1_000, 10).unwrap(), 0);
            store.flush_blocking().unwrap();
        }
        let store = Store::reopen(dir.path());
        assert_eq!(store.prune_alerts(1_000, 10).unwrap(), 1);
        let left = ids(&store);
        assert_eq!(left, vec![2]);
    }
    on_each_engine!(an_older_store_is_indexed_on_open);
}
