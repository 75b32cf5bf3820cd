//! Read-through caches of the records every authenticated request reads (users, API keys,
//! organizations, projects, memberships).
//!
//! This process is the only writer of its sled database, and every write of these records
//! passes through `Store` methods that drop the cached copy before and after applying the
//! batch, so a cached record is never older than what a reader that started after the write
//! would see. Each map is bounded: past `MAX` entries it is cleared.

use dashmap::DashMap;

use crate::{ApiKey, Membership, Organization, Project, User};

const MAX: usize = 100_000;

#[derive(Default)]
pub(crate) struct Caches {
    pub users: DashMap<u64, User>,
    pub keys_by_hash: DashMap<[u8; 32], ApiKey>,
    pub orgs_by_slug: DashMap<String, Organization>,
    pub projects_by_slug: DashMap<(u64, String), Project>,
    pub members: DashMap<(u64, u64), Membership>,
}

pub(crate) fn put<K: std::hash::Hash + Eq, V>(map: &DashMap<K, V>, k: K, v: V) {
    if map.len() >= MAX {
        map.clear();
    }
    map.insert(k, v);
}
