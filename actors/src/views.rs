//! Response shapes: what the handles return and `http` serializes as they are. Times are
//! already formatted (RFC 3339, milliseconds, `Z`).

use std::collections::BTreeMap;

use fleetops_storage::{ApiKey, Device, DeviceGroup, Organization, Project, User};
use serde::Serialize;

use crate::clock::fmt_ms;

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub total: usize,
    pub page: usize,
    pub page_size: usize,
    pub has_more: bool,
}

/// Page and page size (1-based page; page size 1..=500).
#[derive(Debug, Clone, Copy)]
pub struct PageReq {
    pub page: usize,
    pub page_size: usize,
}

impl Default for PageReq {
    fn default() -> Self {
        Self {
            page: 1,
            page_size: 50,
        }
    }
}

impl PageReq {
    pub const MAX_PAGE_SIZE: usize = 500;

    /// How many items come before this page.
    pub fn skip(&self) -> usize {
        (self.page - 1).saturating_mul(self.page_size)
    }

    /// This page's items, read from an index, and the count of all.
    pub fn of<T>(&self, items: Vec<T>, total: u64) -> Page<T> {
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        Page {
            items,
            total,
            page: self.page,
            page_size: self.page_size,
            has_more: self.page.saturating_mul(self.page_size) < total,
        }
    }

