//! Rollout rules: the phase plan a package may carry (checked in full), which devices each
//! phase holds (stable: a hash of the device and the package orders the targets, so a pause
//! and resume never reshuffle), which package a device should run now, and the gate that
//! decides whether a phase may be followed by the next. Pure: the callers read the store.

use std::collections::HashMap;

use fleetops_storage::{Deployment, DeploymentStatus, RolloutState, pipeline::rollouts::Rollout};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// At most this many phases.
pub const MAX_PHASES: usize = 20;
/// At most this many gate rules.
pub const MAX_GATES: usize = 50;
/// A phase waits at most 30 days.
const MAX_WAIT_SECONDS: u64 = 30 * 24 * 3600;

/// `rollout` of a package, as sent and as kept (JSON bytes in the rollout record).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RolloutPlan {
    pub phases: Vec<Phase>,
    #[serde(default)]
    pub gate_alert_rule_ids: Vec<u64>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub name: String,
    pub devices: PhaseDevices,
    #[serde(default)]
    pub min_wait_seconds: u64,
    /// Failed devices over the phase's devices; above it the phase fails.
    #[serde(default)]
    pub max_failure_rate: f64,
    /// Succeeded devices over the phase's devices (less the failures a resume accepted); the
    /// phase passes only at or above it. Default 1, or `1 - max_failure_rate` when that is
    /// given (the two then state one tolerance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_success_rate: Option<f64>,
    /// A device of the phase that reports no final result within this many seconds of the
    /// phase's start (or resume) counts against it: the phase fails its gate. Default
    /// [`DEFAULT_REPORT_TIMEOUT_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_timeout_seconds: Option<u64>,
}

/// A phase's devices have an hour to report a final result unless its plan says otherwise.
pub const DEFAULT_REPORT_TIMEOUT_SECONDS: u64 = 3600;

impl Phase {
    /// The success rate the phase needs to pass.
    pub fn success_needed(&self) -> f64 {
        self.min_success_rate
            .unwrap_or(1.0 - self.max_failure_rate)
            .clamp(0.0, 1.0)
    }

    /// How long its devices have to report, in seconds.
    pub fn report_timeout(&self) -> u64 {
        self.report_timeout_seconds
            .unwrap_or(DEFAULT_REPORT_TIMEOUT_SECONDS)
    }
}

/// Exactly one of the three.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PhaseDevices {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    #[default]
    Pause,
    Rollback,
}

impl RolloutPlan {
    /// Parses and checks a plan; `group_exists` and `rule_exists` look ids up in the project.
    pub fn parse(
        v: &serde_json::Value,
        group_exists: impl Fn(u64) -> Result<bool>,
        rule_exists: impl Fn(u64) -> Result<bool>,
    ) -> Result<Self> {
        let plan: RolloutPlan = serde_json::from_value(v.clone())
            .map_err(|e| Error::unprocessable("rollout", e.to_string()))?;
        if plan.phases.is_empty() || plan.phases.len() > MAX_PHASES {
            return Err(Error::unprocessable(
                "rollout.phases",
                format!("must hold 1 to {MAX_PHASES} phases"),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, p) in plan.phases.iter().enumerate() {
            let at = |f: &str| format!("rollout.phases[{i}].{f}");
            crate::rules::name(&at("name"), &p.name, 64)?;
            if !names.insert(p.name.trim()) {
                return Err(Error::unprocessable(&at("name"), "phase names must differ"));
            }
            let d = &p.devices;
            let given = [d.percent.is_some(), d.count.is_some(), d.group_id.is_some()];
            if given.iter().filter(|g| **g).count() != 1 {
                return Err(Error::unprocessable(
                    &at("devices"),
                    "must give exactly one of percent, count or group_id",
                ));
            }
            if d.percent.is_some_and(|p| !(p > 0.0 && p <= 100.0)) {
                return Err(Error::unprocessable(
                    &at("devices.percent"),
                    "must be above 0 and at most 100",
                ));
            }
            if d.count == Some(0) {
                return Err(Error::unprocessable(
                    &at("devices.count"),
                    "must be at least 1",
                ));
            }
            if let Some(g) = d.group_id
                && !group_exists(g)?
            {
                return Err(Error::unprocessable(
                    &at("devices.group_id"),
                    format!("group {g} does not exist in this project"),
                ));
            }
            if p.min_wait_seconds > MAX_WAIT_SECONDS {
                return Err(Error::unprocessable(
                    &at("min_wait_seconds"),
                    "at most 30 days",
                ));
            }
            if !(0.0..=1.0).contains(&p.max_failure_rate) {
                return Err(Error::unprocessable(
                    &at("max_failure_rate"),
                    "must be from 0 to 1",
                ));
            }
            if p.min_success_rate
                .is_some_and(|r| !(0.0..=1.0).contains(&r))
            {
                return Err(Error::unprocessable(
                    &at("min_success_rate"),
                    "must be from 0 to 1",
                ));
            }
            if p.report_timeout_seconds
                .is_some_and(|t| t == 0 || t > MAX_WAIT_SECONDS)
            {
                return Err(Error::unprocessable(
                    &at("report_timeout_seconds"),
                    "must be from 1 s to 30 days",
                ));
            }
        }
        if plan.gate_alert_rule_ids.len() > MAX_GATES {
            return Err(Error::unprocessable(
                "rollout.gate_alert_rule_ids",
                format!("at most {MAX_GATES} rules"),
            ));
        }
        for &r in &plan.gate_alert_rule_ids {
            if !rule_exists(r)? {
                return Err(Error::unprocessable(
                    "rollout.gate_alert_rule_ids",
                    format!("alert rule {r} does not exist in this project"),
                ));
            }
        }
        Ok(plan)
    }

    /// The plan as kept (and shown).
    pub fn of(r: &Rollout) -> Option<Self> {
        serde_json::from_slice(&r.plan_json).ok()
    }
}

mod actions;
mod gate;
mod phases;

pub use actions::*;
pub use gate::*;
pub use phases::*;

#[cfg(test)]
mod tests;
