//! Capsules, configurations, deployments and each device's result.

use serde::{Deserialize, Serialize};

use crate::UploadState;

use crate::states::{DeploymentStatus, RolloutStatus};

/// A capsule version (an application package) of a project.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Capsule {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    /// Strict `MAJOR.MINOR.PATCH`; the parts below order versions.
    pub version: String,
    pub version_major: u64,
    pub version_minor: u64,
    pub version_patch: u64,
    pub description: Option<String>,
    /// `SW`, `FW` or `OS`.
    pub capsule_type: String,
    /// As declared at `upload-url` (what the quota reserves and the upload may not exceed).
    pub file_size_bytes: u64,
    /// Free-form JSON object, kept as JSON bytes.
    pub metadata_json: Vec<u8>,
    /// (name, constraint) pairs.
    pub dependencies: Vec<(String, String)>,
    pub is_latest: bool,
    /// The file (`.tar.gz`, `.tgz`, `.tar` or `.zip`) and its verdict.
    pub upload: UploadState,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A configuration version of a project, linked to a capsule; may inherit from a parent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Configuration {
    pub id: u64,
    pub project_id: u64,
    pub capsule_id: u64,
    pub name: String,
    pub description: Option<String>,
    pub environment: String,
    /// Strict `MAJOR.MINOR.PATCH`.
    pub version: String,
    /// A constraint the linked capsule's version must match.
    pub compatible_capsule_versions: String,
    /// As declared at `upload-url` (the quota reserves 1 MiB when none is declared).
    pub declared_size: Option<u64>,
    pub parent_config_id: Option<u64>,
    /// What this file sets, as JSON bytes (an object; `{}` until confirmed).
    pub override_fields_json: Vec<u8>,
    /// The effective configuration (parent deep-merged with `override_fields`), JSON bytes.
    pub config_data_json: Vec<u8>,
    /// This configuration's own JSON Schema, if any, as JSON bytes.
    pub validation_schema_json: Option<Vec<u8>>,
    /// The file (`.json`, `.yaml`, `.toml`, `.ini` or `.env`) and its verdict.
    pub upload: UploadState,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A deployment package: a capsule (and optionally a configuration) for a set of devices.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deployment {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    pub description: Option<String>,
    pub composition_tag: String,
    pub capsule_id: u64,
    pub configuration_id: Option<u64>,
    pub status: DeploymentStatus,
    pub deployed_at: Option<i64>,
    pub deprecated_at: Option<i64>,
    /// The `target_devices` array as JSON bytes (validated: ids, `{group_id}`, `{labels}`).
    pub target_devices_json: Vec<u8>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A device's latest rollout result for a deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceResult {
    pub deployment_id: u64,
    pub device_id: u64,
    pub status: RolloutStatus,
    pub message: Option<String>,
    pub reported_at: i64,
}
