//! Test runs: listing, and the runner's claim, heartbeat and completion (the dispatcher
//! writes them).

use fleetops_storage::webhooks::RunQuery;

use super::WebhooksHandle;
use super::dispatcher::DispatcherMsg;
use super::views::RunFilter;
use super::views::TestRunView;
use crate::error::Error;
use crate::error::Result;
use crate::views::Page;
use crate::views::PageReq;

impl WebhooksHandle {
    pub async fn runs(
        &self,
        project_id: u64,
        f: &RunFilter,
        page: PageReq,
    ) -> Result<Page<TestRunView>> {
        let me = self.clone();
        let f = f.clone();
        crate::off_thread(move || me.runs_now(project_id, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn runs_now(&self, project_id: u64, f: &RunFilter, page: PageReq) -> Result<Page<TestRunView>> {
        // Runs store their commit lower-cased (as the payload is read).
        let sha = f.commit_sha.as_deref().map(str::to_ascii_lowercase);
        let q = RunQuery {
            status: f.status,
            repository: f.repository.as_deref(),
            commit_sha: sha.as_deref(),
        };
        let (runs, total) = self
            .store
            .runs_page(project_id, q, page.skip(), page.page_size)?;
        Ok(page.of(runs.iter().map(TestRunView::from).collect(), total))
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
