//! The device update API, the handle's side: the package a device should run now (cached per
//! device, see `assignments`), its reports (one message to the project's actor), and the
//! device's history.

use std::sync::Arc;

use fleetops_storage::{UpdateState, pipeline::rollouts::HistoryEntry};
use serde::Serialize;

use super::{PipelineHandle, UploadKind};
use crate::assignments::Answer;
use crate::clock::{fmt_ms, now_ms};
use crate::error::{Error, Result};

/// A configuration's effective data is sent inline up to this size; above, only its link.
const INLINE_CONFIG_BYTES: usize = 64 * 1024;

/// `GET /api/v1/device/deployment`: what the device should run now.
#[derive(Serialize, schemars::JsonSchema)]
pub struct UpdateBody<'a> {
    pub deployment_id: u64,
    pub name: &'a str,
    pub composition_tag: &'a str,
    pub deployed_at: Option<String>,
    pub capsule: CapsuleRef<'a>,
    pub configuration: Option<ConfigRef<'a>>,
    /// package → capsule → commit → test runs, as of this answer (the ETag names what to
    /// install, so a 304 does not refresh it).
    pub provenance: crate::provenance::Provenance,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct CapsuleRef<'a> {
    pub id: u64,
    pub name: &'a str,
    pub version: &'a str,
    pub capsule_type: &'a str,
    sha256: Option<&'a str>,
    pub size_bytes: u64,
    pub download_url: String,
}

#[derive(Serialize, schemars::JsonSchema)]
pub struct ConfigRef<'a> {
    pub id: u64,
    pub name: &'a str,
    pub version: &'a str,
    sha256: Option<&'a str>,
    pub size_bytes: u64,
    /// Inline when small; `None` (only the link) above [`INLINE_CONFIG_BYTES`].
    pub config_data: Option<&'a serde_json::value::RawValue>,
    pub download_url: String,
}

/// What the device update API answers a device: its package's body, and the ETag for this
/// device (the package's, or another once the package was offered to it again).
pub struct Offered {
    pub answer: Arc<Answer>,
    pub etag: String,
}