    pub fn slice<T>(&self, all: Vec<T>) -> Page<T> {
        let total = all.len();
        let start = (self.page - 1).saturating_mul(self.page_size);
        let items: Vec<T> = all.into_iter().skip(start).take(self.page_size).collect();
        Page {
            items,
            total,
            page: self.page,
            page_size: self.page_size,
            has_more: self.page.saturating_mul(self.page_size) < total,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Items<T> {
    pub items: Vec<T>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct UserView {
    pub id: u64,
    pub email: String,
    pub is_superuser: bool,
}

impl From<&User> for UserView {
    fn from(u: &User) -> Self {
        Self {
            id: u.id,
            email: u.email.clone(),
            is_superuser: u.is_superuser,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrgRole {
    pub slug: String,
    pub role: &'static str,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Me {
    pub id: u64,
    pub email: String,
    pub is_superuser: bool,
    pub organizations: Vec<OrgRole>,
}

/// Every organization of the service (the operator's list).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AllOrgs {
    pub items: Vec<OrgView>,
    /// Deleted organizations whose data is still being purged.
    pub being_purged: u64,
}

impl AllOrgs {
    /// The list of `orgs`, newest first (`id` breaking ties).
    pub fn of(orgs: &[Organization], being_purged: u64) -> Self {
        let mut items: Vec<OrgView> = orgs.iter().map(OrgView::from).collect();
        items.sort_by(|a, b| (&b.created_at, b.id).cmp(&(&a.created_at, a.id)));
        Self {
            items,
            being_purged,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrgView {
    pub id: u64,
    pub slug: String,
    pub name: String,
    pub tier: String,
    pub created_at: String,
}

impl From<&Organization> for OrgView {
    fn from(o: &Organization) -> Self {
        Self {
            id: o.id,
            slug: o.slug.clone(),
            name: o.name.clone(),
            tier: o.tier.clone(),
            created_at: fmt_ms(o.created_at),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct MemberView {
    pub user_id: u64,
    pub email: String,
    pub role: &'static str,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ProjectView {
    pub id: u64,
    pub slug: String,
    pub name: String,
    pub created_at: String,
    /// Only in the creation response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_secret: Option<String>,
}

impl ProjectView {
    pub fn new(p: &Project, secret: Option<String>) -> Self {
        Self {
            id: p.id,
            slug: p.slug.clone(),
            name: p.name.clone(),
            created_at: fmt_ms(p.created_at),
            project_secret: secret,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ProjectSecret {
    pub project_secret: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ApiKeyCreated {
    pub id: u64,
    pub name: String,
    pub key: String,
    pub created_at: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ApiKeyView {
    pub id: u64,
    pub name: String,
    pub prefix: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

impl From<&ApiKey> for ApiKeyView {
    fn from(k: &ApiKey) -> Self {
        Self {
            id: k.id,
            name: k.name.clone(),
            prefix: k.prefix.clone(),
            created_at: fmt_ms(k.created_at),
            last_used_at: k.last_used_at.map(fmt_ms),
        }
    }
}

/// An enrollment token; `token` only in the creation response (stored as its hash).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct EnrollmentTokenView {
    pub id: u64,
    pub name: String,
    pub single_use: bool,
    pub expires_at: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The keys a robot may set its own labels under.
    pub allowed_label_keys: Vec<String>,
    pub uses: u64,
    pub last_used_at: Option<String>,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl From<&fleetops_storage::devices::enrollment::EnrollmentToken> for EnrollmentTokenView {
    fn from(t: &fleetops_storage::devices::enrollment::EnrollmentToken) -> Self {
        Self {
            id: t.id,
            name: t.name.clone(),
            single_use: t.single_use,
            expires_at: t.expires_at.map(fmt_ms),
            labels: t.labels.clone(),
            allowed_label_keys: t.allowed_label_keys.clone(),
            uses: t.uses,
            last_used_at: t.last_used_at.map(fmt_ms),
            created_at: fmt_ms(t.created_at),
            token: None,
        }
    }
}

/// A robot enrolled: its device (with its token, shown once) and where it lives.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct EnrolledView {
    #[serde(flatten)]
    pub device: DeviceView,
    /// The organization's slug.
    pub organization: String,
    /// The project's slug.
    pub project_slug: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DeviceView {
    pub id: u64,
    pub name: String,
    pub status: &'static str,
    pub labels: BTreeMap<String, String>,
    pub group_ids: Vec<u64>,
    pub metrics: BTreeMap<String, f64>,
    pub created_at: String,
    pub last_seen_at: Option<String>,
    /// Only in the creation response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_token: Option<String>,
    /// Only in the organization-wide list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

impl DeviceView {
    pub fn new(d: &Device, status: &'static str, group_ids: Vec<u64>) -> Self {
        Self {
            id: d.id,
            name: d.name.clone(),
            status,
            labels: d.labels.clone(),
            group_ids,
            metrics: d.metrics.clone(),
            created_at: fmt_ms(d.created_at),
            last_seen_at: d.last_seen_at.map(fmt_ms),
            device_token: None,
            project: None,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct GroupView {
    pub id: u64,
    pub name: String,
    pub device_ids: Vec<u64>,
    pub created_at: String,
}

impl From<&DeviceGroup> for GroupView {
    fn from(g: &DeviceGroup) -> Self {
        Self {
            id: g.id,
            name: g.name.clone(),
            device_ids: g.device_ids.clone(),
            created_at: fmt_ms(g.created_at),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct HeartbeatAck {
    pub status: &'static str,
}

/// What bootstrap (the CLI command and the first start of `serve`) created.
#[derive(Debug, Clone, Serialize)]
pub struct Bootstrapped {
    pub user_id: u64,
    pub email: String,
    pub org: String,
    pub project: String,
    pub project_secret: String,
    pub api_key: String,
    /// Set only when the password was generated (first start); never part of the JSON.
    #[serde(skip)]
    pub generated_password: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SessionItem {
    pub id: u64,
    pub device_id: u64,
    pub device_name: String,
    pub status: &'static str,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub duration_seconds: i64,
    pub tags: Vec<String>,
    pub artifact_count: u64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SessionMetrics {
    pub log_count: u64,
    pub artifact_count: u64,
    pub artifact_size_bytes: u64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PackageRef {
    pub id: u64,
    pub name: String,
}

/// `GET/PATCH .../log-retention`: how long the project's ended sessions are kept.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LogRetentionView {
    /// The project's own setting in days (0: for good); null: the server's default.
    pub retention_days: Option<u32>,
    /// The server's default (`[logs] retention_days`; 0: for good).
    pub default_retention_days: u32,
    /// What applies: an ended session (with its logs and files) is deleted this many days
    /// after it ended; 0: kept for good.
    pub effective_retention_days: u32,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub item: SessionItem,
    pub metrics: SessionMetrics,
    pub package: Option<PackageRef>,
}

impl SessionItem {
    pub fn new(
        s: &fleetops_storage::Session,
        c: &fleetops_storage::SessionCounters,
        now: i64,
    ) -> Self {
        let end = s.ended_at.unwrap_or(now);
        Self {
            id: s.id,
            device_id: s.device_id,
            device_name: s.device_name.clone(),
            status: s.status.as_str(),
            started_at: fmt_ms(s.started_at),
            ended_at: s.ended_at.map(fmt_ms),
            duration_seconds: ((end - s.started_at).max(0)) / 1000,
            tags: s.tags.clone(),
            artifact_count: c.artifact_count,
        }
    }
}

impl SessionDetail {
    pub fn new(
        s: &fleetops_storage::Session,
        c: &fleetops_storage::SessionCounters,
        now: i64,
    ) -> Self {
        Self {
            item: SessionItem::new(s, c, now),
            metrics: SessionMetrics {
                log_count: c.log_count,
                artifact_count: c.artifact_count,
                artifact_size_bytes: c.artifact_size_bytes,
            },
            package: None,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ArtifactView {
    pub path: String,
    pub size_bytes: u64,
    pub content_type: String,
    pub created_at: String,
}

impl From<&fleetops_storage::Artifact> for ArtifactView {
    fn from(a: &fleetops_storage::Artifact) -> Self {
        Self {
            path: a.path.clone(),
            size_bytes: a.size_bytes,
            content_type: a.content_type.clone(),
            created_at: fmt_ms(a.created_at),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
#[schemars(rename = "LogsAccepted")]
pub struct Accepted {
    pub accepted: usize,
    /// A numbered batch the session had already stored: nothing was stored again.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LogPage {
    pub items: Vec<crate::logs::LogEntryView>,
    pub total: usize,
}

/// Stored JSON bytes as a raw value (`fallback` if they were somehow not JSON).
pub(crate) fn raw_json(bytes: &[u8], fallback: &'static str) -> Box<serde_json::value::RawValue> {
    use serde_json::value::RawValue;
    serde_json::from_slice::<&RawValue>(bytes)
        .map(|r| r.to_owned())
        .or_else(|_| RawValue::from_string(fallback.to_string()))
        .unwrap_or_default()
}
