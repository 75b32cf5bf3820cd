//! The source host's side: the webhook (signature, then id, then the intake), the secret's
//! rotation and status, installations and the delivery log (superuser), and per project the
//! linked repositories, test runs (with the runner's claim, heartbeat and complete) and the
//! project's deliveries.

use fleetops_actors::Role;
use fleetops_actors::views::Items;
use fleetops_actors::webhooks::{DeliveryFilter, LogOutcome, RepoPatch, RunFilter};
use http::{Response, StatusCode};
use serde::Deserialize;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

fn header2<'a>(req: &'a Req, host: &str, github: &str) -> Option<&'a str> {
    req.header(host).or_else(|| req.header(github))
}

/// Public: the signature is the credential, checked over the raw bytes before anything else
/// about the request; not tier-limited.
pub async fn receive(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let webhooks = &cx.rt().webhooks;
    let limit = usize::try_from(webhooks.max_body_bytes()).unwrap_or(usize::MAX);
    let bytes = req
        .body_bytes_paced(limit, crate::edge::Pace::Unauthenticated)
        .await?;
    let id = header2(&req, "x-host-delivery", "x-github-delivery");
    let event = header2(&req, "x-host-event", "x-github-event");
    webhooks
        .verify(req.header("x-hub-signature-256"), &bytes, id, event)
        .await?;
    body::accepted(&webhooks.accept(id, event, bytes).await?)
}

async fn superuser(cx: &mut Cx<'_>, req: &Req) -> ApiResult<()> {
    let p = cx.authenticate(req, None).await?;
    cx.rt().access.require_superuser(&p)?;
    Ok(())
}

pub async fn rotate(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    superuser(cx, &req).await?;
    body::ok(&cx.rt().webhooks.rotate().await?)
}

pub async fn status(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    superuser(cx, &req).await?;
    body::ok(&cx.rt().webhooks.status())
}

pub async fn installations(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    superuser(cx, &req).await?;
    body::ok(&Items {
        items: cx.rt().webhooks.installations()?,
    })
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "BindInstallation")]
pub(crate) struct BindBody {
    /// The organization's slug.
    #[schemars(schema_with = "fleetops_actors::rules::schemas::slug")]
    organization: String,
}

pub async fn bind_installation(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    superuser(cx, &req).await?;
    let id = req.id("installation_id", "Installation")?;
    let b: BindBody = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .webhooks
            .bind_installation(id, &b.organization)
            .await?,
    )
}

fn delivery_filter(req: &Req) -> ApiResult<DeliveryFilter> {
    let outcome = match req.query.get("outcome") {
        None => None,
        Some(o) => Some(LogOutcome::parse(o).ok_or_else(|| {
            ApiError::unprocessable(format!(
                "outcome: must be one of {}",
                LogOutcome::names().join(", ")
            ))
        })?),
    };
    Ok(DeliveryFilter {
        outcome,
        reason: req.query.get("reason").map(str::to_string),
    })
}

pub async fn deliveries(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    superuser(cx, &req).await?;
    let (f, page) = (delivery_filter(&req)?, req.query.page()?);
    body::ok(&cx.rt().webhooks.deliveries(None, &f, page).await?)
}

pub async fn delivery(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    superuser(cx, &req).await?;
    body::ok(&cx.rt().webhooks.delivery(None, req.param("delivery_id"))?)
}

pub async fn project_deliveries(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let (f, page) = (delivery_filter(&req)?, req.query.page()?);
    body::ok(
        &cx.rt()
            .webhooks
            .deliveries(Some(s.project.id), &f, page)
            .await?,
    )
}

pub async fn project_delivery(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(
        &cx.rt()
            .webhooks
            .delivery(Some(s.project.id), req.param("delivery_id"))?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateRepository")]
pub(crate) struct RepoBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::full_name")]
    full_name: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_branch_patterns")]
    branch_patterns: Option<Vec<String>>,
    include_drafts: Option<bool>,
}

pub async fn create_repo(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let b: RepoBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .webhooks
            .create_repo(
                s.project.id,
                b.full_name,
                b.branch_patterns,
                b.include_drafts,
            )
            .await?,
    )
}

pub async fn repos(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let page = req.query.page()?;
    body::ok(&cx.rt().webhooks.repos(s.project.id, page)?)
}

pub async fn repo(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("repo_id", "Repository")?;
    body::ok(&cx.rt().webhooks.repo(s.project.id, id)?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PatchRepository")]
pub(crate) struct RepoPatchBody {
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_branch_patterns")]
    branch_patterns: Option<Vec<String>>,
    include_drafts: Option<bool>,
}

pub async fn patch_repo(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("repo_id", "Repository")?;
    let b: RepoPatchBody = cx.json(&mut req).await?;
    let p = RepoPatch {
        branch_patterns: b.branch_patterns,
        include_drafts: b.include_drafts,
    };
    body::ok(&cx.rt().webhooks.update_repo(s.project.id, id, p).await?)
}

pub async fn delete_repo(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("repo_id", "Repository")?;
    cx.rt().webhooks.delete_repo(s.project.id, id).await?;
    body::no_content()
}

pub async fn runs(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let status = match req.query.get("status") {
        None => None,
        Some(v) => Some(fleetops_actors::RunStatus::parse(v).ok_or_else(|| {
            ApiError::unprocessable("status: must be queued, running, passed, failed or cancelled")
        })?),
    };
    let f = RunFilter {
        status,
        repository: req.query.get("repository").map(str::to_string),
        commit_sha: req.query.get("commit_sha").map(str::to_string),
    };
    let page = req.query.page()?;
    body::ok(&cx.rt().webhooks.runs(s.project.id, &f, page).await?)
}

pub async fn run(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("run_id", "Test run")?;
    body::ok(&cx.rt().webhooks.run(s.project.id, id)?)
}

pub async fn claim(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    match cx.rt().webhooks.claim(s.project.id).await? {
        Some(r) => body::ok(&r),
        None => {
            let mut resp = Response::new(crate::response::empty());
            *resp.status_mut() = StatusCode::NO_CONTENT;
            Ok(resp)
        }
    }
}

pub async fn heartbeat(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("run_id", "Test run")?;
    body::ok(&cx.rt().webhooks.heartbeat(s.project.id, id).await?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CompleteTestRun")]
pub(crate) struct CompleteBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::run_result")]
    status: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<10000>")]
    summary: Option<String>,
}

pub async fn complete(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("run_id", "Test run")?;
    let b: CompleteBody = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .webhooks
            .complete(s.project.id, id, b.status, b.summary)
            .await?,
    )
}