/// `GET /devices/{id}/history`: the packages a device reported on, newest activity first.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeviceHistory {
    pub device_id: u64,
    pub items: Vec<HistoryItem>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct HistoryItem {
    pub deployment_id: u64,
    /// `None` once the package was deleted.
    pub deployment_name: Option<String>,
    pub capsule: Option<CapsuleSummary>,
    /// The device's latest state with the package.
    pub state: UpdateState,
    pub first_reported_at: String,
    pub last_reported_at: String,
    /// Oldest first.
    pub reports: Vec<Report>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CapsuleSummary {
    pub id: u64,
    pub name: String,
    pub version: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Report {
    pub state: UpdateState,
    pub message: Option<String>,
    pub at: String,
}

impl PipelineHandle {
    /// The package `device` of project `pid` should run now, with short-lived download links
    /// and its ETag for this device; `None` when nothing is assigned. One map read while
    /// nothing changed.
    pub async fn device_update(&self, pid: u64, device: u64) -> Result<Option<Offered>> {
        // A hit is one map read on this thread; a miss is computed on the blocking pool.
        let package = match self
            .assignments
            .cached(device, self.assignments.generation(pid))
        {
            Some(p) => p,
            None => {
                let me = self.clone();
                crate::off_thread(move || me.assignments.offer_of(&me.store, pid, device)).await?
            }
        };
        let Some((package, offer)) = package else {
            return Ok(None);
        };
        let answer = self.package_answer(pid, package).await?;
        // Offered again after a failure: another ETag, so the robot installs it again.
        let etag = match offer {
            0 => answer.etag.clone(),
            n => format!("{}-o{n}\"", answer.etag.trim_end_matches('"')),
        };
        Ok(Some(Offered { answer, etag }))
    }

    /// A package's answer body, shared by its devices.
    async fn package_answer(&self, pid: u64, package: u64) -> Result<Arc<Answer>> {
        // A package's body is shared by its devices and served while its links keep at least
        // three quarters of their life.
        let ttl_ms = self.cfg.download_ttl_seconds.max(1).saturating_mul(1000);
        let now = now_ms();
        if let Some(b) = self.assignments.body(package, now - ttl_ms / 4) {
            return Ok(b);
        }
        let p = self
            .store
            .deployment(pid, package)?
            .ok_or_else(|| Error::not_found("Deployment"))?;
        let b = Arc::new(self.update_body(pid, &p).await?);
        self.assignments.keep_body(package, now, b.clone());
        Ok(b)
    }

    async fn update_body(&self, pid: u64, p: &fleetops_storage::Deployment) -> Result<Answer> {
        let c = self
            .store
            .capsule(pid, p.capsule_id)?
            .ok_or_else(|| Error::Internal(format!("package {} lost its capsule", p.id)))?;
        let exp = now_ms() / 1000 + self.cfg.download_ttl_seconds.max(1);
        let capsule = CapsuleRef {
            id: c.id,
            name: &c.name,
            version: &c.version,
            capsule_type: &c.capsule_type,
            sha256: c.upload.checksum_sha256.as_deref(),
            size_bytes: c.upload.uploaded_bytes.unwrap_or(c.file_size_bytes),
            download_url: self
                .download_link(UploadKind::Capsule, pid, c.id, &c.upload.blob_key, exp)
                .await?,
        };
        let cfg = match p.configuration_id {
            Some(id) => self.store.configuration(pid, id)?,
            None => None,
        };
        let raw = cfg
            .as_ref()
            .filter(|f| f.config_data_json.len() <= INLINE_CONFIG_BYTES)
            .and_then(|f| {
                serde_json::from_slice::<&serde_json::value::RawValue>(&f.config_data_json).ok()
            });
        // What the device installs is the effective (merged) data: its link serves exactly
        // those bytes, and their size and SHA-256 are what the device checks.
        let effective_sha = cfg.as_ref().map(|f| {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(&f.config_data_json))
        });
        let configuration = match &cfg {
            Some(f) => Some(ConfigRef {
                id: f.id,
                name: &f.name,
                version: &f.version,
                sha256: effective_sha.as_deref(),
                size_bytes: f.config_data_json.len() as u64,
                config_data: raw,
                download_url: self.effective_config_link(pid, f.id, exp)?,
            }),
            None => None,
        };
        let body = UpdateBody {
            deployment_id: p.id,
            name: &p.name,
            composition_tag: &p.composition_tag,
            deployed_at: p.deployed_at.map(fmt_ms),
            capsule,
            configuration,
            provenance: crate::provenance::of_package(&self.store, p)?,
        };
        let json = serde_json::to_vec(&body).map_err(|e| Error::Internal(e.to_string()))?;
        // What a device installs is fixed once a package is active (its capsule and
        // configuration are immutable), so the package identifies the content.
        let etag = format!(
            "\"fleetops-d{}-c{}-f{}\"",
            p.id,
            c.id,
            p.configuration_id.unwrap_or(0)
        );
        Ok(Answer {
            etag,
            body: json.into(),
        })
    }

    /// The packages a device reported on, newest activity first, with its reports.
    pub async fn device_history(&self, pid: u64, device: u64) -> Result<DeviceHistory> {
        if self.store.device(pid, device)?.is_none() {
            return Err(Error::not_found("Device"));
        }
        let me = self.clone();
        crate::off_thread(move || me.device_history_now(pid, device)).await
    }

    fn device_history_now(&self, pid: u64, device: u64) -> Result<DeviceHistory> {
        // Newest first; grouped by package in the order each was last reported on.
        let entries: Vec<HistoryEntry> = self.store.device_history(device)?;
        let mut order: Vec<u64> = Vec::new();
        let mut by: std::collections::HashMap<u64, Vec<&HistoryEntry>> = Default::default();
        for e in &entries {
            let v = by.entry(e.deployment_id).or_default();
            if v.is_empty() {
                order.push(e.deployment_id);
            }
            v.push(e);
        }
        let mut items = Vec::with_capacity(order.len());
        for id in order {
            let Some(reports) = by.get(&id) else { continue };
            let (Some(newest), Some(oldest)) = (reports.first(), reports.last()) else {
                continue;
            };
            let d = self.store.deployment(pid, id)?;
            let capsule = match &d {
                Some(d) => self
                    .store
                    .capsule(pid, d.capsule_id)?
                    .map(|c| CapsuleSummary {
                        id: c.id,
                        name: c.name,
                        version: c.version,
                    }),
                None => None,
            };
            items.push(HistoryItem {
                deployment_id: id,
                deployment_name: d.map(|d| d.name),
                capsule,
                state: newest.state,
                first_reported_at: fmt_ms(oldest.at),
                last_reported_at: fmt_ms(newest.at),
                reports: reports
                    .iter()
                    .rev()
                    .map(|e| Report {
                        state: e.state,
                        message: e.message.clone(),
                        at: fmt_ms(e.at),
                    })
                    .collect(),
            });
        }
        Ok(DeviceHistory {
            device_id: device,
            items,
        })
    }
}
