//! DirectoryActor: the single writer of users, organizations, memberships, projects (with
//! their secrets), API keys and sign-outs, so that e-mails and slugs stay unique, a member is
//! added once and a user holds at most `[auth] max_api_keys_per_user` keys under concurrent
//! requests.
//!
//! With several servers on one database, each message is applied inside the section
//! `directory` (`fleetops_storage::sections`), so these guarantees hold across servers too.
//!
//! It holds no state beyond the store and its settings (tier names, the key cap): a restart
//! loses nothing. Reads do not pass through it; they go to the store directly, through its
//! read-through caches (see `access` and `auth`). Its handle is in `handle.rs`, and hashes a
//! password on a blocking thread before the message reaches the actor, so the actor never
//! waits on argon2. Project secrets and API keys are stored only as their SHA-256 and shown
//! once. An API key's last use arrives as a message with no reply: a lost one only ages
//! `last_used_at`.
//!
//! Tested through the API (`tests/api/accounts/`), and with a panic injected into it
//! (`tests/api/supervision/`).

mod handle;
pub(crate) mod purge;

pub use handle::DirectoryHandle;

use fleetops_storage::{
    ApiKey, Membership, Organization, Project, Role, Store, User, accounts::Seq,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::clock::{fmt_ms, now_ms};
use crate::error::{Error, Result};
use crate::mailbox::Envelope;
use crate::rules;
use crate::secrets;
use crate::views::{
    ApiKeyCreated, Bootstrapped, MemberView, OrgView, ProjectSecret, ProjectView, UserView,
};

pub(super) type Reply<T> = RpcReplyPort<Result<T>>;

/// What bootstrap creates; the password is hashed by the handle before it reaches the actor.
#[derive(Debug, Clone)]
pub struct BootstrapReq {
    pub email: String,
    pub password: String,
    pub org: String,
    pub project: String,
    pub tier: String,
}

pub(crate) enum DirectoryMsg {
    Bootstrap(BootstrapReq, String, Reply<Bootstrapped>),
    CreateUser {
        email: String,
        password_hash: String,
        is_superuser: bool,
        reply: Reply<UserView>,
    },
    CreateOrg {
        owner: u64,
        slug: String,
        name: Option<String>,
        tier: String,
        reply: Reply<OrgView>,
    },
    AddMember {
        org_id: u64,
        email: String,
        role: Role,
        caller_role: Role,
        reply: Reply<MemberView>,
    },
    CreateProject {
        org_id: u64,
        slug: String,
        name: Option<String>,
        reply: Reply<ProjectView>,
    },
    RotateSecret {
        project_id: u64,
        reply: Reply<ProjectSecret>,
    },
    CreateApiKey {
        user_id: u64,
        name: String,
        reply: Reply<ApiKeyCreated>,
    },
    DeleteApiKey {
        user_id: u64,
        key_id: u64,
        reply: Reply<()>,
    },
    /// Changes an organization's name or tier (`None`: unchanged).
    UpdateOrg {
        org_id: u64,
        name: Option<String>,
        tier: Option<String>,
        reply: Reply<Organization>,
    },
    /// Removes an organization from every lookup and marks its data for purging.
    DeleteOrg {
        org_id: u64,
        reply: Reply<()>,
    },
    /// Signs out a sign-in: its tokens are refused from now on, until `until_ms`.
    SignOut {
        user_id: u64,
        sign_in: String,
        until_ms: i64,
        reply: Reply<()>,
    },
    /// Forgets sign-outs whose tokens have all expired.
    PruneSignOuts {
        now_ms: i64,
        reply: Reply<usize>,
    },
    /// Records the last use of an API key (no reply; a lost touch only ages `last_used_at`).
    TouchKey {
        key_id: u64,
        at: i64,
    },
    /// Fault injection for supervision tests.
    #[cfg(feature = "fault-injection")]
    Panic,
}

impl DirectoryMsg {
    /// Answers the request 503, unapplied (the directory's section could not be entered).
    fn refuse(self) {
        fn busy<T>() -> Result<T> {
            Err(Error::Unavailable {
                retry_after_secs: 1,
            })
        }
        macro_rules! refuse {
            ($($v:ident),*) => {
                match self {
                    DirectoryMsg::Bootstrap(_, _, reply) => {
                        let _ = reply.send(busy());
                    }
                    $(DirectoryMsg::$v { reply, .. } => {
                        let _ = reply.send(busy());
                    })*
                    DirectoryMsg::TouchKey { .. } => {}
                    #[cfg(feature = "fault-injection")]
                    DirectoryMsg::Panic => {}
                }
            };
        }
        refuse!(
            CreateUser,
            CreateOrg,
            AddMember,
            CreateProject,
            RotateSecret,
            CreateApiKey,
            DeleteApiKey,
            UpdateOrg,
            DeleteOrg,
            SignOut,
            PruneSignOuts
        );
    }
}

pub(crate) struct DirectoryActor;

pub(crate) struct DirectoryState {
    store: Store,
    /// Tier names that exist.
    tiers: Vec<String>,
    /// `[auth] max_api_keys_per_user`.
    max_api_keys: usize,
}

impl Actor for DirectoryActor {
    type Msg = Envelope<DirectoryMsg>;
    type State = DirectoryState;
    type Arguments = (Store, Vec<String>, usize);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (store, tiers, max_api_keys): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(DirectoryState {
            store,
            tiers,
            max_api_keys,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The one writer of these records across servers too (several nodes on one
        // database): a key touched on one node is never written back after its deletion on
        // another, and a member or key count is decided on what is stored. Entered before the
        // request is taken on, so a caller answered 503 at its deadline meanwhile is never
        // applied.
        let section = st
            .store
            .section("directory", fleetops_storage::sections::Cached::Everything)
            .await;
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        let mut section = match section {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "could not enter the directory's section");
                msg.refuse();
                return Ok(());
            }
        };
        section.run(|| st.apply(msg));
        Ok(())
    }
}

impl DirectoryState {
    /// Applies one message and answers it.
    fn apply(&mut self, msg: DirectoryMsg) {
        let st = self;
        match msg {
            DirectoryMsg::Bootstrap(req, hash, reply) => {
                let _ = reply.send(st.bootstrap(req, hash));
            }
            DirectoryMsg::CreateUser {
                email,
                password_hash,
                is_superuser,
                reply,
            } => {
                let _ = reply.send(
                    st.create_user(&email, password_hash, is_superuser)
                        .map(|u| UserView::from(&u)),
                );
            }
            DirectoryMsg::CreateOrg {
                owner,
                slug,
                name,
                tier,
                reply,
            } => {
                let _ = reply.send(
                    st.create_org(owner, &slug, name, &tier)
                        .map(|o| OrgView::from(&o)),
                );
            }
            DirectoryMsg::AddMember {
                org_id,
                email,
                role,
                caller_role,
                reply,
            } => {
                let _ = reply.send(st.add_member(org_id, &email, role, caller_role));
            }
            DirectoryMsg::CreateProject {
                org_id,
                slug,
                name,
                reply,
            } => {
                let _ = reply.send(
                    st.create_project(org_id, &slug, name)
                        .map(|(p, secret)| ProjectView::new(&p, Some(secret))),
                );
            }
            DirectoryMsg::RotateSecret { project_id, reply } => {
                let _ = reply.send(st.rotate_secret(project_id));
            }
            DirectoryMsg::CreateApiKey {
                user_id,
                name,
                reply,
            } => {
                let _ = reply.send(st.create_api_key(user_id, &name));
            }
            DirectoryMsg::DeleteApiKey {
                user_id,
                key_id,
                reply,
            } => {
                let _ = reply.send(st.delete_api_key(user_id, key_id));
            }
            DirectoryMsg::UpdateOrg {
                org_id,
                name,
                tier,
                reply,
            } => {
                let _ = reply.send(st.update_org(org_id, name, tier));
            }
            DirectoryMsg::DeleteOrg { org_id, reply } => {
                let r = match st.store.org(org_id) {
                    Ok(Some(org)) => st.store.begin_org_deletion(&org).map_err(Into::into),
                    Ok(None) => Err(Error::not_found("Organization")),
                    Err(e) => Err(e.into()),
                };
                let _ = reply.send(r);
            }
            DirectoryMsg::SignOut {
                user_id,
                sign_in,
                until_ms,
                reply,
            } => {
                let r = st.store.sign_out(user_id, &sign_in, until_ms);
                let _ = reply.send(r.map_err(Into::into));
            }
            DirectoryMsg::PruneSignOuts { now_ms, reply } => {
                let _ = reply.send(st.store.prune_sign_outs(now_ms).map_err(Into::into));
            }
            DirectoryMsg::TouchKey { key_id, at } => {
                if let Ok(Some(mut k)) = st.store.api_key(key_id) {
                    k.last_used_at = Some(at);
                    if let Err(e) = st.store.update_api_key(&k) {
                        tracing::warn!(error = %e, "could not record API key use");
                    }
                }
            }
            #[cfg(feature = "fault-injection")]
            DirectoryMsg::Panic => panic!("injected fault in DirectoryActor"),
        }
    }
}

impl DirectoryState {
    fn create_user(&self, email: &str, password_hash: String, is_superuser: bool) -> Result<User> {
        let email = rules::email("email", email)?;
        if self.store.user_by_email(&email)?.is_some() {
            return Err(Error::Conflict(
                "A user with this email already exists".into(),
            ));
        }
        let user = User {
            id: self.store.new_id(Seq::User)?,
            email,
            password_hash,
            is_superuser,
            created_at: now_ms(),
        };
        self.store.insert_user(&user)?;
        Ok(user)
    }

    fn check_tier(&self, tier: &str) -> Result<()> {
        if self.tiers.iter().any(|t| t == tier) {
            Ok(())
        } else {
            Err(Error::unprocessable(
                "tier",
                format!("must be one of {}", self.tiers.join(", ")),
            ))
        }
    }

    /// Organization `org_id`, which a request resolved before this actor took its message:
    /// gone if a deletion came first (this actor applies both, one at a time).
    fn existing_org(&self, org_id: u64) -> Result<Organization> {
        self.store
            .org(org_id)?
            .ok_or_else(|| Error::not_found("Organization"))
    }

    fn update_org(
        &self,
        org_id: u64,
        name: Option<String>,
        tier: Option<String>,
    ) -> Result<Organization> {
        let mut org = self.existing_org(org_id)?;
        if let Some(n) = name {
            org.name = rules::name("name", &n, 200)?;
        }
        if let Some(t) = tier {
            self.check_tier(&t)?;
            org.tier = t;
        }
        self.store.update_org(&org)?;
        Ok(org)
    }

    fn create_org(
        &self,
        owner: u64,
        slug: &str,
        name: Option<String>,
        tier: &str,
    ) -> Result<Organization> {
        rules::slug("slug", slug)?;
        self.check_tier(tier)?;
        let name = match name {
            Some(n) => rules::name("name", &n, 200)?,
            None => slug.to_string(),
        };
        if self.store.org_by_slug(slug)?.is_some() {
            return Err(Error::Conflict(
                "An organization with this slug already exists".into(),
            ));
        }
        let now = now_ms();
        let org = Organization {
            id: self.store.new_id(Seq::Org)?,
            slug: slug.to_string(),
            name,
            tier: tier.to_string(),
            created_at: now,
        };
        let m = Membership {
            org_id: org.id,
            user_id: owner,
            role: Role::Owner,
            created_at: now,
        };
        self.store.insert_org(&org, &m)?;
        Ok(org)
    }

    fn add_member(
        &self,
        org_id: u64,
        email: &str,
        role: Role,
        caller_role: Role,
    ) -> Result<MemberView> {
        if role == Role::Owner && caller_role != Role::Owner {
            return Err(Error::Forbidden);
        }
        self.existing_org(org_id)?;
        let email = rules::email("email", email)?;
        let user = self
            .store
            .user_by_email(&email)?
            .ok_or_else(|| Error::not_found("User"))?;
        if self.store.membership(org_id, user.id)?.is_some() {
            return Err(Error::Conflict(
                "User is already a member of this organization".into(),
            ));
        }
        self.store.upsert_membership(&Membership {
            org_id,
            user_id: user.id,
            role,
            created_at: now_ms(),
        })?;
        Ok(MemberView {
            user_id: user.id,
            email: user.email.clone(),
            role: role.as_str(),
        })
    }

    fn create_project(
        &self,
        org_id: u64,
        slug: &str,
        name: Option<String>,
    ) -> Result<(Project, String)> {
        rules::slug("slug", slug)?;
        let name = match name {
            Some(n) => rules::name("name", &n, 200)?,
            None => slug.to_string(),
        };
        self.existing_org(org_id)?;
        if self.store.project_by_slug(org_id, slug)?.is_some() {
            return Err(Error::Conflict(
                "A project with this slug already exists".into(),
            ));
        }
        let secret = secrets::new_project_secret()?;
        let p = Project {
            id: self.store.new_id(Seq::Project)?,
            org_id,
            slug: slug.to_string(),
            name,
            secret_hash: secrets::sha256(secret.as_bytes()),
            created_at: now_ms(),
        };
        self.store.insert_project(&p)?;
        Ok((p, secret))
    }

    fn rotate_secret(&self, project_id: u64) -> Result<ProjectSecret> {
        let mut p = self
            .store
            .project(project_id)?
            .filter(|p| !self.store.project_retired(p.id))
            .ok_or_else(|| Error::not_found("Project"))?;
        let secret = secrets::new_project_secret()?;
        p.secret_hash = secrets::sha256(secret.as_bytes());
        self.store.update_project(&p)?;
        Ok(ProjectSecret {
            project_secret: secret,
        })
    }

    fn create_api_key(&self, user_id: u64, name: &str) -> Result<ApiKeyCreated> {
        let name = rules::name("name", name, 200)?;
        // Counted by the one writer of keys, so two creations at once cannot both pass.
        let held = self.store.user_api_keys(user_id)?.len();
        if held >= self.max_api_keys {
            return Err(Error::Unprocessable(format!(
                "a user holds at most {} API keys ([auth] max_api_keys_per_user); delete one first",
                self.max_api_keys
            )));
        }
        let key = secrets::new_api_key()?;
        let rec = ApiKey {
            id: self.store.new_id(Seq::ApiKey)?,
            user_id,
            name,
            prefix: key.chars().take(12).collect(),
            hash: secrets::sha256(key.as_bytes()),
            created_at: now_ms(),
            last_used_at: None,
        };
        self.store.insert_api_key(&rec)?;
        Ok(ApiKeyCreated {
            id: rec.id,
            name: rec.name,
            key,
            created_at: fmt_ms(rec.created_at),
        })
    }

    fn delete_api_key(&self, user_id: u64, key_id: u64) -> Result<()> {
        match self.store.api_key(key_id)? {
            Some(k) if k.user_id == user_id => Ok(self.store.delete_api_key(&k)?),
            _ => Err(Error::not_found("API key")),
        }
    }

    fn bootstrap(&self, req: BootstrapReq, password_hash: String) -> Result<Bootstrapped> {
        // Validate everything before writing anything, so a refused bootstrap changes nothing.
        let email = rules::email("email", &req.email)?;
        rules::slug("org", &req.org)?;
        rules::slug("project", &req.project)?;
        self.check_tier(&req.tier)?;
        if self.store.user_by_email(&email)?.is_some() {
            return Err(Error::Conflict(format!("a user {email} already exists")));
        }
        if self.store.org_by_slug(&req.org)?.is_some() {
            return Err(Error::Conflict(format!(
                "an organization {} already exists",
                req.org
            )));
        }
        let user = self.create_user(&email, password_hash, true)?;
        let org = self.create_org(user.id, &req.org, None, &req.tier)?;
        let (project, project_secret) = self.create_project(org.id, &req.project, None)?;
        let key = self.create_api_key(user.id, "bootstrap")?;
        Ok(Bootstrapped {
            user_id: user.id,
            email: user.email.clone(),
            org: org.slug,
            project: project.slug,
            project_secret,
            api_key: key.key,
            generated_password: None,
        })
    }
}

pub(super) async fn hash_blocking(password: String) -> Result<String> {
    tokio::task::spawn_blocking(move || secrets::hash_password(&password))
        .await
        .map_err(|e| Error::Internal(e.to_string()))?
}
