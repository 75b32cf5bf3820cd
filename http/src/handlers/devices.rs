//! Devices, heartbeats and device groups (project-scoped), and the organization-wide list.

use std::collections::BTreeMap;

use fleetops_actors::Role;
use fleetops_actors::projects::{DeviceFilter, DeviceStatus};
use fleetops_actors::views::Items;
use http::Response;
use serde::Deserialize;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

fn filter(req: &Req) -> ApiResult<DeviceFilter> {
    let status = req
        .query
        .get("status")
        .map(|s| {
            DeviceStatus::parse(s)
                .ok_or_else(|| ApiError::unprocessable("status: must be online or offline"))
        })
        .transpose()?;
    Ok(DeviceFilter {
        status,
        name: req.query.get("name").map(str::to_string),
    })
}

pub async fn org_devices(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.org(&req, Role::Viewer).await?;
    let (f, page) = (filter(&req)?, req.query.page()?);
    let projects: Vec<(u64, String)> = cx
        .rt()
        .access
        .projects(s.org.id)?
        .into_iter()
        .map(|p| (p.id, p.slug))
        .collect();
    body::ok(&cx.rt().projects.org_devices(&projects, &f, page).await?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateDevice")]
pub(crate) struct CreateBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::name")]
    name: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::labels")]
    labels: BTreeMap<String, String>,
}

pub async fn create(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let b: CreateBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .projects
            .create_device(s.project.id, b.name, b.labels)
            .await?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateEnrollmentToken")]
pub(crate) struct EnrollmentTokenBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::name")]
    name: String,
    /// Enrolls one robot, then is gone.
    #[serde(default)]
    single_use: bool,
    /// Seconds until it enrolls nothing; absent: until revoked.
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::opt_u64")]
    #[schemars(range(min = 1, max = 31_622_400))]
    expires_in_seconds: Option<u64>,
    /// Labels every robot enrolled with it has (a robot cannot change them).
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::labels")]
    labels: BTreeMap<String, String>,
    /// The keys a robot may set its own labels under; default none.
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    allowed_label_keys: Vec<String>,
}

pub async fn create_enrollment_token(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let b: EnrollmentTokenBody = cx.json(&mut req).await?;
    let spec = fleetops_actors::projects::TokenSpec {
        name: b.name,
        single_use: b.single_use,
        expires_in_seconds: b.expires_in_seconds,
        labels: b.labels,
        allowed_label_keys: b.allowed_label_keys,
    };
    body::created(
        &cx.rt()
            .projects
            .create_enrollment_token(s.project.id, spec)
            .await?,
    )
}

pub async fn enrollment_tokens(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    body::ok(&cx.rt().projects.enrollment_tokens(s.project.id)?)
}

pub async fn delete_enrollment_token(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let id = req.id("token_id", "Enrollment token")?;
    cx.rt()
        .projects
        .delete_enrollment_token(s.project.id, id)
        .await?;
    body::no_content()
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Enroll")]
pub(crate) struct EnrollBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::name")]
    name: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::labels")]
    labels: BTreeMap<String, String>,
    /// The robot's own name for this enrollment (1-64 letters, digits and `-`, a random
    /// UUID): asked again with it, the answer is the same device with a new device token.
    #[serde(default)]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9-]+$"))]
    enrollment_id: Option<String>,
}

/// A robot registers itself: its enrollment token is the bearer credential. Attempts count
/// against the client address's sign-in limit (a token guessed is a credential guessed).
pub async fn enroll(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    cx.app
        .limits
        .check_login(req.client_ip(&cx.app.cfg.trusted_proxies))?;
    let token = req
        .credential()
        .ok_or(ApiError::Domain(fleetops_actors::Error::Unauthorized))?
        .to_string();
    let b: EnrollBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .projects
            .enroll(&token, b.name, b.labels, b.enrollment_id.as_deref())
            .await?,
    )
}

pub async fn list(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let (f, page) = (filter(&req)?, req.query.page()?);
    body::ok(&cx.rt().projects.devices(s.project.id, &f, page).await?)
}

pub async fn get(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("device_id", "Device")?;
    body::ok(&cx.rt().projects.device(s.project.id, id).await?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PatchDevice")]
pub(crate) struct PatchBody {
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_name")]
    name: Option<String>,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_labels")]
    labels: Option<BTreeMap<String, String>>,
}

pub async fn patch(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("device_id", "Device")?;
    cx.rt().projects.device_exists(s.project.id, id)?;
    let b: PatchBody = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .projects
            .update_device(s.project.id, id, b.name, b.labels)
            .await?,
    )
}

pub async fn delete(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("device_id", "Device")?;
    cx.rt().projects.delete_device(s.project.id, id).await?;
    body::no_content()
}

#[derive(Deserialize, Default, schemars::JsonSchema)]
#[schemars(rename = "Heartbeat")]
pub(crate) struct HeartbeatBody {
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::metrics")]
    metrics: BTreeMap<String, f64>,
}

pub async fn heartbeat(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let org = req.param("org").to_string();
    let p = cx.authenticate(&req, Some(&org)).await?;
    let id = req.id("device_id", "Device")?;
    let s = cx
        .rt()
        .access
        .device_route(&p, &org, req.param("project"), id, Role::Member)?;
    cx.rt().projects.device_exists(s.project.id, id)?;
    let bytes = req.body_bytes(cx.app.cfg.max_body_bytes).await?;
    let b: HeartbeatBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        HeartbeatBody::default()
    } else {
        body::parse_object(&bytes)?
    };
    body::accepted(
        &cx.rt()
            .projects
            .heartbeat(s.project.id, id, b.metrics)
            .await?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateGroup")]
pub(crate) struct GroupBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::name")]
    name: String,
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::vec_u64")]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::ids::<10000>")]
    device_ids: Vec<u64>,
}

pub async fn create_group(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let b: GroupBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .projects
            .create_group(s.project.id, b.name, b.device_ids)
            .await?,
    )
}

pub async fn list_groups(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(&Items {
        items: cx.rt().projects.groups(s.project.id)?,
    })
}

pub async fn get_group(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("group_id", "Device group")?;
    body::ok(&cx.rt().projects.group(s.project.id, id)?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PatchGroup")]
pub(crate) struct GroupPatch {
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_name")]
    name: Option<String>,
    #[serde(
        default,
        deserialize_with = "fleetops_actors::rules::whole::opt_vec_u64"
    )]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_ids::<10000>")]
    device_ids: Option<Vec<u64>>,
}

pub async fn patch_group(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("group_id", "Device group")?;
    cx.rt().projects.group_exists(s.project.id, id)?;
    let b: GroupPatch = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .projects
            .update_group(s.project.id, id, b.name, b.device_ids)
            .await?,
    )
}

pub async fn delete_group(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("group_id", "Device group")?;
    cx.rt().projects.delete_group(s.project.id, id).await?;
    body::no_content()
}
