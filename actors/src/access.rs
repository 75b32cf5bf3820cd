//! Who may do what: organization membership and the minimum role of each operation, resolved
//! to a scope the handles take, and the tier whose rate limit applies to a caller. Reads only,
//! through the store's read-through caches of organizations, projects and memberships.
//!
//! Rules: a superuser has owner rights everywhere; an organization the caller
//! is not a member of is 403 whether it exists or not (a superuser gets 404 for a missing
//! one); another project's resources are 404; device tokens reach only their own device's
//! ingestion routes and the device update API, which takes nothing else (a user's JWT or API
//! key there is 403).
//!
//! Tested through the API (`tests/api/accounts/`: every role, another organization, the
//! superuser; and each resource family's own tenancy checks).

use std::sync::Arc;

use fleetops_storage::{Organization, Project, Role, Store};

use crate::auth::{Credential, Principal};
use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct OrgScope {
    pub org: Arc<Organization>,
    /// The caller's effective role (owner for superusers).
    pub role: Role,
}

#[derive(Debug, Clone)]
pub struct ProjectScope {
    pub org: Arc<Organization>,
    pub project: Arc<Project>,
    pub role: Role,
}

#[derive(Clone)]
pub struct Access {
    pub(crate) store: Store,
    /// Tier names from best to worst, for "the best tier the user has".
    pub(crate) tier_rank: Arc<Vec<String>>,
}

impl Access {
    /// The tier whose limit applies to this caller on a route naming `org_slug` (if any), and
    /// the organization id that scopes its bucket (0 when the path names none that exists):
    /// the organization's own tier when it exists, else the best tier among the caller's
    /// organizations.
    pub fn tier_for(&self, p: &Principal, org_slug: Option<&str>) -> Result<(String, u64)> {
        if let Some(slug) = org_slug
            && let Some(org) = self.store.org_by_slug(slug)?
        {
            return Ok((org.tier.clone(), org.id));
        }
        if let Credential::Device { project_id, .. } = p.credential
            && let Some(pr) = self.store.project(project_id)?
            && let Some(org) = self.store.org(pr.org_id)?
        {
            return Ok((org.tier, org.id));
        }
        let tiers: Vec<String> = match &p.user {
            Some(u) => self
                .store
                .user_orgs(u.id)?
                .into_iter()
                .map(|(o, _)| o.tier)
                .collect(),
            None => Vec::new(),
        };
        let best = self
            .tier_rank
            .iter()
            .find(|t| tiers.contains(t))
            .or(self.tier_rank.last())
            .cloned()
            .unwrap_or_else(|| "free".into());
        Ok((best, 0))
    }

    /// The caller's scope in an organization, requiring at least `min`.
    pub fn org(&self, p: &Principal, slug: &str, min: Role) -> Result<OrgScope> {
        let Some(user) = &p.user else {
            return Err(Error::Forbidden);
        };
        let org = self.store.org_by_slug(slug)?;
        if user.is_superuser {
            let org = org.ok_or_else(|| Error::not_found("Organization"))?;
            return Ok(OrgScope {
                org,
                role: Role::Owner,
            });
        }
        let org = org.ok_or(Error::Forbidden)?;
        let role = self
            .store
            .membership(org.id, user.id)?
            .map(|m| m.role)
            .ok_or(Error::Forbidden)?;
        if role < min {
            return Err(Error::Forbidden);
        }
        Ok(OrgScope { org, role })
    }

    /// The caller's scope in a project, requiring at least `min` in its organization.
    pub fn project(
        &self,
        p: &Principal,
        org: &str,
        project: &str,
        min: Role,
    ) -> Result<ProjectScope> {
        let s = self.org(p, org, min)?;
        let project = self
            .store
            .project_by_slug(s.org.id, project)?
            .ok_or_else(|| Error::not_found("Project"))?;
        Ok(ProjectScope {
            org: s.org,
            project,
            role: s.role,
        })
    }

    /// A device ingestion route: the device's own token, or a user with `min`.
    pub fn device_route(
        &self,
        p: &Principal,
        org: &str,
        project: &str,
        device_id: u64,
        min: Role,
    ) -> Result<ProjectScope> {
        let Credential::Device {
            project_id,
            device_id: own,
        } = p.credential
        else {
            return self.project(p, org, project, min);
        };
        let o = self.store.org_by_slug(org)?.ok_or(Error::Forbidden)?;
        let pr = self
            .store
            .project_by_slug(o.id, project)?
            .ok_or(Error::Forbidden)?;
        if pr.id != project_id || own != device_id {
            return Err(Error::Forbidden);
        }
        Ok(ProjectScope {
            org: o,
            project: pr,
            role: Role::Member,
        })
    }

