//! Repository links: made, read, changed and removed by their writer.

use super::*;

impl DispatcherState {
    pub(super) fn create_repo(
        &self,
        project_id: u64,
        full_name: String,
        branch_patterns: Vec<String>,
        include_drafts: bool,
    ) -> Result<RepoLink> {
        check_full_name(&full_name)?;
        check_patterns(&branch_patterns)?;
        let org = self.org_of(project_id)?;
        // One project per repository within an organization; other organizations' links
        // neither conflict nor show.
        let taken = |l: RepoLink| {
            Error::Conflict(if l.project_id == project_id {
                format!(
                    "Repository {} is already linked to this project",
                    l.full_name
                )
            } else {
                format!(
                    "Repository {} is already linked to another project",
                    l.full_name
                )
            })
        };
        if let Some(l) = self.store.repo_by_name(org, &full_name)? {
            return Err(taken(l));
        }
        let now = self.clock.now_ms();
        let r = RepoLink {
            id: self.store.new_id(Seq::Repository)?,
            project_id,
            full_name,
            branch_patterns,
            include_drafts,
            created_at: now,
            updated_at: now,
        };
        let mut b = WebhookBatch::default();
        b.put_repo(org, &r)?;
        match b.commit(&self.store) {
            Ok(()) => Ok(r),
            // Another server linked it since the read above.
            Err(StorageError::Conflict(w)) if w == webhooks::REPO_NAME_TAKEN => {
                match self.store.repo_by_name(org, &r.full_name)? {
                    Some(l) => Err(taken(l)),
                    None => Err(Error::Unavailable {
                        retry_after_secs: 1,
                    }),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The organization of `project_id`.
    pub(super) fn org_of(&self, project_id: u64) -> Result<u64> {
        Ok(self
            .store
            .project(project_id)?
            .ok_or_else(|| Error::not_found("Project"))?
            .org_id)
    }

    pub(super) fn repo(&self, project_id: u64, id: u64) -> Result<RepoLink> {
        self.store
            .repo(project_id, id)?
            .ok_or_else(|| Error::not_found("Repository"))
    }

    pub(super) fn update_repo(
        &self,
        project_id: u64,
        id: u64,
        patch: RepoPatch,
    ) -> Result<RepoLink> {
        let mut r = self.repo(project_id, id)?;
        if let Some(p) = patch.branch_patterns {
            check_patterns(&p)?;
            r.branch_patterns = p;
        }
        if let Some(d) = patch.include_drafts {
            r.include_drafts = d;
        }
        r.updated_at = self.clock.now_ms();
        let mut b = WebhookBatch::default();
        b.put_repo(self.org_of(project_id)?, &r)?;
        b.commit(&self.store)?;
        Ok(r)
    }

    pub(super) fn delete_repo(&self, project_id: u64, id: u64) -> Result<()> {
        let r = self.repo(project_id, id)?;
        let mut b = WebhookBatch::default();
        b.delete_repo(self.org_of(project_id)?, &r);
        Ok(b.commit(&self.store)?)
    }
}
