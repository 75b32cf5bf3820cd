//! Persisted records. Times are Unix milliseconds (UTC). Field order is part of the postcard
//! format: append new fields only with a format bump in `codec`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::states::{
    DeliveryOutcome, DeploymentStatus, InstallationState, RolloutStatus, RunStatus,
    ValidationStatus,
};

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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCounters {
    pub log_count: u64,
    /// Sequence number of the next log chunk.
    pub next_chunk: u64,
    pub artifact_count: u64,
    pub artifact_size_bytes: u64,
}

/// A batch of log entries stored together, column by column, so that a query can reject a
/// chunk by its time range and level mask, and match levels, modules and message text
/// without decoding what it does not return. Numeric columns are little-endian byte arrays
/// (`serde_bytes`), so decoding a chunk is a few copies, not a varint per value.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LogChunk {
    pub min_ts: i64,
    pub max_ts: i64,
    /// Bit `1 << level` for each level present.
    pub level_mask: u8,
    /// Unix milliseconds, `i64` LE, one per entry.
    #[serde(with = "serde_bytes")]
    pub ts: Vec<u8>,
    /// 0 debug, 1 info, 2 warn, 3 error; one byte per entry (this column defines `len`).
    #[serde(with = "serde_bytes")]
    pub levels: Vec<u8>,
    /// Distinct modules of the chunk.
    pub modules: Vec<String>,
    /// Each entry's index into `modules`, `u32` LE.
    #[serde(with = "serde_bytes")]
    pub module_idx: Vec<u8>,
    /// Messages concatenated; entry `i` ends at `text_end(i)` (`u32` LE each).
    pub text: String,
    #[serde(with = "serde_bytes")]
    pub text_ends: Vec<u8>,
    /// Metadata as JSON, concatenated likewise (free-form JSON stays JSON bytes).
    #[serde(with = "serde_bytes")]
    pub meta: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub meta_ends: Vec<u8>,
}

/// What a query needs to know of a chunk without opening it: its time range and how many
/// entries it holds per module and level. Stored beside the chunk (a few dozen bytes), so a
/// count by level or module, and the choice of which chunks a page needs, read these alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogSummary {
    pub min_ts: i64,
    pub max_ts: i64,
    /// Per module of the chunk, in the chunk's module order: entries per level (0-3).
    pub counts: Vec<(String, [u32; 4])>,
}

impl LogSummary {
    pub fn of(c: &LogChunk) -> Self {
        let mut counts: Vec<(String, [u32; 4])> =
            c.modules.iter().map(|m| (m.clone(), [0; 4])).collect();
        for i in 0..c.len() {
            let (Some(m), Some(lv)) = (c.module_at(i), c.level_at(i)) else {
                continue;
            };
            if let Some(slot) = counts
                .get_mut(m as usize)
                .and_then(|(_, n)| n.get_mut(lv as usize))
            {
                *slot += 1;
            }
        }
        Self {
            min_ts: c.min_ts,
            max_ts: c.max_ts,
            counts,
        }
    }

    /// Entries of `module` (any when `None`) whose level is in `levels` (bit per level; 0
    /// means any).
    pub fn count(&self, levels: u8, module: Option<&str>) -> u64 {
        count_of(
            self.counts.iter().map(|(m, n)| (m.as_str(), n)),
            levels,
            module,
        )
    }

