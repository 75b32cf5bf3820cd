//! Read-through caches of the records every authenticated request reads (users, API keys,
//! organizations, projects, memberships, a project's groups and capsules), shared as `Arc`s.
//!
//! This process is the only writer of its sled database, and every write of these records
//! passes through `Store` methods that call [`Cached::forget`] before and after applying the
//! batch. A reader that missed takes the generation before reading sled and stores what it
//! read only if no write was forgotten meanwhile, so a slow reader can never put back a record
//! older than a write that finished. Each map is bounded: past `MAX` entries it is cleared.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::{ApiKey, Capsule, DeviceGroup, Membership, Organization, Project, User};

const MAX: usize = 100_000;

pub(crate) struct Cached<K: Hash + Eq, V> {
    map: DashMap<K, V>,
    /// Bumped by every forget.
    generation: AtomicU64,
}

impl<K: Hash + Eq, V: Clone> Default for Cached<K, V> {
    fn default() -> Self {
        Self {
            map: DashMap::new(),
            generation: AtomicU64::new(0),
        }
    }
}

impl<K: Hash + Eq, V: Clone> Cached<K, V> {
    pub fn get<Q>(&self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(k).map(|v| v.clone())
    }

    /// Take before reading sled on a miss.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Stores what a reader read, unless a write was forgotten since `generation`.
    pub fn put(&self, generation: u64, k: K, v: V) {
        if self.map.len() >= MAX {
            self.map.clear();
        }
        if self.generation() == generation {
            self.map.insert(k, v);
            // A forget may have slipped in between the check and the insert.
            if self.generation() != generation {
                self.map.clear();
            }
        }
    }

    pub fn forget<Q>(&self, k: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.map.remove(k);
    }
}

#[derive(Default)]
pub(crate) struct Caches {
    pub users: Cached<u64, Arc<User>>,
    pub keys_by_hash: Cached<[u8; 32], Arc<ApiKey>>,
    pub orgs_by_slug: Cached<String, Arc<Organization>>,
    pub projects_by_slug: Cached<(u64, String), Arc<Project>>,
    pub members: Cached<(u64, u64), Arc<Membership>>,
    /// A project's groups, newest first (device reads show each device's groups).
    pub groups: Cached<u64, Arc<Vec<DeviceGroup>>>,
    /// A project's capsules, newest first (lists, quotas and `is_latest` read them all).
    pub capsules: Cached<u64, Arc<Vec<Arc<Capsule>>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_raced_a_write_is_not_stored() {
        let c: Cached<u64, u64> = Cached::default();
        let g = c.generation();
        c.forget(&1); // a write finished while the reader was reading
        c.put(g, 1, 10);
        assert_eq!(c.get(&1), None);
        let g = c.generation();
        c.put(g, 1, 11);
        assert_eq!(c.get(&1), Some(11));
        c.forget(&1);
        assert_eq!(c.get(&1), None);
    }
}
