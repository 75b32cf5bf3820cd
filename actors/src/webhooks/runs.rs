//! Test runs: listing, and the runner's claim, heartbeat and completion (the dispatcher
//! writes them).

use super::WebhooksHandle;
use super::dispatcher::DispatcherMsg;
use super::views::RunFilter;
use super::views::TestRunView;
use crate::error::Error;
use crate::error::Result;
use crate::views::Page;
use crate::views::PageReq;

impl WebhooksHandle {
    pub fn runs(&self, project_id: u64, f: &RunFilter, page: PageReq) -> Result<Page<TestRunView>> {
        let all: Vec<TestRunView> = self
            .store
            .project_runs(project_id)?
            .iter()
            .filter(|r| f.status.is_none_or(|s| r.status == s))
            .filter(|r| {
                f.repository
                    .as_ref()
                    .is_none_or(|x| r.repository.eq_ignore_ascii_case(x))
            })
            .filter(|r| f.commit_sha.as_ref().is_none_or(|x| &r.commit_sha == x))
            .map(TestRunView::from)
            .collect();
        Ok(page.slice(all))
    }

    pub fn run(&self, project_id: u64, id: u64) -> Result<TestRunView> {
        self.store
            .run(project_id, id)?
            .map(|r| TestRunView::from(&r))
            .ok_or_else(|| Error::not_found("Test run"))
    }

    pub async fn claim(&self, project_id: u64) -> Result<Option<TestRunView>> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::Claim { project_id, reply })
            .await?;
        self.store.durable().await?;
        Ok(r.as_ref().map(TestRunView::from))
    }

    pub async fn heartbeat(&self, project_id: u64, id: u64) -> Result<TestRunView> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::Heartbeat {
                project_id,
                id,
                reply,
            })
            .await?;
        self.store.durable().await?;
        Ok(TestRunView::from(&r))
    }

    pub async fn complete(
        &self,
        project_id: u64,
        id: u64,
        status: String,
        summary: Option<String>,
    ) -> Result<TestRunView> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::Complete {
                project_id,
                id,
                status: status.clone(),
                summary: summary.clone(),
                reply,
            })
            .await?;
        self.store.durable().await?;
        Ok(TestRunView::from(&r))
    }
}