    pub fn len(&self) -> u64 {
        self.count(0, None)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A [`LogSummary`] read in place (its module names borrowed from the store's buffer): a
/// query reads one per chunk of the session.
#[derive(Debug, Deserialize)]
pub struct LogSummaryView<'a> {
    pub min_ts: i64,
    pub max_ts: i64,
    #[serde(borrow)]
    counts: Vec<(&'a str, [u32; 4])>,
}

impl LogSummaryView<'_> {
    /// As [`LogSummary::count`].
    pub fn count(&self, levels: u8, module: Option<&str>) -> u64 {
        count_of(self.counts.iter().map(|(m, n)| (*m, n)), levels, module)
    }

    pub fn len(&self) -> u64 {
        self.count(0, None)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn count_of<'a>(
    counts: impl Iterator<Item = (&'a str, &'a [u32; 4])>,
    levels: u8,
    module: Option<&str>,
) -> u64 {
    counts
        .filter(|(m, _)| module.is_none_or(|want| *m == want))
        .flat_map(|(_, n)| n.iter().enumerate())
        .filter(|(lv, _)| levels == 0 || levels & (1 << lv) != 0)
        .map(|(_, n)| u64::from(*n))
        .sum()
}

fn u32_at(col: &[u8], i: usize) -> Option<u32> {
    col.get(i * 4..i * 4 + 4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_le_bytes)
}

/// A log chunk read in place from the store's buffer, for passes over many chunks (a text
/// search over a session) that would otherwise copy every column of every chunk only to look
/// at its text. Same postcard layout as [`LogChunk`]: postcard writes strings and byte arrays
/// alike (a length, then the bytes).
#[derive(Debug, Deserialize)]
pub struct LogChunkView<'a> {
    pub min_ts: i64,
    pub max_ts: i64,
    pub level_mask: u8,
    ts: &'a [u8],
    levels: &'a [u8],
    #[serde(borrow)]
    modules: Vec<&'a str>,
    module_idx: &'a [u8],
    text: &'a [u8],
    text_ends: &'a [u8],
    meta: &'a [u8],
    meta_ends: &'a [u8],
}

/// A chunk's columns as slices, however the chunk was read.
#[derive(Debug, Clone, Copy)]
pub struct Cols<'a> {
    pub min_ts: i64,
    pub max_ts: i64,
    pub level_mask: u8,
    pub ts: &'a [u8],
    pub levels: &'a [u8],
    pub module_idx: &'a [u8],
    pub text: &'a [u8],
    pub text_ends: &'a [u8],
    pub meta: &'a [u8],
    pub meta_ends: &'a [u8],
}

/// Read access to a chunk's columns, shared by [`LogChunk`] and [`LogChunkView`]: what a
/// query's filter and page need, whichever way the chunk was read.
pub trait Columns {
    fn cols(&self) -> Cols<'_>;
    /// Name of module `m` of the chunk.
    fn module_name(&self, m: u32) -> Option<&str>;
    /// Index of the module called `name` in the chunk, if it has one.
    fn module_index(&self, name: &str) -> Option<u32>;

