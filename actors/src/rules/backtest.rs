//! Backtests: when a condition would have fired and resolved for one device, replayed over
//! its stored history with the same semantics as the live evaluator (durations from the change
//! of state, log counts in a sliding window, rollout results). Pure: the caller gathers the
//! history.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::rules::alert_conditions::{Condition, DeviceStatus, RolloutOutcome};
use fleetops_storage::RolloutStatus;

/// One thing that happened to the device, in time order.
pub enum Event<'a> {
    Heartbeat {
        at: i64,
        metrics: &'a BTreeMap<String, f64>,
    },
    /// A log line that matched the rule's pattern, level and module.
    Match {
        at: i64,
    },
    Rollout {
        at: i64,
        status: RolloutStatus,
    },
}

impl Event<'_> {
    pub fn at(&self) -> i64 {
        match self {
            Event::Heartbeat { at, .. } | Event::Match { at } | Event::Rollout { at, .. } => *at,
        }
    }
}

/// When the rule would have fired, and resolved (`None`: still firing at `to`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Firing {
    pub fired_at: i64,
    pub resolved_at: Option<i64>,
}

/// Replays `events` (sorted by time) between `from` and `to`.
pub fn replay(
    cond: &Condition,
    offline_after_ms: i64,
    events: &[Event<'_>],
    from: i64,
    to: i64,
) -> Vec<Firing> {
    let mut out: Vec<Firing> = Vec::new();
    let mut firing = false;
    let fire = |out: &mut Vec<Firing>, firing: &mut bool, at: i64| {
        if !*firing && at >= from && at <= to {
            out.push(Firing {
                fired_at: at,
                resolved_at: None,
            });
            *firing = true;
        }
    };
    let resolve = |out: &mut Vec<Firing>, firing: &mut bool, at: i64| {
        if *firing {
            if let Some(f) = out.last_mut() {
                f.resolved_at = Some(at.min(to));
            }
            *firing = false;
        }
    };
    match cond {
        Condition::DeviceStatus {
            status,
            duration_seconds,
        } => {
            let d = (*duration_seconds as i64).saturating_mul(1000);
            let beats: Vec<i64> = events
                .iter()
                .filter_map(|e| match e {
                    Event::Heartbeat { at, .. } => Some(*at),
                    _ => None,
                })
                .collect();
            // Online spans: from a heartbeat after a gap until `offline_after` past the last
            // heartbeat of the run.
            let mut spans: Vec<(i64, i64)> = Vec::new();
            for b in beats {
                match spans.last_mut() {
                    Some((_, end)) if b <= *end => *end = b + offline_after_ms,
                    _ => spans.push((b, b + offline_after_ms)),
                }
            }
            match status {
                DeviceStatus::Online => {
                    for (start, end) in spans {
                        if end - start >= d {
                            fire(&mut out, &mut firing, start + d);
                            if end <= to {
                                resolve(&mut out, &mut firing, end);
                            }
                        }
                    }
                }
                DeviceStatus::Offline => {
                    for (i, (_, end)) in spans.iter().enumerate() {
                        let next = spans.get(i + 1).map(|s| s.0);
                        let gap_end = next.unwrap_or(i64::MAX);
                        if gap_end - end >= d && end + d <= to {
                            fire(&mut out, &mut firing, end + d);
                            if let Some(n) = next {
                                resolve(&mut out, &mut firing, n);
                            }
                        }
                    }
                }
            }
        }
        Condition::MetricThreshold {
            metric,
            operator,
            threshold,
            duration_seconds,
        } => {
            let d = (*duration_seconds as i64).saturating_mul(1000);
            let mut since: Option<i64> = None;
            for e in events {
                let Event::Heartbeat { at, metrics } = e else {
                    continue;
                };
                // A pending duration that elapsed before this heartbeat fired then.
                if let Some(s) = since
                    && !firing
                    && s + d <= *at
                {
                    fire(&mut out, &mut firing, s + d);
                }
                let holds = metrics
                    .get(metric)
                    .is_some_and(|v| operator.holds(*v, *threshold));
                if holds {
                    since.get_or_insert(*at);
                    if let Some(s) = since
                        && s + d <= *at
                    {
                        fire(&mut out, &mut firing, (s + d).max(*at));
                    }
                } else {
                    since = None;
                    resolve(&mut out, &mut firing, *at);
                }
            }
            if let Some(s) = since
                && s + d <= to
            {
                fire(&mut out, &mut firing, s + d);
            }
        }
        Condition::LogPattern {
            count,
            window_seconds,
            ..
        } => {
            let (count, window) = (
                *count as usize,
                (*window_seconds as i64).saturating_mul(1000),
            );
            let mut w: VecDeque<i64> = VecDeque::new();
            for e in events {
                let Event::Match { at } = e else { continue };
                if firing
                    && let Some(front) = w.front()
                    && front + window <= *at
                {
                    resolve(&mut out, &mut firing, front + window);
                }
                w.push_back(*at);
                while w.len() > count {
                    w.pop_front();
                }
                if w.len() >= count && w.front().is_some_and(|f| *f > at - window) {
                    fire(&mut out, &mut firing, *at);
                }
            }
            if firing && let Some(front) = w.front() {
                let end = front + window;
                if end <= to {
                    resolve(&mut out, &mut firing, end);
                }
            }
        }
        Condition::DeploymentStatus { status } => {
            for e in events {
                let Event::Rollout { at, status: got } = e else {
                    continue;
                };
                let hit = matches!(
                    (status, got),
                    (RolloutOutcome::Succeeded, RolloutStatus::Succeeded)
                        | (RolloutOutcome::Failed, RolloutStatus::Failed)
                );
                if hit {
                    fire(&mut out, &mut firing, *at);
                } else {
                    resolve(&mut out, &mut firing, *at);
                }
            }
        }
        // Not a device's condition, and its history is not recorded: never replayed (a
        // backtest of one is refused before it gets here).
        Condition::DiskSpace { .. } => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::alert_conditions::Operator;

    fn beats(at: &[i64], m: &BTreeMap<String, f64>) -> Vec<(i64, BTreeMap<String, f64>)> {
        at.iter().map(|a| (*a, m.clone())).collect()
    }

    #[test]
    fn offline_fires_after_the_gap_and_resolves_on_return() {
        let m = BTreeMap::new();
        let b = beats(&[0, 10_000, 20_000, 200_000], &m);
        let ev: Vec<Event> = b
            .iter()
            .map(|(at, m)| Event::Heartbeat {
                at: *at,
                metrics: m,
            })
            .collect();
        let c = Condition::DeviceStatus {
            status: DeviceStatus::Offline,
            duration_seconds: 30,
        };
        // Offline at 20 s + 60 s = 80 s; fired 30 s later; back at 200 s.
        assert_eq!(
            replay(&c, 60_000, &ev, 0, 280_000),
            vec![Firing {
                fired_at: 110_000,
                resolved_at: Some(200_000)
            }]
        );
        // After the last heartbeat: still firing at the end of the window.
        let tail = replay(&c, 60_000, &ev, 0, 400_000);
        assert_eq!(tail.len(), 2);
        assert_eq!(
            tail[1],
            Firing {
                fired_at: 290_000,
                resolved_at: None
            }
        );
    }

    #[test]
    fn metrics_must_hold_for_the_duration() {
        let hot: BTreeMap<String, f64> = [("t".to_string(), 90.0)].into();
        let cool: BTreeMap<String, f64> = [("t".to_string(), 10.0)].into();
        let ev = vec![
            Event::Heartbeat {
                at: 0,
                metrics: &hot,
            },
            Event::Heartbeat {
                at: 5_000,
                metrics: &cool,
            },
            Event::Heartbeat {
                at: 10_000,
                metrics: &hot,
            },
            Event::Heartbeat {
                at: 20_000,
                metrics: &hot,
            },
            Event::Heartbeat {
                at: 40_000,
                metrics: &cool,
            },
        ];
        let c = Condition::MetricThreshold {
            metric: "t".into(),
            operator: Operator::Gt,
            threshold: 80.0,
            duration_seconds: 15,
        };
        assert_eq!(
            replay(&c, 60_000, &ev, 0, 100_000),
            vec![Firing {
                fired_at: 25_000,
                resolved_at: Some(40_000)
            }]
        );
    }

    #[test]
    fn log_counts_slide() {
        let ev: Vec<Event> = [0, 1_000, 50_000, 51_000, 52_000]
            .iter()
            .map(|at| Event::Match { at: *at })
            .collect();
        let c = Condition::LogPattern {
            pattern: "x".into(),
            level: None,
            module: None,
            count: 2,
            window_seconds: 10,
        };
        assert_eq!(
            replay(&c, 0, &ev, 0, 100_000),
            vec![
                Firing {
                    fired_at: 1_000,
                    resolved_at: Some(10_000)
                },
                Firing {
                    fired_at: 51_000,
                    resolved_at: Some(61_000)
                },
            ]
        );
    }
}
