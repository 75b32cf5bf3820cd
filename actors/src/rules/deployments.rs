//! Deployment rules: what blocks a package (evaluated in full, so `plan` can list every
//! reason and create/patch/activate refuse with the first), the devices it targets, the
//! image references it accepts, and its transitions. They read the store and never write
//! it; the project's actor applies them, the pipeline handle plans with them.

use std::collections::{BTreeMap, BTreeSet};

use fleetops_storage::{Deployment, Store};
use semver::Version;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::versions::Constraint;
use fleetops_storage::ValidationStatus;

/// At most this many `target_devices` items.
pub const MAX_TARGETS: usize = 1000;

/// A deployment body (create, plan) or the result of applying a patch to a draft.
#[derive(Debug, Clone)]
pub struct DeploymentSpec {
    pub name: String,
    pub description: Option<String>,
    pub composition_tag: String,
    pub capsule_id: u64,
    pub configuration_id: Option<u64>,
    /// Items as sent; checked by [`evaluate`].
    pub target_devices: Vec<Value>,
    /// A phase plan as sent (`rollout`); checked by [`evaluate`]. `None` in a spec read back
    /// from a stored package (its plan is a record of its own).
    pub rollout: Option<Value>,
}

/// A PATCH of a draft: any subset of the fields.
#[derive(Debug, Clone, Default)]
pub struct DeploymentPatch {
    pub name: Option<String>,
    pub description: Option<Option<String>>,
    pub composition_tag: Option<String>,
    pub capsule_id: Option<u64>,
    pub configuration_id: Option<Option<u64>>,
    pub target_devices: Option<Vec<Value>>,
    /// `Some(None)`: remove the plan.
    pub rollout: Option<Option<Value>>,
}

impl DeploymentSpec {
    pub(crate) fn of(d: &Deployment) -> Self {
        Self {
            name: d.name.clone(),
            description: d.description.clone(),
            composition_tag: d.composition_tag.clone(),
            capsule_id: d.capsule_id,
            configuration_id: d.configuration_id,
            target_devices: serde_json::from_slice(&d.target_devices_json).unwrap_or_default(),
            rollout: None,
        }
    }

    pub(crate) fn apply(&mut self, p: DeploymentPatch) {
        if let Some(v) = p.name {
            self.name = v;
        }
        if let Some(v) = p.description {
            self.description = v;
        }
        if let Some(v) = p.composition_tag {
            self.composition_tag = v;
        }
        if let Some(v) = p.capsule_id {
            self.capsule_id = v;
        }
        if let Some(v) = p.configuration_id {
            self.configuration_id = v;
        }
        if let Some(v) = p.target_devices {
            self.target_devices = v;
        }
        if let Some(v) = p.rollout {
            self.rollout = v;
        }
    }
}

/// One reason a deployment cannot be created as given: 422 for input that breaks a rule,
/// 409 for a capsule or configuration in the wrong state.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Blocker {
    pub status: u16,
    pub field: String,
    pub reason: String,
}

/// A targeted device.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct TargetDevice {
    pub id: u64,
    pub name: String,
}

/// What [`evaluate`] found.
#[derive(Debug)]
pub struct Evaluation {
    pub blockers: Vec<Blocker>,
    pub devices: Vec<TargetDevice>,
    /// `target_devices` normalized (ids, `{group_id}`, `{labels}`), when every item parsed.
    pub targets_json: Vec<u8>,
    /// The phase plan as kept, when one was given and it is valid.
    pub rollout_json: Option<Vec<u8>>,
}

impl Evaluation {
    /// The first 422, else every 409 in one message, else nothing.
    pub fn into_error(self) -> Option<Error> {
        if let Some(b) = self.blockers.iter().find(|b| b.status == 422) {
            return Some(Error::unprocessable(&b.field, &b.reason));
        }
        let conflicts: Vec<String> = self
            .blockers
            .iter()
            .filter(|b| b.status == 409)
            .map(|b| b.reason.clone())
            .collect();
        (!conflicts.is_empty()).then(|| Error::Conflict(conflicts.join("; ")))
    }
}

/// Docker's tag grammar: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn bare_tag(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_alphanumeric() || b == b'_' || (i > 0 && matches!(b, b'.' | b'-'))
        })
}

/// What a robot pulls: a bare tag, or an image reference in the distribution grammar,
/// `[registry[:port]/]repository[:tag][@sha256:<64 hex>]`. Only sha256 digests are taken, as
/// registries address manifests by them; the grammar's `\w` is Unicode, so non-ASCII is refused
/// first.
pub fn composition_tag(s: &str) -> bool {
    if bare_tag(s) {
        return true;
    }
    if !s.is_ascii() || s.len() > 512 {
        return false;
    }
    match oci_spec::distribution::Reference::try_from(s) {
        Ok(r) => r.digest().is_none_or(|d| {
            d.strip_prefix("sha256:").is_some_and(|h| {
                h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            })
        }),
        Err(_) => false,
    }
}

