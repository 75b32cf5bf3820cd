//! Persisted records. Times are Unix milliseconds (UTC). Field order is part of the postcard
//! format: append new fields only with a format bump in `codec`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    Viewer,
    Member,
    Admin,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "viewer" => Role::Viewer,
            "member" => Role::Member,
            "admin" => Role::Admin,
            "owner" => Role::Owner,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct User {
    pub id: u64,
    /// Lower-cased; unique.
    pub email: String,
    /// argon2id PHC string.
    pub password_hash: String,
    pub is_superuser: bool,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Organization {
    pub id: u64,
    pub slug: String,
    pub name: String,
    pub tier: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Membership {
    pub org_id: u64,
    pub user_id: u64,
    pub role: Role,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Project {
    pub id: u64,
    pub org_id: u64,
    pub slug: String,
    pub name: String,
    /// SHA-256 of the current project secret; the secret itself is never stored.
    pub secret_hash: [u8; 32],
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiKey {
    pub id: u64,
    pub user_id: u64,
    pub name: String,
    /// The first characters of the key (`fops_` and a few more), shown in lists.
    pub prefix: String,
    pub hash: [u8; 32],
    pub created_at: i64,
    pub last_used_at: Option<i64>,
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionStatus {
    Active,
    Completed,
    Failed,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Completed => "completed",
            SessionStatus::Failed => "failed",
        }
    }
}

/// A run of a device. Written by the project's actor (status, tags); its counters live apart
/// in [`SessionCounters`], written by the session's own actor while it is active.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Session {
    pub id: u64,
    pub project_id: u64,
    pub device_id: u64,
    /// Kept so the session reads the same after its device is deleted.
    pub device_name: String,
    pub status: SessionStatus,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    /// Sorted, unique.
    pub tags: Vec<String>,
    pub package_id: Option<u64>,
}

/// What a session holds, kept by its actor.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SessionCounters {
    pub log_count: u64,
    /// Sequence number of the next log chunk.
    pub next_chunk: u64,
    pub artifact_count: u64,
    pub artifact_size_bytes: u64,
}

/// A batch of log entries stored together, column by column, so that a query can reject a
/// chunk by its time range and level mask, and match levels, modules and message text
/// without decoding what it does not return.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LogChunk {
    pub min_ts: i64,
    pub max_ts: i64,
    /// Bit `1 << level` for each level present.
    pub level_mask: u8,
    /// Unix milliseconds, one per entry.
    pub ts: Vec<i64>,
    /// 0 debug, 1 info, 2 warn, 3 error.
    pub levels: Vec<u8>,
    /// Distinct modules of the chunk, and each entry's index into them.
    pub modules: Vec<String>,
    pub module_idx: Vec<u32>,
    /// Messages concatenated; entry `i` ends at `text_ends[i]`.
    pub text: String,
    pub text_ends: Vec<u32>,
    /// Metadata as JSON, concatenated likewise (free-form JSON stays JSON bytes).
    pub meta: Vec<u8>,
    pub meta_ends: Vec<u32>,
}

impl LogChunk {
    pub fn len(&self) -> usize {
        self.ts.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ts.is_empty()
    }
}

/// A file attached to a session; its bytes live in the blob store under `blob_key`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Artifact {
    pub session_id: u64,
    /// Relative, `/`-separated, validated.
    pub path: String,
    pub size_bytes: u64,
    pub content_type: String,
    /// Built from ids, never from the path.
    pub blob_key: String,
    pub created_at: i64,
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
