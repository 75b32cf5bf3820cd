//! Alert rule conditions: their shape, their validation, and the comparisons they make. The
//! evaluator decides *when* with these; nothing here keeps state.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest duration or window a condition may name (30 days).
pub const MAX_SECONDS: u64 = 30 * 24 * 3600;
/// The largest compiled pattern, so one rule cannot make every log batch slow.
pub const MAX_PATTERN_BYTES: usize = 1024;
/// The largest `count` of a log rule.
pub const MAX_COUNT: u64 = 10_000;
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceStatus {
    Online,
    Offline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Operator {
    Gt,
    Gte,
    Lt,
    Lte,
    Eq,
    Ne,
}

impl Operator {
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Operator::Gt => value > threshold,
            Operator::Gte => value >= threshold,
            Operator::Lt => value < threshold,
            Operator::Lte => value <= threshold,
            Operator::Eq => value == threshold,
            Operator::Ne => value != threshold,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Operator::Gt => ">",
            Operator::Gte => ">=",
            Operator::Lt => "<",
            Operator::Lte => "<=",
            Operator::Eq => "==",
            Operator::Ne => "!=",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RolloutOutcome {
    Succeeded,
    Failed,
}

fn one() -> u64 {
    1
}
fn sixty() -> u64 {
    60
}

/// A rule's condition, as stored and shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Condition {
    /// The device has been in `status` for `duration_seconds`.
    DeviceStatus {
        status: DeviceStatus,
        #[serde(deserialize_with = "crate::rules::whole::u64")]
        duration_seconds: u64,
    },
    /// The latest heartbeat value of `metric` has compared true for `duration_seconds`.
    MetricThreshold {
        metric: String,
        operator: Operator,
        threshold: f64,
        #[serde(deserialize_with = "crate::rules::whole::u64")]
        duration_seconds: u64,
    },
    /// At least `count` log lines matching `pattern` (and `level`, `module` when given)
    /// within the last `window_seconds`.
    LogPattern {
        pattern: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        level: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        module: Option<String>,
        #[serde(default = "one", deserialize_with = "crate::rules::whole::u64")]
        count: u64,
        #[serde(default = "sixty", deserialize_with = "crate::rules::whole::u64")]
        window_seconds: u64,
    },
    /// The device's latest rollout result is `status`.
    DeploymentStatus { status: RolloutOutcome },
    /// The server's data directory has had fewer than `below_bytes` free for
    /// `duration_seconds`. Server-wide: its alert names no device, and only a superuser may
    /// write such a condition (it shows the operator's disk).
    DiskSpace {
        #[serde(deserialize_with = "crate::rules::whole::u64")]
        below_bytes: u64,
        #[serde(default, deserialize_with = "crate::rules::whole::u64")]
        duration_seconds: u64,
    },
}

impl Condition {
    /// Parses and checks a condition object; every failure is a 422 naming the field.
    pub fn parse(v: &serde_json::Value) -> Result<Self> {
        let c: Condition = serde_json::from_value(v.clone())
            .map_err(|e| Error::unprocessable("condition", e.to_string()))?;
        let within = |field: &str, n: u64, min: u64| {
            if n < min || n > MAX_SECONDS {
                Err(Error::unprocessable(
                    field,
                    format!("must be between {min} and {MAX_SECONDS}"),
                ))
            } else {
                Ok(())
            }
        };
        match &c {
            Condition::DeviceStatus {
                duration_seconds, ..
            } => within("condition.duration_seconds", *duration_seconds, 0)?,
            Condition::MetricThreshold {
                metric,
                threshold,
                duration_seconds,
                ..
            } => {
                if metric.is_empty() || metric.len() > 128 {
                    return Err(Error::unprocessable(
                        "condition.metric",
                        "must be 1-128 bytes",
                    ));
                }
                if !threshold.is_finite() {
                    return Err(Error::unprocessable(
                        "condition.threshold",
                        "must be a finite number",
                    ));
                }
                within("condition.duration_seconds", *duration_seconds, 0)?;
            }
            Condition::LogPattern {
                pattern,
                module,
                count,
                window_seconds,
                ..
            } => {
                compile(pattern)?;
                if module
                    .as_ref()
                    .is_some_and(|m| m.is_empty() || m.len() > 128)
                {
                    return Err(Error::unprocessable(
                        "condition.module",
                        "must be 1-128 bytes",
                    ));
                }
                // The evaluator keeps up to `count` match times per (rule, device).
                if *count == 0 || *count > MAX_COUNT {
                    return Err(Error::unprocessable(
                        "condition.count",
                        format!("must be between 1 and {MAX_COUNT}"),
                    ));
                }
                within("condition.window_seconds", *window_seconds, 1)?;
            }
            Condition::DeploymentStatus { .. } => {}
            Condition::DiskSpace {
                below_bytes,
                duration_seconds,
            } => {
                if *below_bytes == 0 {
                    return Err(Error::unprocessable(
                        "condition.below_bytes",
                        "must be at least 1",
                    ));
                }
                within("condition.duration_seconds", *duration_seconds, 0)?;
            }
        }
        Ok(c)
    }

    /// How long the condition must hold before it fires (0 for events).
    pub fn duration_ms(&self) -> i64 {
        match self {
            Condition::DeviceStatus {
                duration_seconds, ..
            }
            | Condition::MetricThreshold {
                duration_seconds, ..
            }
            | Condition::DiskSpace {
                duration_seconds, ..
            } => (*duration_seconds as i64).saturating_mul(1000),
            _ => 0,
        }
    }
}

/// The device id a server-wide condition's states and alerts carry: no device has it (ids
/// start at 1), and an alert with it is shown with `device_id: null`.
pub const SERVER: u64 = 0;

/// The device an alert names, `None` for a server-wide one.
pub fn alert_device(device_id: u64) -> Option<u64> {
    (device_id != SERVER).then_some(device_id)
}

/// Whether a condition body names a server-wide condition (`disk_space`), which only a
/// superuser may write. Read from the raw body, so the answer comes before its other checks.
pub fn is_server_wide(v: &serde_json::Value) -> bool {
    v.get("type").and_then(|t| t.as_str()) == Some("disk_space")
}

/// Compiles a log pattern with a linear-time engine and a size limit.
pub fn compile(pattern: &str) -> Result<regex::Regex> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
        return Err(Error::unprocessable(
            "condition.pattern",
            format!("must be 1-{MAX_PATTERN_BYTES} bytes"),
        ));
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            let why = match e {
                regex::Error::CompiledTooBig(_) => "is too large once compiled".to_string(),
                other => format!("is not a valid regular expression: {other}"),
            };
            Error::unprocessable("condition.pattern", why)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conditions_parse_with_defaults_and_refuse_bad_fields() {
        let c = Condition::parse(&json!({"type": "log_pattern", "pattern": "over.?heat"})).unwrap();
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"type": "log_pattern", "pattern": "over.?heat", "count": 1, "window_seconds": 60})
        );
        let c = Condition::parse(&json!({"type": "metric_threshold", "metric": "cpu", "operator": "gte", "threshold": 0.9, "duration_seconds": 5})).unwrap();
        assert_eq!(c.duration_ms(), 5000);
        for bad in [
            json!({"type": "nope"}),
            json!({"type": "device_status", "status": "sleeping", "duration_seconds": 1}),
            json!({"type": "device_status", "status": "offline"}),
            json!({"type": "metric_threshold", "metric": "cpu", "operator": "about", "threshold": 1, "duration_seconds": 1}),
            json!({"type": "log_pattern", "pattern": "("}),
            json!({"type": "log_pattern", "pattern": "a{1000}{1000}"}),
            json!({"type": "log_pattern", "pattern": "x", "count": 0}),
            json!({"type": "log_pattern", "pattern": "x", "extra": 1}),
            json!({"type": "deployment_status", "status": "maybe"}),
            json!("device_status"),
        ] {
            assert!(Condition::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn operators() {
        assert!(Operator::Gt.holds(2.0, 1.0) && !Operator::Gt.holds(1.0, 1.0));
        assert!(Operator::Gte.holds(1.0, 1.0) && Operator::Lte.holds(1.0, 1.0));
        assert!(Operator::Lt.holds(0.5, 1.0) && Operator::Ne.holds(0.5, 1.0));
        assert!(Operator::Eq.holds(1.0, 1.0));
    }
}
