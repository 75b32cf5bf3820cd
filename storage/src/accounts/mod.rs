//! Users, organizations, memberships, projects and API keys.
//!
//! Uniqueness (email, slugs) is enforced by the single writer that calls these functions;
//! each write here is one atomic batch of the record and its index entries.

pub mod records;

use std::sync::Arc;

use crate::{ApiKey, Membership, Organization, Project, Result, Role, Store, User, Writes, keys};

/// Which id sequence to draw from.
#[derive(Debug, Clone, Copy)]
pub enum Seq {
    User,
    Org,
    Project,
    ApiKey,
    Device,
    Group,
    Session,
    Capsule,
    Configuration,
    Deployment,
    Delivery,
    Repository,
    TestRun,
    Integration,
    AlertRule,
    Alert,
    Notification,
    EnrollmentToken,
}

impl Seq {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Seq::User => "user",
            Seq::EnrollmentToken => "enrollment_token",
            Seq::Org => "org",
            Seq::Project => "project",
            Seq::ApiKey => "api_key",
            Seq::Device => "device",
            Seq::Group => "group",
            Seq::Session => "session",
            Seq::Capsule => "capsule",
            Seq::Configuration => "configuration",
            Seq::Deployment => "deployment",
            Seq::Delivery => "delivery",
            Seq::Repository => "repository",
            Seq::TestRun => "test_run",
            Seq::Integration => "integration",
            Seq::AlertRule => "alert_rule",
            Seq::Alert => "alert",
            Seq::Notification => "notification",
        }
    }
}

impl Store {
    pub fn new_id(&self, seq: Seq) -> Result<u64> {
        self.next_id(seq.name())
    }

    /// `n` consecutive new ids in one counter update; returns the first.
    pub fn new_ids(&self, seq: Seq, n: u64) -> Result<u64> {
        self.next_ids(seq.name(), n)
    }