    fn len(&self) -> usize {
        self.cols().levels.len()
    }
    fn is_empty(&self) -> bool {
        self.cols().levels.is_empty()
    }
    fn ts_at(&self, i: usize) -> Option<i64> {
        self.cols()
            .ts
            .get(i * 8..i * 8 + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(i64::from_le_bytes)
    }
    fn level_at(&self, i: usize) -> Option<u8> {
        self.cols().levels.get(i).copied()
    }
    fn module_at(&self, i: usize) -> Option<u32> {
        u32_at(self.cols().module_idx, i)
    }
    fn text_end(&self, i: usize) -> Option<usize> {
        u32_at(self.cols().text_ends, i).map(|v| v as usize)
    }
    fn meta_end(&self, i: usize) -> Option<usize> {
        u32_at(self.cols().meta_ends, i).map(|v| v as usize)
    }
    /// Entry `i`'s message.
    fn message(&self, i: usize) -> Option<&str> {
        let start = if i == 0 { 0 } else { self.text_end(i - 1)? };
        std::str::from_utf8(self.cols().text.get(start..self.text_end(i)?)?).ok()
    }
    /// Entry `i`'s metadata JSON.
    fn metadata(&self, i: usize) -> Option<&[u8]> {
        let start = if i == 0 { 0 } else { self.meta_end(i - 1)? };
        self.cols().meta.get(start..self.meta_end(i)?)
    }
    /// The entry whose message holds text byte `at`, known to be `from` or later: a search
    /// walks a chunk's hits in order, so it gallops forward from the last hit's entry (a
    /// frequent term's hits are a few entries apart) rather than bisecting the whole chunk
    /// for each (the bisection was 40 % of a frequent-term query's filter time).
    fn entry_at_text(&self, at: usize, from: usize) -> usize {
        let ends_by = |i: usize| self.text_end(i).unwrap_or(usize::MAX) <= at;
        debug_assert!(
            from == 0 || from > self.len() || ends_by(from - 1),
            "entry_at_text: the entry before `from` must end by `at`"
        );
        let (mut lo, mut step) = (from.min(self.len()), 1);
        // Widen [lo, hi) until entry `hi` ends after `at` (or the chunk ends).
        let mut hi = lo;
        while hi < self.len() && ends_by(hi) {
            lo = hi + 1;
            hi = hi.saturating_add(step).min(self.len());
            step = step.saturating_mul(2);
        }
        let mut hi = hi.min(self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.text_end(mid).unwrap_or(usize::MAX) <= at {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

impl Columns for LogChunk {
    fn cols(&self) -> Cols<'_> {
        Cols {
            min_ts: self.min_ts,
            max_ts: self.max_ts,
            level_mask: self.level_mask,
            ts: &self.ts,
            levels: &self.levels,
            module_idx: &self.module_idx,
            text: self.text.as_bytes(),
            text_ends: &self.text_ends,
            meta: &self.meta,
            meta_ends: &self.meta_ends,
        }
    }
    fn module_name(&self, m: u32) -> Option<&str> {
        self.modules.get(m as usize).map(String::as_str)
    }
    fn module_index(&self, name: &str) -> Option<u32> {
        let i = self.modules.iter().position(|x| x == name)?;
        u32::try_from(i).ok()
    }
    /// A decoded chunk's text is a `String` already: no second UTF-8 check.
    fn message(&self, i: usize) -> Option<&str> {
        let start = if i == 0 { 0 } else { self.text_end(i - 1)? };
        self.text.get(start..self.text_end(i)?)
    }
}

impl Columns for LogChunkView<'_> {
    fn cols(&self) -> Cols<'_> {
        Cols {
            min_ts: self.min_ts,
            max_ts: self.max_ts,
            level_mask: self.level_mask,
            ts: self.ts,
            levels: self.levels,
            module_idx: self.module_idx,
            text: self.text,
            text_ends: self.text_ends,
            meta: self.meta,
            meta_ends: self.meta_ends,
        }
    }
    fn module_name(&self, m: u32) -> Option<&str> {
        self.modules.get(m as usize).copied()
    }
    fn module_index(&self, name: &str) -> Option<u32> {
        let i = self.modules.iter().position(|x| *x == name)?;
        u32::try_from(i).ok()
    }
}

impl LogChunk {
    /// The chunk as bytes, as the store keeps it (to send it to another server).
    pub fn to_bytes(&self) -> crate::Result<Vec<u8>> {
        crate::codec::encode(self)
    }

    /// A chunk from [`LogChunk::to_bytes`]; bytes from elsewhere are checked as any stored
    /// chunk is.
    pub fn from_bytes(bytes: &[u8]) -> crate::Result<Self> {
        crate::codec::decode(bytes)
    }

    /// Appends one entry's columns (texts already validated by the caller).
    pub fn push(
        &mut self,
        ts: i64,
        level: u8,
        module: u32,
        message: &str,
        meta: &[u8],
    ) -> Option<()> {
        self.min_ts = if self.is_empty() {
            ts
        } else {
            self.min_ts.min(ts)
        };
        self.max_ts = if self.is_empty() {
            ts
        } else {
            self.max_ts.max(ts)
        };
        self.level_mask |= 1 << level;
        self.ts.extend_from_slice(&ts.to_le_bytes());
        self.levels.push(level);
        self.module_idx.extend_from_slice(&module.to_le_bytes());
        self.text.push_str(message);
        self.text_ends
            .extend_from_slice(&u32::try_from(self.text.len()).ok()?.to_le_bytes());
        self.meta.extend_from_slice(meta);
        self.meta_ends
            .extend_from_slice(&u32::try_from(self.meta.len()).ok()?.to_le_bytes());
        Some(())
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

/// What capsules and configurations share: the uploaded file, where it is, and its verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadState {
    pub file_format: String,
    /// Bytes actually uploaded (`None` until the upload).
    pub uploaded_bytes: Option<u64>,
    /// Computed by the server at confirm.
    pub checksum_sha256: Option<String>,
    pub validation_status: ValidationStatus,
    pub validation_notes: String,
    /// Built from ids (and, once sealed, the content's SHA-256).
    pub blob_key: String,
    /// Unix milliseconds after which an unconfirmed upload link no longer works.
    pub upload_expires_at: i64,
    pub confirmed: bool,
}

impl UploadState {
    /// A file announced at `upload-url`: nothing uploaded yet, validation pending.
    pub fn pending(file_format: String, upload_expires_at: i64) -> Self {
        Self {
            file_format,
            uploaded_bytes: None,
            checksum_sha256: None,
            validation_status: ValidationStatus::Pending,
            validation_notes: String::new(),
            blob_key: String::new(),
            upload_expires_at,
            confirmed: false,
        }
    }
}

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

/// An accepted (correctly signed, first-seen) inbound webhook delivery; its payload is kept
/// apart (`Store::payload`) so outcome updates never rewrite it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    /// Arrival order (the processing order).
    pub seq: u64,
    /// The host's delivery UUID, lower-case.
    pub delivery_id: String,
    pub event: String,
    pub action: Option<String>,
    pub received_at: i64,
    pub status_code: u16,
    pub outcome: DeliveryOutcome,
    pub reason: Option<String>,
    pub installation_id: Option<u64>,
    pub repository: Option<String>,
    pub project_id: Option<u64>,
    pub test_run_id: Option<u64>,
    pub payload_len: u64,
    /// Where the payload is in the payload log (subscribed events only).
    pub payload_at: Option<(u64, u64)>,
}

impl Delivery {
    /// A delivery as the intake accepts it: `queued` for the worker when `subscribed`, else
    /// `ignored` (`event_ignored`); its payload is placed by `Store::claim_deliveries`.
    pub fn received(
        seq: u64,
        delivery_id: String,
        event: String,
        received_at: i64,
        subscribed: bool,
        payload_len: u64,
    ) -> Self {
        Self {
            seq,
            delivery_id,
            event,
            action: None,
            received_at,
            status_code: 202,
            outcome: if subscribed {
                DeliveryOutcome::Queued
            } else {
                DeliveryOutcome::Ignored
            },
            reason: (!subscribed).then(|| "event_ignored".into()),
            installation_id: None,
            repository: None,
            project_id: None,
            test_run_id: None,
            payload_len,
            payload_at: None,
        }
    }
}

/// A source-host installation (the host's app installed on an account).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Installation {
    pub id: u64,
    pub account_login: String,
    pub account_type: String,
    pub repository_selection: String,
    pub state: InstallationState,
    /// Repositories it holds now (full names as the host spells them).
    pub repositories: Vec<String>,
    /// Repositories removed from it (history).
    pub removed: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The organization an installation is bound to: its deliveries resolve only to links of
/// that organization's projects. Kept beside the installation record (whose layout predates
/// it), written by the installation's actor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallationBinding {
    /// `None` while unbound (its deliveries are skipped `installation_unbound`).
    pub organization_id: Option<u64>,
    /// Organizations it was moved away from (newest last, at most 16): their links of its
    /// repositories show `disconnected` rather than `pending`.
    pub former: Vec<u64>,
}

impl InstallationBinding {
    /// At most this many former organizations are remembered.
    pub const FORMER_MAX: usize = 16;

