//! Restart budgets shared by the supervisors: how many restarts an actor gets within a window,
//! and how long to wait before the next one.

use std::time::{Duration, Instant};

use crate::config::SupervisionConfig;

/// Restart history of one supervised child.
#[derive(Debug, Default)]
pub(crate) struct RestartBudget {
    /// Restart times within the current window, oldest first.
    recent: Vec<Instant>,
}

/// What a supervisor should do after a child failed.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Restart after this delay (zero: at once).
    Restart(Duration),
    /// Budget spent: leave it down until this instant.
    GiveUpUntil(Instant),
}

impl RestartBudget {
    pub(crate) fn on_failure(&mut self, cfg: &SupervisionConfig, now: Instant) -> Verdict {
        let window = Duration::from_secs(cfg.restart_window_seconds);
        self.recent.retain(|t| now.duration_since(*t) < window);
        if self.recent.len() as u32 >= cfg.max_restarts {
            let until = self.recent.first().map_or(now, |t| *t + window);
            return Verdict::GiveUpUntil(until);
        }
        let n = self.recent.len() as u32;
        self.recent.push(now);
        if n == 0 {
            return Verdict::Restart(Duration::ZERO);
        }
        let ms = cfg
            .restart_backoff_ms
            .saturating_mul(1u64 << (n - 1).min(20))
            .min(cfg.max_restart_backoff_ms);
        Verdict::Restart(Duration::from_millis(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_restart_immediate_then_backoff_then_give_up() {
        let cfg = SupervisionConfig {
            max_restarts: 3,
            restart_window_seconds: 60,
            restart_backoff_ms: 100,
            max_restart_backoff_ms: 150,
            ..Default::default()
        };
        let mut b = RestartBudget::default();
        let t = Instant::now();
        assert_eq!(b.on_failure(&cfg, t), Verdict::Restart(Duration::ZERO));
        assert_eq!(
            b.on_failure(&cfg, t),
            Verdict::Restart(Duration::from_millis(100))
        );
        assert_eq!(
            b.on_failure(&cfg, t),
            Verdict::Restart(Duration::from_millis(150))
        );
        assert!(matches!(b.on_failure(&cfg, t), Verdict::GiveUpUntil(_)));
        // After the window the budget is fresh again.
        let later = t + Duration::from_secs(61);
        assert_eq!(b.on_failure(&cfg, later), Verdict::Restart(Duration::ZERO));
    }
}
