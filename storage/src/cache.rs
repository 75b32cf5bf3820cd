//! Read-through caches of the records every authenticated request reads (users, API keys,
//! organizations, projects, memberships, a project's groups and capsules), shared as `Arc`s.
//!
//! Every write of these records passes through `Store` methods that call [`Cached::forget`]
//! before and after applying the batch. A reader that missed takes the generation before
//! reading the store and stores what it read only if no write was forgotten meanwhile, so a
//! slow reader can never put back a record older than a write that finished. Each map is
//! bounded: past `MAX` entries it is cleared.
//!
//! When several servers share one database, another server's writes are not seen here. Two
//! things keep the caches true then: every forget is announced (`Caches::on_forget`, which the
//! runtime sends over the bus) and another server's announcement clears every map here
//! (`Caches::clear`); and an entry is served for at most `max_age` after it was read, so a
//! revocation whose announcement the bus lost is still refused within that time.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::{ApiKey, Capsule, DeviceGroup, Membership, Organization, Project, User};

const MAX: usize = 100_000;

/// What every map of one store's caches shares.
#[derive(Default)]
pub(crate) struct Shared {
    /// How long an entry is served after it was read, in milliseconds; 0: until forgotten.
    max_age_ms: AtomicU64,
    /// Told of every forget (another server's caches must forget too).
    on_forget: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

pub(crate) struct Cached<K: Hash + Eq, V> {
    map: DashMap<K, (V, Instant)>,
    /// Bumped by every forget.
    generation: AtomicU64,
    shared: Arc<Shared>,
}

impl<K: Hash + Eq, V: Clone> Cached<K, V> {
    fn new(shared: Arc<Shared>) -> Self {
        Self {
            map: DashMap::new(),
            generation: AtomicU64::new(0),
            shared,
        }
    }
}

#[cfg(test)]
impl<K: Hash + Eq, V: Clone> Default for Cached<K, V> {
    fn default() -> Self {
        Self::new(Arc::default())
    }
}

impl<K: Hash + Eq, V: Clone> Cached<K, V> {
    pub fn get<Q>(&self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let max_age = self.shared.max_age_ms.load(Ordering::Relaxed);
        let e = self.map.get(k)?;
        if max_age > 0 && e.1.elapsed() > Duration::from_millis(max_age) {
            return None;
        }
        Some(e.0.clone())
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
            self.map.insert(k, (v, Instant::now()));
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
        if let Some(tell) = self.shared.on_forget.get() {
            tell();
        }
    }

    /// Forgets every entry (another server wrote something).
    fn clear(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.map.clear();
    }

    /// Forgets one entry another server may have written, telling no one.
    fn forget_quietly(&self, k: &K) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.map.remove(k);
    }
}

pub(crate) struct Caches {
    shared: Arc<Shared>,
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

impl Default for Caches {
    fn default() -> Self {
        let shared = Arc::<Shared>::default();
        Self {
            users: Cached::new(shared.clone()),
            keys_by_hash: Cached::new(shared.clone()),
            orgs_by_slug: Cached::new(shared.clone()),
            projects_by_slug: Cached::new(shared.clone()),
            members: Cached::new(shared.clone()),
            groups: Cached::new(shared.clone()),
            capsules: Cached::new(shared.clone()),
            shared,
        }
    }
}

impl Caches {
    /// Serves an entry for at most `max_age` after it was read (several servers on one
    /// database).
    pub fn set_max_age(&self, max_age: Duration) {
        let ms = u64::try_from(max_age.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.shared.max_age_ms.store(ms, Ordering::Relaxed);
    }

    /// Calls `tell` after every forget, from the writing thread (it must not block). Set once.
    pub fn on_forget(&self, tell: Box<dyn Fn() + Send + Sync>) {
        let _ = self.shared.on_forget.set(tell);
    }

    /// Forgets everything: another server wrote one of these records.
    pub fn clear(&self) {
        self.users.clear();
        self.keys_by_hash.clear();
        self.orgs_by_slug.clear();
        self.projects_by_slug.clear();
        self.members.clear();
        self.groups.clear();
        self.capsules.clear();
    }

    /// Forgets what is cached of project `pid`'s own records (its groups and capsules):
    /// another server wrote in the project.
    pub fn clear_project(&self, pid: u64) {
        self.groups.forget_quietly(&pid);
        self.capsules.forget_quietly(&pid);
    }
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

    #[test]
    fn an_entry_older_than_the_max_age_is_not_served() {
        let shared = Arc::<Shared>::default();
        shared.max_age_ms.store(30, Ordering::Relaxed);
        let c: Cached<u64, u64> = Cached::new(shared);
        c.put(c.generation(), 1, 10);
        assert_eq!(c.get(&1), Some(10));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(c.get(&1), None);
    }

    #[test]
    fn every_forget_is_announced_and_a_clear_forgets_everything() {
        let shared = Arc::<Shared>::default();
        let told = Arc::new(AtomicU64::new(0));
        let t = told.clone();
        let _ = shared.on_forget.set(Box::new(move || {
            t.fetch_add(1, Ordering::SeqCst);
        }));
        let c: Cached<u64, u64> = Cached::new(shared);
        c.put(c.generation(), 7, 70);
        c.put(c.generation(), 8, 80);
        c.forget(&8);
        assert_eq!(told.load(Ordering::SeqCst), 1);
        assert_eq!(c.get(&7), Some(70));
        let g = c.generation();
        c.clear();
        assert_eq!(c.get(&7), None);
        c.put(g, 7, 71);
        assert_eq!(
            c.get(&7),
            None,
            "a read from before the clear is not stored"
        );
        assert_eq!(
            told.load(Ordering::SeqCst),
            1,
            "a clear is not announced again"
        );
    }
}
