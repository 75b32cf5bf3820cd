//! `POST /alert-rules/backtest`: when a draft rule would have fired and resolved, per device,
//! over the stored history (heartbeat samples, log lines, rollout results), without sending
//! anything. The replay itself is `rules::backtest`; this gathers each device's history.

use fleetops_storage::Columns;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AlertsHandle;
use crate::clock::{fmt_ms, parse_ms};
use crate::error::{Error, Result};
use crate::rules::alert_conditions::Condition;
use crate::rules::backtest::{Event, replay};

/// Log lines a backtest reads at most; past it the answer says `truncated`.
const MAX_LINES: usize = 5_000_000;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct BacktestRequest {
    #[schemars(with = "crate::rules::alert_conditions::Condition")]
    pub condition: Value,
    #[serde(default, deserialize_with = "crate::rules::whole::vec_u64")]
    #[schemars(schema_with = "crate::rules::schemas::ids::<100>")]
    pub device_group_ids: Vec<u64>,
    /// RFC 3339; default `to` minus `[alerts] history_days`, and never earlier.
    #[serde(default)]
    #[schemars(schema_with = "crate::rules::schemas::opt_time")]
    pub from: Option<String>,
    /// RFC 3339; default now.
    #[serde(default)]
    #[schemars(schema_with = "crate::rules::schemas::opt_time")]
    pub to: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FiringView {
    pub fired_at: String,
    pub resolved_at: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeviceFirings {
    pub device_id: u64,
    pub device_name: String,
    pub firings: Vec<FiringView>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct BacktestView {
    pub from: String,
    pub to: String,
    pub devices_evaluated: usize,
    /// Devices with at least one firing.
    pub devices: Vec<DeviceFirings>,
    pub log_lines_scanned: usize,
    /// The log-line budget ran out: later lines were not read.
    pub truncated: bool,
}

/// The hours a backtest of the last hours may cover: the console's form asks for these and
/// echoes the value used.
pub const LAST_HOURS: std::ops::RangeInclusive<u64> = 1..=720;

/// `hours` brought into [`LAST_HOURS`].
pub fn last_hours(hours: u64) -> u64 {
    hours.clamp(*LAST_HOURS.start(), *LAST_HOURS.end())
}

impl AlertsHandle {
    /// A backtest of the whole project over the last `hours` ([`LAST_HOURS`]) up to now, by
    /// the service's clock (the console's form).
    pub async fn backtest_last_hours(
        &self,
        pid: u64,
        condition: Value,
        hours: u64,
    ) -> Result<BacktestView> {
        let hours = last_hours(hours) as i64;
        let from = fmt_ms(self.clock.now_ms() - hours * 3_600_000);
        self.backtest(
            pid,
            BacktestRequest {
                condition,
                device_group_ids: Vec::new(),
                from: Some(from),
                to: None,
            },
        )
        .await
    }

    /// Scans storage on a blocking thread, so a long backtest never holds a runtime worker.
    pub async fn backtest(&self, pid: u64, req: BacktestRequest) -> Result<BacktestView> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.backtest_now(pid, req))
            .await
            .map_err(|e| Error::Internal(format!("backtest: {e}")))?
    }

    fn backtest_now(&self, pid: u64, req: BacktestRequest) -> Result<BacktestView> {
        let cond = super::rules::condition(&req.condition)?;
        if let Condition::DiskSpace { .. } = cond {
            return Err(Error::unprocessable(
                "condition.type",
                "a disk_space condition cannot be backtested: the server's free space is not \
                 recorded over time",
            ));
        }
        let now = self.clock.now_ms();
        let time = |field: &str, v: &Option<String>| -> Result<Option<i64>> {
            v.as_deref()
                .map(|s| {
                    parse_ms(s).ok_or_else(|| {
                        Error::unprocessable(field, "must be RFC 3339 with Z or an offset")
                    })
                })
                .transpose()
        };
        let to = time("to", &req.to)?.unwrap_or(now).min(now);
        let earliest = now - (self.history_days as i64).saturating_mul(86_400_000);
        let from = time("from", &req.from)?
            .unwrap_or(to - (self.history_days as i64).saturating_mul(86_400_000))
            .max(earliest);
        if from >= to {
            return Err(Error::unprocessable("from", "must be before to"));
        }
        crate::rules::at_most(
            "device_group_ids",
            req.device_group_ids.len(),
            crate::rules::MAX_RULE_REFS,
        )?;
        let groups = self.store.project_groups(pid)?;
        for g in &req.device_group_ids {
            if !groups.iter().any(|x| x.id == *g) {
                return Err(Error::unprocessable(
                    "device_group_ids",
                    format!("device group {g} does not exist in this project"),
                ));
            }
        }
        let covered = |device: u64| {
            req.device_group_ids.is_empty()
                || groups
                    .iter()
                    .any(|g| req.device_group_ids.contains(&g.id) && g.device_ids.contains(&device))
        };
        let (regex, level, module) = match &cond {
            Condition::LogPattern {
                pattern,
                level,
                module,
                ..
            } => (
                Some(crate::rules::alert_conditions::compile(pattern)?),
                level.as_deref().and_then(crate::logs::parse_level),
                module.clone(),
            ),
            _ => (None, None, None),
        };
        // Sessions and rollout results grouped by device once, not searched per device.
        let mut sessions: HashMap<u64, Vec<fleetops_storage::Session>> = HashMap::new();
        if let Condition::LogPattern { .. } = cond {
            for s in self.store.project_sessions(pid)? {
                if s.started_at <= to && s.ended_at.is_none_or(|e| e >= from) {
                    sessions.entry(s.device_id).or_default().push(s);
                }
            }
        }
        let mut rollouts: HashMap<u64, Vec<(i64, fleetops_storage::RolloutStatus)>> =
            HashMap::new();
        if let Condition::DeploymentStatus { .. } = cond {
            for dep in self.store.project_deployments(pid)? {
                for r in self.store.device_results(dep.id)? {
                    if r.reported_at >= from && r.reported_at <= to {
                        rollouts
                            .entry(r.device_id)
                            .or_default()
                            .push((r.reported_at, r.status));
                    }
                }
            }
        }
        let mut lines = 0usize;
        let mut truncated = false;
        let mut out = Vec::new();
        let mut evaluated = 0;
        for d in self.store.project_devices(pid)? {
            if !covered(d.id) {
                continue;
            }
            evaluated += 1;
            let history = match cond {
                Condition::DeviceStatus { .. } | Condition::MetricThreshold { .. } => {
                    // Heartbeats just before the window tell the state it opened in.
                    self.store
                        .metric_history(pid, d.id, from - self.offline_after_ms, to)?
                }
                _ => Vec::new(),
            };
            let mut events: Vec<Event> = history
                .iter()
                .map(|(at, metrics)| Event::Heartbeat { at: *at, metrics })
                .collect();
            if let Some(re) = &regex {
                // Chunks are read in place (no column copied), so one the time range, its
                // levels or its modules rule out costs a header, not its lines; the lines of
                // the others count against the budget.
                for s in sessions.get(&d.id).into_iter().flatten() {
                    if truncated {
                        break;
                    }
                    let _pin = self.store.log_pin(s.id);
                    self.store.visit_log_chunks_while(s.id, |c| {
                        if c.max_ts < from || c.min_ts > to {
                            return true;
                        }
                        if level.is_some_and(|l| c.level_mask & (1 << l) == 0) {
                            return true;
                        }
                        let wanted_module = match &module {
                            Some(m) => match c.module_index(m) {
                                Some(i) => Some(i),
                                None => return true,
                            },
                            None => None,
                        };
                        for i in 0..c.len() {
                            lines += 1;
                            let at = c.ts_at(i).unwrap_or(0);
                            if at < from || at > to {
                                continue;
                            }
                            if level.is_some_and(|l| c.level_at(i) != Some(l)) {
                                continue;
                            }
                            if wanted_module.is_some() && c.module_at(i) != wanted_module {
                                continue;
                            }
                            if c.message(i).is_some_and(|t| re.is_match(t)) {
                                events.push(Event::Match { at });
                            }
                        }
                        truncated = lines >= MAX_LINES;
                        !truncated
                    })?;
                }
            }
            for (at, status) in rollouts.get(&d.id).into_iter().flatten() {
                events.push(Event::Rollout {
                    at: *at,
                    status: *status,
                });
            }
            events.sort_by_key(Event::at);
            let firings = replay(&cond, self.offline_after_ms, &events, from, to);
            if !firings.is_empty() {
                out.push(DeviceFirings {
                    device_id: d.id,
                    device_name: d.name.clone(),
                    firings: firings
                        .into_iter()
                        .map(|f| FiringView {
                            fired_at: fmt_ms(f.fired_at),
                            resolved_at: f.resolved_at.map(fmt_ms),
                        })
                        .collect(),
                });
            }
            if truncated {
                break;
            }
        }
        Ok(BacktestView {
            from: fmt_ms(from),
            to: fmt_ms(to),
            devices_evaluated: evaluated,
            devices: out,
            log_lines_scanned: lines,
            truncated,
        })
    }
}