/// Every reason `spec` would be refused, and the devices it would target.
/// Whether the stored package `d` targets `device` (by id, through a group, or by labels), as
/// its targets read now.
pub fn targets_device(
    store: &Store,
    d: &fleetops_storage::Deployment,
    device: &fleetops_storage::Device,
) -> Result<bool> {
    let items: Vec<Value> = serde_json::from_slice(&d.target_devices_json).unwrap_or_default();
    for item in items {
        let hit = match &item {
            Value::Number(n) => n.as_u64() == Some(device.id),
            Value::Object(m) => {
                if let Some(gid) = m.get("group_id").and_then(Value::as_u64) {
                    store
                        .group(d.project_id, gid)?
                        .is_some_and(|g| g.device_ids.binary_search(&device.id).is_ok())
                } else if let Some(Value::Object(l)) = m.get("labels") {
                    !l.is_empty()
                        && l.iter().all(|(k, v)| {
                            v.as_str().is_some_and(|v| {
                                device.labels.get(k).map(String::as_str) == Some(v)
                            })
                        })
                } else {
                    false
                }
            }
            _ => false,
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

pub fn evaluate(store: &Store, pid: u64, spec: &DeploymentSpec) -> Result<Evaluation> {
    let mut blockers = Vec::new();
    let mut block = |status: u16, field: &str, reason: String| {
        blockers.push(Blocker {
            status,
            field: field.to_string(),
            reason,
        })
    };
    if let Err(Error::Unprocessable(m)) = crate::rules::name("name", &spec.name, 200) {
        block(422, "name", m);
    }
    if spec
        .description
        .as_ref()
        .is_some_and(|d| d.chars().count() > 2000)
    {
        block(422, "description", "at most 2000 characters".into());
    }
    if !composition_tag(&spec.composition_tag) {
        block(
            422,
            "composition_tag",
            "must be a container image reference ([registry[:port]/]repository[:tag][@sha256:<64 hex>]) or a bare tag".into(),
        );
    }
    let capsule = store.capsule(pid, spec.capsule_id)?;
    match &capsule {
        None => block(
            422,
            "capsule_id",
            format!("capsule {} does not exist in this project", spec.capsule_id),
        ),
        Some(c) if c.upload.validation_status != ValidationStatus::Passed => block(
            409,
            "capsule_id",
            format!(
                "Capsule {} ({} {}) is {}; only a passed capsule can be deployed",
                c.id, c.name, c.version, c.upload.validation_status
            ),
        ),
        Some(_) => {}
    }
    if let Some(cid) = spec.configuration_id {
        match store.configuration(pid, cid)? {
            None => block(
                422,
                "configuration_id",
                format!("configuration {cid} does not exist in this project"),
            ),
            Some(cf) => {
                if cf.upload.validation_status != ValidationStatus::Passed {
                    block(
                        409,
                        "configuration_id",
                        format!(
                            "Configuration {} ({} {}) is {}; only a passed configuration can be deployed",
                            cf.id, cf.name, cf.version, cf.upload.validation_status
                        ),
                    );
                }
                if let Some(c) = &capsule {
                    let v = Version::new(c.version_major, c.version_minor, c.version_patch);
                    let fits = Constraint::parse(
                        "compatible_capsule_versions",
                        &cf.compatible_capsule_versions,
                    )
                    .is_ok_and(|k| k.matches(&v));
                    let linked_name = store
                        .capsule(pid, cf.capsule_id)?
                        .map(|l| l.name)
                        .unwrap_or_default();
                    if linked_name != c.name {
                        block(
                            409,
                            "configuration_id",
                            format!(
                                "Configuration {} ({} {}) is for capsule {linked_name}, not {}",
                                cf.id, cf.name, cf.version, c.name
                            ),
                        );
                    } else if !fits {
                        block(
                            409,
                            "configuration_id",
                            format!(
                                "Configuration {} ({} {}) is not compatible with capsule {} {} (compatible_capsule_versions {})",
                                cf.id,
                                cf.name,
                                cf.version,
                                c.name,
                                c.version,
                                cf.compatible_capsule_versions
                            ),
                        );
                    }
                }
            }
        }
    }
    if spec.target_devices.len() > MAX_TARGETS {
        block(
            422,
            "target_devices",
            format!("at most {MAX_TARGETS} items"),
        );
    }
    let devices = store.project_devices(pid)?;
    let mut chosen = BTreeSet::new();
    let mut normalized = Vec::new();
    let mut all_parsed = true;
    for (i, item) in spec.target_devices.iter().take(MAX_TARGETS).enumerate() {
        let field = format!("target_devices[{i}]");
        match item {
            Value::Number(n) => match crate::rules::whole::from_number(n) {
                Some(id) if devices.iter().any(|d| d.id == id) => {
                    chosen.insert(id);
                    normalized.push(Value::from(id));
                }
                Some(id) => {
                    all_parsed = false;
                    block(
                        422,
                        &field,
                        format!("device {id} does not exist in this project"),
                    );
                }
                None => {
                    all_parsed = false;
                    block(422, &field, "a device id is a positive integer".into());
                }
            },
            Value::Object(m) if m.len() == 1 && m.contains_key("group_id") => {
                match m.get("group_id").and_then(|v| match v {
                    Value::Number(n) => crate::rules::whole::from_number(n),
                    _ => None,
                }) {
                    Some(gid) => match store.group(pid, gid)? {
                        Some(g) => {
                            chosen.extend(g.device_ids.iter().copied());
                            normalized.push(serde_json::json!({ "group_id": gid }));
                        }
                        None => {
                            all_parsed = false;
                            block(
                                422,
                                &field,
                                format!("device group {gid} does not exist in this project"),
                            );
                        }
                    },
                    None => {
                        all_parsed = false;
                        block(422, &field, "group_id must be an integer".into());
                    }
                }
            }
            Value::Object(m) if m.len() == 1 && m.contains_key("labels") => {
                let labels: Option<BTreeMap<String, String>> = m
                    .get("labels")
                    .and_then(|l| serde_json::from_value(l.clone()).ok());
                match labels {
                    Some(l) if !l.is_empty() => {
                        for d in devices.iter() {
                            if l.iter().all(|(k, v)| d.labels.get(k) == Some(v)) {
                                chosen.insert(d.id);
                            }
                        }
                        normalized.push(serde_json::json!({ "labels": l }));
                    }
                    _ => {
                        all_parsed = false;
                        block(
                            422,
                            &field,
                            "labels must be a non-empty object of string values".into(),
                        );
                    }
                }
            }
            _ => {
                all_parsed = false;
                block(
                    422,
                    &field,
                    "must be a device id, {\"group_id\": N} or {\"labels\": {...}}".into(),
                );
            }
        }
    }
    let devices = devices
        .iter()
        .rev()
        .filter(|d| chosen.contains(&d.id))
        .map(|d| TargetDevice {
            id: d.id,
            name: d.name.clone(),
        })
        .collect();
    let targets_json = if all_parsed {
        serde_json::to_vec(&normalized).map_err(|e| Error::Internal(e.to_string()))?
    } else {
        Vec::new()
    };
    let mut rollout_json = None;
    if let Some(v) = &spec.rollout {
        let plan = crate::rules::rollouts::RolloutPlan::parse(
            v,
            |g| Ok(store.group(pid, g)?.is_some()),
            |r| Ok(store.alert_rule(pid, r)?.is_some()),
        );
        match plan {
            Ok(p) => {
                rollout_json =
                    Some(serde_json::to_vec(&p).map_err(|e| Error::Internal(e.to_string()))?)
            }
            Err(Error::Unprocessable(m)) => {
                let (field, why) = m.split_once(": ").unwrap_or(("rollout", m.as_str()));
                block(422, field, why.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Evaluation {
        blockers,
        devices,
        targets_json,
        rollout_json,
    })
}

/// The transitions of a deployment package.
#[derive(Debug, Clone, Copy)]
pub enum Transition {
    Activate,
    Deprecate,
}

#[cfg(test)]
mod tests {
    use super::composition_tag;

    #[test]
    fn composition_tags_and_references() {
        let digest = "a".repeat(64);
        for ok in [
            "1.2.0".to_string(),
            "nav-1.2.0".into(),
            "V1_2".into(),
            "registry.example/robot:1.2.0".into(),
            format!("ghcr.io/acme/arm-controller@sha256:{digest}"),
            format!("ghcr.io/acme/arm-controller:2.0@sha256:{digest}"),
            "localhost:5000/nav:2024.06".into(),
            "acme/nav".into(),
        ] {
            assert!(composition_tag(&ok), "{ok}");
        }
        for bad in [
            "".to_string(),
            "bad tag!".into(),
            "Registry.example/Robot:1".into(),
            "ghcr.io/acme/arm@sha256:abc".into(),
            format!("ghcr.io/acme/arm@sha512:{digest}"),
            format!("ghcr.io/acme/arm@sha256:{}", "A".repeat(64)),
            "robot:ünï".into(),
            "robot:".into(),
            "/robot:1".into(),
            "-tag".into(),
        ] {
            assert!(!composition_tag(&bad), "{bad}");
        }
    }
}