    /// The scope of a device ingestion route whose device is known only later (sessions):
    /// a user needs `min`; a device token must belong to this project (403 otherwise) and is
    /// then checked against the device with [`Access::check_device`].
    pub fn ingestion(
        &self,
        p: &Principal,
        org: &str,
        project: &str,
        min: Role,
    ) -> Result<ProjectScope> {
        let Credential::Device { project_id, .. } = p.credential else {
            return self.project(p, org, project, min);
        };
        let o = self.store.org_by_slug(org)?.ok_or(Error::Forbidden)?;
        let pr = self
            .store
            .project_by_slug(o.id, project)?
            .ok_or(Error::Forbidden)?;
        if pr.id != project_id {
            return Err(Error::Forbidden);
        }
        Ok(ProjectScope {
            org: o,
            project: pr,
            role: Role::Member,
        })
    }

    /// The device API: the device's own token only (a user's JWT or API key is 403);
    /// returns its project and device.
    pub fn require_device(&self, p: &Principal) -> Result<(u64, u64)> {
        match p.credential {
            Credential::Device {
                project_id,
                device_id,
            } => Ok((project_id, device_id)),
            _ => Err(Error::Forbidden),
        }
    }

    /// A device token may act only for its own device.
    pub fn check_device(&self, p: &Principal, device_id: u64) -> Result<()> {
        match p.credential {
            Credential::Device { device_id: own, .. } if own != device_id => Err(Error::Forbidden),
            _ => Ok(()),
        }
    }

    /// A JWT is required (API keys and device tokens get 403).
    pub fn require_jwt(&self, p: &Principal) -> Result<()> {
        match p.credential {
            Credential::Jwt { .. } => Ok(()),
            _ => Err(Error::Forbidden),
        }
    }

    /// A user (JWT or API key), not a device.
    pub fn require_user(&self, p: &Principal) -> Result<Arc<fleetops_storage::User>> {
        p.user.clone().ok_or(Error::Forbidden)
    }

    pub fn require_superuser(&self, p: &Principal) -> Result<()> {
        if p.is_superuser() {
            Ok(())
        } else {
            Err(Error::Forbidden)
        }
    }

    pub fn me(&self, p: &Principal) -> Result<crate::views::Me> {
        let u = self.require_user(p)?;
        let organizations = if u.is_superuser {
            self.store
                .all_orgs()?
                .into_iter()
                .map(|o| crate::views::OrgRole {
                    slug: o.slug,
                    role: self
                        .store
                        .membership(o.id, u.id)
                        .ok()
                        .flatten()
                        .map_or("owner", |m| m.role.as_str()),
                })
                .collect()
        } else {
            self.store
                .user_orgs(u.id)?
                .into_iter()
                .map(|(o, r)| crate::views::OrgRole {
                    slug: o.slug,
                    role: r.as_str(),
                })
                .collect()
        };
        Ok(crate::views::Me {
            id: u.id,
            email: u.email.clone(),
            is_superuser: u.is_superuser,
            organizations,
        })
    }

    /// Organizations the caller is a member of (a superuser's own memberships too), newest
    /// first.
    pub fn orgs(&self, p: &Principal) -> Result<Vec<crate::views::OrgView>> {
        let u = self.require_user(p)?;
        let mut v: Vec<_> = self
            .store
            .user_orgs(u.id)?
            .iter()
            .map(|(o, _)| crate::views::OrgView::from(o))
            .collect();
        v.reverse();
        Ok(v)
    }

    pub fn projects(&self, org_id: u64) -> Result<Vec<crate::views::ProjectView>> {
        Ok(self
            .store
            .org_projects(org_id)?
            .iter()
            .map(|p| crate::views::ProjectView::new(p, None))
            .collect())
    }

    pub fn api_keys(&self, p: &Principal) -> Result<Vec<crate::views::ApiKeyView>> {
        let u = self.require_user(p)?;
        Ok(self
            .store
            .user_api_keys(u.id)?
            .iter()
            .map(crate::views::ApiKeyView::from)
            .collect())
    }
}
