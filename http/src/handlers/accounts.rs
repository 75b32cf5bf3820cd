//! Login, tokens, API keys, users, organizations, members and projects.

use fleetops_actors::Role;
use http::Response;
use serde::Deserialize;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::ApiResult;
use crate::response::Body;

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Login")]
pub(crate) struct LoginBody {
    email: String,
    password: String,
}

pub async fn login(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    cx.app
        .limits
        .check_login(req.client_ip(&cx.app.cfg.trusted_proxies))?;
    let b: LoginBody = cx.json(&mut req).await?;
    cx.app.limits.check_login_account(&b.email)?;
    body::ok(&cx.rt().auth.login(&b.email, &b.password).await?)
}

pub async fn refresh(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_jwt(&p)?;
    body::ok(&cx.rt().auth.refresh(&p)?)
}

pub async fn logout(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_jwt(&p)?;
    cx.rt().directory.sign_out(&p).await?;
    body::no_content()
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateApiKey")]
pub(crate) struct NameBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::name")]
    name: String,
}

pub async fn create_api_key(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_jwt(&p)?;
    let user = cx.rt().access.require_user(&p)?;
    let b: NameBody = cx.json(&mut req).await?;
    body::created(&cx.rt().directory.create_api_key(user.id, b.name).await?)
}

pub async fn list_api_keys(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    body::ok(&fleetops_actors::views::Items {
        items: cx.rt().access.api_keys(&p)?,
    })
}

pub async fn delete_api_key(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_jwt(&p)?;
    let user = cx.rt().access.require_user(&p)?;
    let id = req.id("key_id", "API key")?;
    cx.rt().directory.delete_api_key(user.id, id).await?;
    body::no_content()
}

pub async fn me(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    body::ok(&cx.rt().access.me(&p)?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateUser")]
pub(crate) struct UserBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::email")]
    email: String,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::password")]
    password: String,
    #[serde(default)]
    is_superuser: bool,
}

pub async fn create_user(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_superuser(&p)?;
    let b: UserBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .directory
            .create_user(b.email, b.password, b.is_superuser)
            .await?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateOrganization")]
pub(crate) struct OrgBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::slug")]
    slug: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_name")]
    name: Option<String>,
    tier: Option<String>,
}

pub async fn create_org(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    let user = cx.rt().access.require_user(&p)?;
    let b: OrgBody = cx.json(&mut req).await?;
    let tier = b.tier.unwrap_or_else(|| "free".into());
    if tier != "free" {
        cx.rt().access.require_superuser(&p)?;
    }
    body::created(
        &cx.rt()
            .directory
            .create_org(user.id, b.slug, b.name, tier)
            .await?,
    )
}

pub async fn get_org(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.org(&req, Role::Viewer).await?;
    body::ok(&fleetops_actors::views::OrgView::from(&*s.org))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PatchOrganization")]
pub(crate) struct OrgPatchBody {
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_name")]
    name: Option<String>,
    #[serde(default)]
    tier: Option<String>,
}

/// A name is an admin's to change; a tier (what the organization may use) a superuser's.
pub async fn patch_org(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (p, s) = cx.org(&req, Role::Admin).await?;
    let b: OrgPatchBody = cx.json(&mut req).await?;
    // Repeating the current tier changes nothing, so it needs no superuser.
    let tier = b.tier.filter(|t| *t != s.org.tier);
    if tier.is_some() {
        cx.rt().access.require_superuser(&p)?;
    }
    body::ok(&cx.rt().directory.update_org(s.org.id, b.name, tier).await?)
}

pub async fn delete_org(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.org(&req, Role::Owner).await?;
    cx.rt().directory.delete_org(s.org.id).await?;
    body::no_content()
}

pub async fn list_orgs(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    body::ok(&fleetops_actors::views::Items {
        items: cx.rt().access.orgs(&p)?,
    })
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(rename = "Role")]
pub(crate) enum RoleBody {
    Owner,
    Admin,
    Member,
    Viewer,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "AddMember")]
pub(crate) struct MemberBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::email")]
    email: String,
    role: RoleBody,
}

pub async fn add_member(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.org(&req, Role::Admin).await?;
    let b: MemberBody = cx.json(&mut req).await?;
    let role = match b.role {
        RoleBody::Owner => Role::Owner,
        RoleBody::Admin => Role::Admin,
        RoleBody::Member => Role::Member,
        RoleBody::Viewer => Role::Viewer,
    };
    body::created(
        &cx.rt()
            .directory
            .add_member(s.org.id, b.email, role, s.role)
            .await?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateProject")]
pub(crate) struct ProjectBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::slug")]
    slug: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_name")]
    name: Option<String>,
}

pub async fn create_project(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.org(&req, Role::Admin).await?;
    let b: ProjectBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .directory
            .create_project(s.org.id, b.slug, b.name)
            .await?,
    )
}

pub async fn list_projects(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.org(&req, Role::Viewer).await?;
    body::ok(&fleetops_actors::views::Items {
        items: cx.rt().access.projects(s.org.id)?,
    })
}

pub async fn rotate_secret(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    body::ok(&cx.rt().directory.rotate_secret(s.project.id).await?)
}
