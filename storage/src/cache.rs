//! Read-through caches of the records every authenticated request reads (users, API keys,
//! organizations, projects, memberships, a project's groups), shared as `Arc`s.
//!
//! This process is the only writer of its sled database, and every write of these records
//! passes through `Store` methods that drop the cached copy before and after applying the
//! batch, so a cached record is never older than what a reader that started after the write
//! would see. Each map is bounded: past `MAX` entries it is cleared.

use std::sync::Arc;

use dashmap::DashMap;

use crate::{ApiKey, Capsule, DeviceGroup, Membership, Organization, Project, User};

const MAX: usize = 100_000;

#[derive(Default)]
pub(crate) struct Caches {
    pub users: DashMap<u64, Arc<User>>,
    pub keys_by_hash: DashMap<[u8; 32], Arc<ApiKey>>,
    pub orgs_by_slug: DashMap<String, Arc<Organization>>,
    pub projects_by_slug: DashMap<(u64, String), Arc<Project>>,
    pub members: DashMap<(u64, u64), Arc<Membership>>,
    /// A project's groups, newest first (device reads show each device's groups).
    pub groups: DashMap<u64, Arc<Vec<DeviceGroup>>>,
    /// A project's capsules, newest first (lists, quotas and `is_latest` read them all).
    pub capsules: DashMap<u64, Arc<Vec<Capsule>>>,
}

pub(crate) fn put<K: std::hash::Hash + Eq, V>(map: &DashMap<K, V>, k: K, v: V) {
    if map.len() >= MAX {
        map.clear();
    }
    map.insert(k, v);
}
