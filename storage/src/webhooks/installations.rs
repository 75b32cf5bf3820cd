//! Installations of the source host's app and the organization each is bound to.

use super::*;

impl Store {
    pub fn installation(&self, id: u64) -> Result<Option<Installation>> {
        self.get(&keys::installation(id))
    }

    /// Every installation, newest first (by `created_at`, the higher id first on a tie), as
    /// the contract orders lists; keyed by the host's ids, whose order is not the service's.
    pub fn installations(&self) -> Result<Vec<Installation>> {
        let mut v: Vec<Installation> = self.scan_rev(&keys::installation_prefix())?;
        v.sort_by_key(|i| std::cmp::Reverse((i.created_at, i.id)));
        Ok(v)
    }

    /// The binding of installation `id`, `None` for an installation never seen (no binding,
    /// not even an unbound one, was ever written). A binding to an organization since
    /// deleted reads as unbound.
    pub fn installation_binding_if_seen(&self, id: u64) -> Result<Option<InstallationBinding>> {
        let Some(mut b) = self.get::<InstallationBinding>(&keys::installation_binding(id))? else {
            return Ok(None);
        };
        if let Some(org) = b.organization_id
            && !self.inner.records.contains_key(keys::org(org))?
        {
            b.organization_id = None;
        }
        Ok(Some(b))
    }

    /// The organization `id` is bound to and those it left (unbound when never written, or
    /// when its organization was deleted).
    pub fn installation_binding(&self, id: u64) -> Result<InstallationBinding> {
        Ok(self.installation_binding_if_seen(id)?.unwrap_or_default())
    }

    /// Binds installations stored before installations belonged to organizations, once per
    /// data directory, and moves the index of links by name under each link's organization.
    /// An installation whose linked repositories (held or removed) are linked in exactly one
    /// organization is bound to it; one with none is bound to the service's only
    /// organization when it has exactly one; any other is recorded unbound, and stays so
    /// until a superuser binds it. Returns how many it bound.
    pub fn bind_installations(&self) -> Result<usize> {
        let mut bound = 0;
        self.once("installation_orgs_v1", || {
            let mut w = Writes::new();
            // name (lower-case) -> the organizations that link it.
            let mut orgs_of: std::collections::HashMap<String, Vec<u64>> =
                std::collections::HashMap::new();
            for kv in self
                .inner
                .records
                .scan_prefix(keys::legacy_repo_by_name_prefix())
            {
                let (k, v) = kv?;
                w.delete(k.to_vec());
                let Some((p, id)) = pair(&v) else { continue };
                let (Some(r), Some(project)) = (self.repo(p, id)?, self.project(p)?) else {
                    continue;
                };
                w.0.insert(
                    keys::repo_by_name(project.org_id, &r.full_name),
                    pair_bytes(&r),
                );
                let orgs = orgs_of.entry(r.full_name.to_ascii_lowercase()).or_default();
                if !orgs.contains(&project.org_id) {
                    orgs.push(project.org_id);
                }
            }
            let sole = self.sole_org()?;
            for i in self.installations()? {
                if self.installation_binding(i.id)?.organization_id.is_some() {
                    continue;
                }
                let mut orgs: Vec<u64> = Vec::new();
                for name in i.repositories.iter().chain(&i.removed) {
                    for o in orgs_of
                        .get(&name.to_ascii_lowercase())
                        .into_iter()
                        .flatten()
                    {
                        if !orgs.contains(o) {
                            orgs.push(*o);
                        }
                    }
                }
                let org = match orgs.as_slice() {
                    [one] => Some(*one),
                    [] => sole,
                    _ => None,
                };
                // One left unbound is recorded so, as seen: it is not bound later by the
                // rule for an installation first seen by a single-organization service.
                let mut b = InstallationBinding::default();
                if let Some(org) = org {
                    b.bind(org);
                    bound += 1;
                }
                w.put(keys::installation_binding(i.id), &b)?;
            }
            self.apply(w)
        })?;
        Ok(bound)
    }
}
