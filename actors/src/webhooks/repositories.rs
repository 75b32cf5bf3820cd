//! Repositories linked to projects: the links and their branch patterns and draft policy.

use super::WebhooksHandle;
use super::dispatcher::DispatcherMsg;
use super::views::{RepoState, RepoView};
use crate::clock::fmt_ms;
use crate::error::Error;
use crate::error::Result;
use crate::views::Page;
use crate::views::PageReq;
use fleetops_storage::RepoLink;

/// A PATCH of a repository link.
#[derive(Debug, Clone, Default)]
pub struct RepoPatch {
    pub branch_patterns: Option<Vec<String>>,
    pub include_drafts: Option<bool>,
}

impl WebhooksHandle {
    /// A link as its project sees it: `connected` while an installation bound to the
    /// project's organization holds the repository, `disconnected` once that installation
    /// removed it or was moved to another organization, else `pending`. Nothing about another
    /// organization shows (its installation's id included).
    fn repo_view(&self, r: &RepoLink) -> Result<RepoView> {
        let org = self.store.project(r.project_id)?.map(|p| p.org_id);
        let (state, installation_id) = match self.store.repo_hold(&r.full_name)? {
            None => (RepoState::Pending, None),
            Some(h) => {
                let b = self.store.installation_binding(h.installation_id)?;
                match org {
                    Some(o) if b.organization_id == Some(o) => (
                        if h.current {
                            RepoState::Connected
                        } else {
                            RepoState::Disconnected
                        },
                        Some(h.installation_id),
                    ),
                    Some(o) if b.former.contains(&o) => (RepoState::Disconnected, None),
                    _ => (RepoState::Pending, None),
                }
            }
        };
        Ok(RepoView {
            id: r.id,
            full_name: r.full_name.clone(),
            state,
            installation_id,
            branch_patterns: r.branch_patterns.clone(),
            include_drafts: r.include_drafts,
            created_at: fmt_ms(r.created_at),
            updated_at: fmt_ms(r.updated_at),
        })
    }

    pub async fn create_repo(
        &self,
        project_id: u64,
        full_name: String,
        branch_patterns: Option<Vec<String>>,
        include_drafts: Option<bool>,
    ) -> Result<RepoView> {
        let patterns = branch_patterns
            .unwrap_or_else(|| vec!["main".into(), "master".into(), "release/*".into()]);
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::CreateRepo {
                project_id,
                full_name: full_name.clone(),
                branch_patterns: patterns.clone(),
                include_drafts: include_drafts.unwrap_or(false),
                reply,
            })
            .await?;
        self.store.durable().await?;
        self.repo_view(&r)
    }

    pub fn repos(&self, project_id: u64, page: PageReq) -> Result<Page<RepoView>> {
        let all = self
            .store
            .project_repos(project_id)?
            .iter()
            .map(|r| self.repo_view(r))
            .collect::<Result<Vec<_>>>()?;
        Ok(page.slice(all))
    }

    pub fn repo(&self, project_id: u64, id: u64) -> Result<RepoView> {
        let r = self
            .store
            .repo(project_id, id)?
            .ok_or_else(|| Error::not_found("Repository"))?;
        self.repo_view(&r)
    }

    pub async fn update_repo(
        &self,
        project_id: u64,
        id: u64,
        patch: RepoPatch,
    ) -> Result<RepoView> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::UpdateRepo {
                project_id,
                id,
                patch: patch.clone(),
                reply,
            })
            .await?;
        self.store.durable().await?;
        self.repo_view(&r)
    }

    pub async fn delete_repo(&self, project_id: u64, id: u64) -> Result<()> {
        self.dispatcher
            .call(|reply| DispatcherMsg::DeleteRepo {
                project_id,
                id,
                reply,
            })
            .await?;
        Ok(self.store.durable().await?)
    }
}