    /// The last id `seq` handed out (0 before the first).
    pub(crate) fn current_id(&self, seq: Seq) -> Result<u64> {
        Ok(self
            .inner
            .seq
            .get(seq.name().as_bytes())?
            .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0))
    }

    /// Moves `seq` to at least `at`, so the next id is above it.
    pub(crate) fn raise_ids(&self, seq: Seq, at: u64) -> Result<()> {
        self.inner
            .seq
            .update_and_fetch(seq.name().as_bytes(), |old| {
                let cur = old
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .unwrap_or(0);
                Some(cur.max(at).to_be_bytes().to_vec())
            })?;
        Ok(())
    }

    // ---- users ----

    pub fn user(&self, id: u64) -> Result<Option<Arc<User>>> {
        let c = &self.inner.cache.users;
        let g = c.generation();
        if let Some(u) = c.get(&id) {
            return Ok(Some(u.clone()));
        }
        let u: Option<Arc<User>> = self.get::<User>(&keys::user(id))?.map(Arc::new);
        if let Some(u) = &u {
            c.put(g, id, u.clone());
        }
        Ok(u)
    }

    pub fn user_by_email(&self, email: &str) -> Result<Option<Arc<User>>> {
        match self.get_id(&keys::user_by_email(email))? {
            Some(id) => self.user(id),
            None => Ok(None),
        }
    }

    pub fn any_user_exists(&self) -> Result<bool> {
        Ok(self
            .inner
            .records
            .scan_prefix(keys::user_prefix())
            .next()
            .transpose()?
            .is_some())
    }

    pub fn insert_user(&self, user: &User) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::user(user.id), user)?;
        w.claim_id(
            keys::user_by_email(&user.email),
            user.id,
            "A user with this email already exists",
        );
        self.inner.cache.users.forget(&user.id);
        self.apply(w)?;
        self.inner.cache.users.forget(&user.id);
        Ok(())
    }

    // ---- signed-out sign-ins ----

    /// Records that the sign-in `sign_in` of `user` was signed out: no token descending from
    /// it is believed again. Kept until `until_ms`, past which none could be valid anyway.
    pub fn sign_out(&self, user: u64, sign_in: &str, until_ms: i64) -> Result<()> {
        let mut w = Writes::new();
        w.0.insert(
            keys::signed_out(user, sign_in),
            until_ms.to_be_bytes().to_vec(),
        );
        self.apply(w)
    }

    /// Whether the sign-in `sign_in` of `user` was signed out (one point read).
    pub fn is_signed_out(&self, user: u64, sign_in: &str) -> Result<bool> {
        self.inner
            .records
            .contains_key(keys::signed_out(user, sign_in))
    }

    /// Forgets sign-outs whose tokens have all expired by `now_ms`; how many.
    pub fn prune_sign_outs(&self, now_ms: i64) -> Result<usize> {
        let mut w = Writes::new();
        let mut n = 0;
        for kv in self.inner.records.scan_prefix(keys::signed_out_prefix()) {
            let (k, v) = kv?;
            let until = <[u8; 8]>::try_from(v.as_ref())
                .map(i64::from_be_bytes)
                .unwrap_or(0);
            if until <= now_ms {
                w.delete(k.to_vec());
                n += 1;
            }
        }
        if n > 0 {
            self.apply(w)?;
        }
        Ok(n)
    }

    // ---- organizations ----

    pub fn org(&self, id: u64) -> Result<Option<Organization>> {
        self.get(&keys::org(id))
    }

    pub fn org_by_slug(&self, slug: &str) -> Result<Option<Arc<Organization>>> {
        let c = &self.inner.cache.orgs_by_slug;
        let g = c.generation();
        if let Some(o) = c.get(slug) {
            return Ok(Some(o.clone()));
        }
        let o = match self.get_id(&keys::org_by_slug(slug))? {
            Some(id) => self.org(id)?.map(Arc::new),
            None => None,
        };
        if let Some(o) = &o {
            c.put(g, slug.to_string(), o.clone());
        }
        Ok(o)
    }

    /// Creates the organization with its first owner in one batch.
    pub fn insert_org(&self, org: &Organization, owner: &Membership) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::org(org.id), org)?;
        w.claim_id(
            keys::org_by_slug(&org.slug),
            org.id,
            "An organization with this slug already exists",
        );
        put_membership(&mut w, owner)?;
        self.forget_org(org, owner);
        self.apply(w)?;
        self.forget_org(org, owner);
        Ok(())
    }

    /// Replaces an organization's record (its name or tier; the slug does not change).
    pub fn update_org(&self, org: &Organization) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::org(org.id), org)?;
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        self.apply(w)?;
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        Ok(())
    }

    fn forget_org(&self, org: &Organization, owner: &Membership) {
        self.inner.cache.orgs_by_slug.forget(&org.slug);
        self.inner
            .cache
            .members
            .forget(&(owner.org_id, owner.user_id));
    }

    pub fn membership(&self, org: u64, user: u64) -> Result<Option<Arc<Membership>>> {
        let c = &self.inner.cache.members;
        let g = c.generation();
        if let Some(m) = c.get(&(org, user)) {
            return Ok(Some(m.clone()));
        }
        let m: Option<Arc<Membership>> = self
            .get::<Membership>(&keys::member(org, user))?
            .map(Arc::new);
        if let Some(m) = &m {
            c.put(g, (org, user), m.clone());
        }
        Ok(m)
    }

    pub fn upsert_membership(&self, m: &Membership) -> Result<()> {
        let mut w = Writes::new();
        put_membership(&mut w, m)?;
        let k = (m.org_id, m.user_id);
        self.inner.cache.members.forget(&k);
        self.apply(w)?;
        self.inner.cache.members.forget(&k);
        Ok(())
    }

    /// The organizations a user belongs to, with the user's role, in creation order.
    pub fn user_orgs(&self, user: u64) -> Result<Vec<(Organization, Role)>> {
        let mut out = Vec::new();
        for k in self.scan_keys(&keys::user_org_prefix(user))? {
            let Some(org_id) = keys::trailing_id(&k) else {
                continue;
            };
            if let (Some(org), Some(m)) = (self.org(org_id)?, self.membership(org_id, user)?) {
                out.push((org, m.role));
            }
        }
        Ok(out)
    }

    /// The service's organization when it has exactly one.
    pub fn sole_org(&self) -> Result<Option<u64>> {
        let ids = self.first_org_ids(2)?;
        Ok(if ids.len() == 1 {
            ids.first().copied()
        } else {
            None
        })
    }

    /// The ids of the first `n` organizations (in creation order).
    pub fn first_org_ids(&self, n: usize) -> Result<Vec<u64>> {
        let prefix = &keys::org(0)[..keys::org(0).len() - 8];
        let mut out = Vec::new();
        for k in self.inner.records.scan_prefix(prefix).keys().take(n) {
            out.extend(keys::trailing_id(&k?));
        }
        Ok(out)
    }

    /// Every organization (for superusers), in creation order.
    pub fn all_orgs(&self) -> Result<Vec<Organization>> {
        let mut v: Vec<Organization> = self.scan_rev(&keys::org(0)[..keys::org(0).len() - 8])?;
        v.reverse();
        Ok(v)
    }

    pub fn org_members(&self, org: u64) -> Result<Vec<Membership>> {
        let mut v: Vec<Membership> = self.scan_rev(&keys::member_prefix(org))?;
        v.reverse();
        Ok(v)
    }

    // ---- projects ----

    /// The organization of project `id` (0 when the project is gone: its tenant's share is
    /// then one no live organization holds).
    pub fn org_of_project(&self, id: u64) -> Result<u64> {
        Ok(self.project(id)?.map_or(0, |p| p.org_id))
    }

    pub fn project(&self, id: u64) -> Result<Option<Project>> {
        self.get(&keys::project(id))
    }

    pub fn project_by_slug(&self, org: u64, slug: &str) -> Result<Option<Arc<Project>>> {
        let c = &self.inner.cache.projects_by_slug;
        let g = c.generation();
        let k = (org, slug.to_string());
        if let Some(p) = c.get(&k) {
            return Ok(Some(p.clone()));
        }
        let p = match self.get_id(&keys::project_by_slug(org, slug))? {
            Some(id) => self.project(id)?.map(Arc::new),
            None => None,
        };
        if let Some(p) = &p {
            c.put(g, k, p.clone());
        }
        Ok(p)
    }

    pub fn insert_project(&self, p: &Project) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::project(p.id), p)?;
        w.claim_id(
            keys::project_by_slug(p.org_id, &p.slug),
            p.id,
            "A project with this slug already exists",
        );
        w.put_id(keys::org_project(p.org_id, p.id), p.id);
        self.write_project(p, w)
    }

    /// Replaces a project record whose slug did not change (secret rotation).
    pub fn update_project(&self, p: &Project) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::project(p.id), p)?;
        self.write_project(p, w)
    }

    fn write_project(&self, p: &Project, w: Writes) -> Result<()> {
        let k = (p.org_id, p.slug.clone());
        self.inner.cache.projects_by_slug.forget(&k);
        self.apply(w)?;
        self.inner.cache.projects_by_slug.forget(&k);
        Ok(())
    }

    /// Projects of an organization, newest first.
    pub fn org_projects(&self, org: u64) -> Result<Vec<Project>> {
        let mut out = Vec::new();
        for k in self.scan_keys(&keys::org_project_prefix(org))?.iter().rev() {
            if let Some(p) = keys::trailing_id(k)
                .map(|id| self.project(id))
                .transpose()?
            {
                out.extend(p);
            }
        }
        Ok(out)
    }

    // ---- API keys ----

    pub fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<Arc<ApiKey>>> {
        let c = &self.inner.cache.keys_by_hash;
        let g = c.generation();
        if let Some(k) = c.get(hash) {
            return Ok(Some(k.clone()));
        }
        let k: Option<Arc<ApiKey>> = match self.get_id(&keys::api_key_by_hash(hash))? {
            Some(id) => self.get::<ApiKey>(&keys::api_key(id))?.map(Arc::new),
            None => None,
        };
        if let Some(k) = &k {
            c.put(g, *hash, k.clone());
        }
        Ok(k)
    }

    pub fn api_key(&self, id: u64) -> Result<Option<ApiKey>> {
        self.get(&keys::api_key(id))
    }

    pub fn insert_api_key(&self, k: &ApiKey) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::api_key(k.id), k)?;
        w.put_id(keys::api_key_by_hash(&k.hash), k.id);
        w.put_id(keys::user_key(k.user_id, k.id), k.id);
        self.write_key(k, w)
    }

    fn write_key(&self, k: &ApiKey, w: Writes) -> Result<()> {
        self.inner.cache.keys_by_hash.forget(&k.hash);
        self.apply(w)?;
        self.inner.cache.keys_by_hash.forget(&k.hash);
        Ok(())
    }

    /// Rewrites a key record (last use); its hash and owner never change.
    pub fn update_api_key(&self, k: &ApiKey) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::api_key(k.id), k)?;
        self.write_key(k, w)
    }

    pub fn delete_api_key(&self, k: &ApiKey) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::api_key(k.id));
        w.delete(keys::api_key_by_hash(&k.hash));
        w.delete(keys::user_key(k.user_id, k.id));
        self.write_key(k, w)
    }

    /// A user's keys, newest first.
    pub fn user_api_keys(&self, user: u64) -> Result<Vec<ApiKey>> {
        let mut out = Vec::new();
        for k in self.scan_keys(&keys::user_key_prefix(user))?.iter().rev() {
            if let Some(id) = keys::trailing_id(k) {
                out.extend(self.api_key(id)?);
            }
        }
        Ok(out)
    }
}

fn put_membership(w: &mut Writes, m: &Membership) -> Result<()> {
    w.put(keys::member(m.org_id, m.user_id), m)?;
    w.put_id(keys::user_org(m.user_id, m.org_id), m.org_id);
    Ok(())
}
