//! Repository links (a project's, indexed by name in its organization) and holds.

use super::*;

/// The conflict a repository link meets when another link holds its name.
pub const REPO_NAME_TAKEN: &str = "repository name";

/// A link's index value: its project and id.
pub(super) fn pair_bytes(r: &RepoLink) -> Vec<u8> {
    let mut v = r.project_id.to_be_bytes().to_vec();
    v.extend_from_slice(&r.id.to_be_bytes());
    v
}

impl Store {
    pub fn repo_hold(&self, full_name: &str) -> Result<Option<RepoHold>> {
        self.get(&keys::repo_hold(full_name))
    }

    pub fn repo(&self, project: u64, id: u64) -> Result<Option<RepoLink>> {
        self.get(&keys::repo(project, id))
    }

    /// The link of `full_name` in organization `org`.
    pub fn repo_by_name(&self, org: u64, full_name: &str) -> Result<Option<RepoLink>> {
        let Some(v) = self.inner.records.get(keys::repo_by_name(org, full_name))? else {
            return Ok(None);
        };
        match pair(&v) {
            Some((p, id)) => self.repo(p, id),
            None => Ok(None),
        }
    }

    pub fn project_repos(&self, project: u64) -> Result<Vec<RepoLink>> {
        self.scan_rev(&keys::repo_prefix(project))
    }
}