    /// Binds to `org`, remembering the organization it leaves.
    pub fn bind(&mut self, org: u64) {
        if let Some(old) = self.organization_id.filter(|&o| o != org) {
            self.former.retain(|&o| o != old);
            self.former.push(old);
        }
        self.former.retain(|&o| o != org);
        if self.former.len() > Self::FORMER_MAX {
            let cut = self.former.len() - Self::FORMER_MAX;
            self.former.drain(..cut);
        }
        self.organization_id = Some(org);
    }
}

/// A repository linked to a project.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepoLink {
    pub id: u64,
    pub project_id: u64,
    pub full_name: String,
    pub branch_patterns: Vec<String>,
    pub include_drafts: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Which installation holds a repository, and whether it still does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepoHold {
    pub installation_id: u64,
    /// false once removed from the installation (the repository is then disconnected).
    pub current: bool,
}

/// A test run dispatched for a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRun {
    pub id: u64,
    pub project_id: u64,
    pub repository: String,
    pub commit_sha: String,
    /// The branch (pull request head, pushed branch, check suite or workflow branch).
    pub git_ref: String,
    /// pull_request, push, check_suite, workflow_run.
    pub event: String,
    pub pull_request_number: Option<u64>,
    pub status: RunStatus,
    pub attempt: u32,
    pub idempotency_key: String,
    pub delivery_id: Option<String>,
    pub summary: Option<String>,
    /// A JSON object (workflow run links), as JSON bytes.
    pub urls_json: Vec<u8>,
    pub lease_expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl TestRun {
    /// Whether the run holds its idempotency key (a cancelled run does not).
    pub fn holds_key(&self) -> bool {
        self.status != RunStatus::Cancelled
    }
    pub fn in_flight(&self) -> bool {
        matches!(self.status, RunStatus::Queued | RunStatus::Running)
    }
}

/// An alert integration of a project: where notifications go.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Integration {
    pub id: u64,
    pub project_id: u64,
    pub kind: crate::IntegrationType,
    pub name: String,
    pub enabled: bool,
    /// The config fields that are not secret, as a JSON object.
    pub config_json: Vec<u8>,
    /// The secret config fields as a JSON object, sealed with the data directory's
    /// secret-encryption key (nonce, ciphertext and tag); never stored in the clear.
    pub sealed_secrets: Vec<u8>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// An alert rule of a project.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AlertRule {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    /// The condition as the client sent it once validated, as a JSON object.
    pub condition_json: Vec<u8>,
    pub severity: crate::Severity,
    /// Sorted, unique; integrations of the same project.
    pub integration_ids: Vec<u64>,
    /// Sorted, unique; empty means every device of the project.
    pub device_group_ids: Vec<u64>,
    pub enabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The deployment package most recently activated for a device, named by an alert that
/// fired soon after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RelatedDeployment {
    pub id: u64,
    pub name: String,
    pub activated_at: i64,
}

/// One firing (and later resolution) of a rule for a device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Alert {
    pub id: u64,
    pub project_id: u64,
    pub rule_id: u64,
    pub rule_name: String,
    pub severity: crate::Severity,
    pub state: crate::AlertState,
    pub device_id: u64,
    pub summary: String,
    pub fired_at: i64,
    pub resolved_at: Option<i64>,
    /// Pairs an incident's trigger and resolve.
    pub dedup_key: String,
    pub related_deployment: Option<RelatedDeployment>,
}

