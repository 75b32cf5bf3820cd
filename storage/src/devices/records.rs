//! Devices and device groups.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Device {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub token_hash: [u8; 32],
    pub created_at: i64,
    /// Time of the last heartbeat; `None` until the first one.
    pub last_seen_at: Option<i64>,
    /// Metrics of the last heartbeat.
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceGroup {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    /// Sorted, unique; only devices of the same project.
    pub device_ids: Vec<u64>,
    pub created_at: i64,
}
