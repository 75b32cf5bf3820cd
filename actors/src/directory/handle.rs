//! [`DirectoryHandle`]: the way in for users, organizations, members, projects and API keys.
//! Writes go to the DirectoryActor; reads go to the store.

use super::{BootstrapReq, DirectoryMsg, Reply, hash_blocking};
use crate::error::Result;
use crate::mailbox::Slot;
use crate::rules;
use crate::views::{
    ApiKeyCreated, Bootstrapped, MemberView, OrgView, ProjectSecret, ProjectView, UserView,
};
use fleetops_storage::{Role, Store};
use std::sync::Arc;

/// The way in to the directory actor.
#[derive(Clone)]
pub struct DirectoryHandle {
    pub(crate) slot: Arc<Slot<DirectoryMsg>>,
    pub(crate) store: Store,
    /// How long after its password sign-in a token of it can still be valid (the refresh
    /// window plus a token's life), in milliseconds: a sign-out is kept that long.
    pub(crate) sign_in_lifetime_ms: i64,
    /// Purges deleted organizations' data.
    pub(crate) offboarding: super::purge::Offboarding,
}

impl DirectoryHandle {
    /// A write call, answered only once its effects are durable.
    async fn write<T: Send + 'static>(
        &self,
        build: impl Fn(Reply<T>) -> DirectoryMsg,
    ) -> Result<T> {
        let r = self.slot.call(build).await?;
        self.store.durable().await?;
        Ok(r)
    }

    pub async fn bootstrap(&self, req: BootstrapReq) -> Result<Bootstrapped> {
        rules::password("password", &req.password)?;
        let hash = hash_blocking(req.password.clone()).await?;
        self.write(|r| DirectoryMsg::Bootstrap(req.clone(), hash.clone(), r))
            .await
    }

    pub async fn create_user(
        &self,
        email: String,
        password: String,
        is_superuser: bool,
    ) -> Result<UserView> {
        rules::email("email", &email)?;
        rules::password("password", &password)?;
        let password_hash = hash_blocking(password).await?;
        self.write(|reply| DirectoryMsg::CreateUser {
            email: email.clone(),
            password_hash: password_hash.clone(),
            is_superuser,
            reply,
        })
        .await
    }

    pub async fn create_org(
        &self,
        owner: u64,
        slug: String,
        name: Option<String>,
        tier: String,
    ) -> Result<OrgView> {
        self.write(|reply| DirectoryMsg::CreateOrg {
            owner,
            slug: slug.clone(),
            name: name.clone(),
            tier: tier.clone(),
            reply,
        })
        .await
    }

    /// Changes an organization's name or tier (each `None`: unchanged).
    pub async fn update_org(
        &self,
        org_id: u64,
        name: Option<String>,
        tier: Option<String>,
    ) -> Result<OrgView> {
        self.write(|reply| DirectoryMsg::UpdateOrg {
            org_id,
            name: name.clone(),
            tier: tier.clone(),
            reply,
        })
        .await
        .map(|o| OrgView::from(&o))
    }

    /// Deletes an organization: gone from every lookup once this answers (its slug free, no
    /// member reaches it, its installations unbound), and its projects with every device,
    /// session, log, file, capsule, configuration, deployment, rule, alert, repository link and
    /// test run purged in the background (resumed after a restart).
    pub async fn delete_org(&self, org_id: u64) -> Result<()> {
        // On its own task: a caller that goes away (a client hanging up) cannot leave a
        // deletion applied without its purge started.
        let this = self.clone();
        tokio::spawn(async move {
            this.write(|reply| DirectoryMsg::DeleteOrg { org_id, reply })
                .await?;
            this.offboarding.start(org_id, true);
            Ok(())
        })
        .await
        .map_err(|e| crate::Error::Internal(format!("deleting an organization: {e}")))?
    }

    /// Resumes the purge of every organization deleted but not yet purged.
    pub(crate) fn resume_purges(&self) -> Result<()> {
        self.offboarding.resume()
    }

    /// Every organization, newest first, and the deleted ones still being purged.
    pub fn all_orgs(&self) -> Result<crate::views::AllOrgs> {
        Ok(crate::views::AllOrgs::of(
            &self.store.all_orgs()?,
            self.store.orgs_being_deleted()?.len() as u64,
        ))
    }

    /// Organization `slug`, if it exists.
    pub fn org_by_slug(&self, slug: &str) -> Result<Option<OrgView>> {
        Ok(self.store.org_by_slug(slug)?.map(|o| OrgView::from(&*o)))
    }

    /// Whether a deleted organization's data is still being purged (tests and the CLI).
    pub fn purging(&self) -> Result<Vec<u64>> {
        Ok(self.store.orgs_being_deleted()?)
    }

    pub async fn add_member(
        &self,
        org_id: u64,
        email: String,
        role: Role,
        caller_role: Role,
    ) -> Result<MemberView> {
        self.write(|reply| DirectoryMsg::AddMember {
            org_id,
            email: email.clone(),
            role,
            caller_role,
            reply,
        })
        .await
    }

    pub async fn create_project(
        &self,
        org_id: u64,
        slug: String,
        name: Option<String>,
    ) -> Result<ProjectView> {
        self.write(|reply| DirectoryMsg::CreateProject {
            org_id,
            slug: slug.clone(),
            name: name.clone(),
            reply,
        })
        .await
    }

    pub async fn rotate_secret(&self, project_id: u64) -> Result<ProjectSecret> {
        self.write(|reply| DirectoryMsg::RotateSecret { project_id, reply })
            .await
    }

    pub async fn create_api_key(&self, user_id: u64, name: String) -> Result<ApiKeyCreated> {
        self.write(|reply| DirectoryMsg::CreateApiKey {
            user_id,
            name: name.clone(),
            reply,
        })
        .await
    }

    pub async fn delete_api_key(&self, user_id: u64, key_id: u64) -> Result<()> {
        self.write(|reply| DirectoryMsg::DeleteApiKey {
            user_id,
            key_id,
            reply,
        })
        .await
    }

    /// Signs out the sign-in a JWT descends from: that token, every token refreshed from it
    /// and every refresh of them are refused from now on (401), by every route. Another
    /// credential (an API key) is 403: it has no sign-in to end.
    pub async fn sign_out(&self, p: &crate::auth::Principal) -> Result<()> {
        let (crate::auth::Credential::Jwt { auth_time, sign_in }, Some(user)) =
            (&p.credential, &p.user)
        else {
            return Err(crate::error::Error::Forbidden);
        };
        let user_id = user.id;
        let until_ms = auth_time
            .saturating_mul(1000)
            .saturating_add(self.sign_in_lifetime_ms);
        self.write(|reply| DirectoryMsg::SignOut {
            user_id,
            sign_in: sign_in.clone(),
            until_ms,
            reply,
        })
        .await
    }

    /// Forgets sign-outs whose tokens have all expired (the housekeeper's pass).
    pub(crate) async fn prune_sign_outs(&self, now_ms: i64) -> Result<usize> {
        self.slot
            .call(|reply| DirectoryMsg::PruneSignOuts { now_ms, reply })
            .await
    }

    pub(crate) fn touch_key(&self, key_id: u64, at: i64) {
        self.slot.cast(DirectoryMsg::TouchKey { key_id, at });
    }

    /// Makes the actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub fn inject_panic(&self) {
        self.slot.cast(DirectoryMsg::Panic);
    }
}