/// One notification of an alert to one integration, and its delivery so far.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    pub id: u64,
    pub project_id: u64,
    pub alert_id: u64,
    pub integration_id: u64,
    pub event: crate::AlertEvent,
    pub attempts: u32,
    /// `None` while delivery is still owed.
    pub success: Option<bool>,
    pub last_error: Option<String>,
    /// Unix milliseconds of the next attempt while owed.
    pub next_attempt_at: i64,
    pub created_at: i64,
}

/// The evaluator's durable state of one (rule, device): the condition has held since `since`;
/// `alert_id` once it fired. Absent when the condition does not hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConditionState {
    pub rule_id: u64,
    pub device_id: u64,
    pub since: i64,
    pub alert_id: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The galloping search finds, from every admissible start, the entry a bisection of the
    /// whole chunk finds, for every byte of the text and one past it (empty messages too).
    #[test]
    fn entry_at_text_gallops_to_the_bisected_entry() {
        let lens = [0usize, 3, 1, 0, 0, 7, 2, 0, 11, 1, 1, 1, 5, 0];
        let mut ends = Vec::new();
        let mut end = 0u32;
        for l in lens {
            end += l as u32;
            ends.extend_from_slice(&end.to_le_bytes());
        }
        let c = LogChunk {
            levels: vec![0; lens.len()],
            text: "x".repeat(end as usize),
            text_ends: ends,
            ..Default::default()
        };
        let bisect = |at: usize| {
            (0..c.len())
                .find(|&i| c.text_end(i).is_some_and(|e| e > at))
                .unwrap_or(c.len())
        };
        for at in 0..=end as usize + 1 {
            let want = bisect(at);
            for from in 0..=want {
                assert_eq!(c.entry_at_text(at, from), want, "at {at} from {from}");
            }
        }
    }
}
