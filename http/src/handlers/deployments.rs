//! Deployment packages: create, plan, list, read, patch and delete drafts, transitions, and
//! the devices' rollout reports.

use fleetops_actors::Role;
use fleetops_actors::pipeline::deployments::{DeploymentPatch, DeploymentSpec, Transition};
use http::Response;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

/// `POST /deployments/{id}/rollout/devices/{device_id}/retry` (member): the package is
/// offered again to a device that failed it; 409 unless the package is active and the
/// device's latest result with it is `failed`.
pub async fn retry_device(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (p, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("deployment_id", "Deployment")?;
    cx.rt().pipeline.exists("deployment", s.project.id, id)?;
    let device = req.id("device_id", "Device")?;
    body::ok(
        &cx.rt()
            .pipeline
            .retry_device(s.project.id, id, device, p.who())
            .await?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "DeploymentRequest")]
pub(crate) struct CreateBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::name")]
    name: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<2000>")]
    description: Option<String>,
    composition_tag: String,
    #[serde(deserialize_with = "fleetops_actors::rules::whole::u64")]
    capsule_id: u64,
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::opt_u64")]
    configuration_id: Option<u64>,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::targets")]
    target_devices: Vec<Value>,
    /// Phases that start one after another as their gates pass.
    #[serde(default)]
    #[schemars(with = "Option<fleetops_actors::rules::rollouts::RolloutPlan>")]
    rollout: Option<Value>,
}

impl From<CreateBody> for DeploymentSpec {
    fn from(b: CreateBody) -> Self {
        Self {
            name: b.name,
            description: b.description,
            composition_tag: b.composition_tag,
            capsule_id: b.capsule_id,
            configuration_id: b.configuration_id,
            target_devices: b.target_devices,
            rollout: b.rollout,
        }
    }
}

pub async fn create(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let b: CreateBody = cx.json(&mut req).await?;
    body::created(
        &cx.rt()
            .pipeline
            .create_deployment(s.project.id, b.into())
            .await?,
    )
}

pub async fn plan(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let b: CreateBody = cx.json(&mut req).await?;
    body::ok(&cx.rt().pipeline.plan(s.project.id, &b.into())?)
}

pub async fn list(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let status = match req.query.get("deployment_status") {
        None => None,
        Some(v) => Some(fleetops_actors::DeploymentStatus::parse(v).ok_or_else(|| {
            ApiError::unprocessable("deployment_status: must be draft, active or deprecated")
        })?),
    };
    let page = req.query.page()?;
    body::ok(
        &cx.rt()
            .pipeline
            .deployments(s.project.id, status, page)
            .await?,
    )
}

pub async fn get(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("deployment_id", "Deployment")?;
    body::ok(&cx.rt().pipeline.deployment_detail(s.project.id, id)?)
}

/// `Some(None)` for an explicit `null`, `None` when the key is absent.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PatchDeployment")]
pub(crate) struct PatchBody {
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_name")]
    name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<2000>")]
    description: Option<Option<String>>,
    composition_tag: Option<String>,
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::opt_u64")]
    capsule_id: Option<u64>,
    #[serde(
        default,
        deserialize_with = "fleetops_actors::rules::whole::nullable_u64"
    )]
    configuration_id: Option<Option<u64>>,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_targets")]
    target_devices: Option<Vec<Value>>,
    /// `null` removes the plan.
    #[serde(default, deserialize_with = "nullable")]
    #[schemars(with = "Option<fleetops_actors::rules::rollouts::RolloutPlan>")]
    rollout: Option<Option<Value>>,
}

pub async fn patch(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("deployment_id", "Deployment")?;
    cx.rt().pipeline.exists("deployment", s.project.id, id)?;
    let b: PatchBody = cx.json(&mut req).await?;
    let p = DeploymentPatch {
        name: b.name,
        description: b.description,
        composition_tag: b.composition_tag,
        capsule_id: b.capsule_id,
        configuration_id: b.configuration_id,
        target_devices: b.target_devices,
        rollout: b.rollout,
    };
    body::ok(
        &cx.rt()
            .pipeline
            .update_deployment(s.project.id, id, p)
            .await?,
    )
}

pub async fn delete(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("deployment_id", "Deployment")?;
    cx.rt().pipeline.delete_deployment(s.project.id, id).await?;
    body::no_content()
}

pub async fn transition(cx: &mut Cx<'_>, req: Req, to: Transition) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("deployment_id", "Deployment")?;
    body::ok(&cx.rt().pipeline.transition(s.project.id, id, to).await?)
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "DeviceStatusReport")]
pub(crate) struct DeviceStatusBody {
    #[serde(deserialize_with = "fleetops_actors::rules::whole::u64")]
    device_id: u64,
    #[schemars(with = "fleetops_actors::RolloutStatus")]
    status: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<2000>")]
    message: Option<String>,
}

/// A member, or the device itself with its own token.
pub async fn device_status(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let org = req.param("org").to_string();
    let p = cx.authenticate(&req, Some(&org)).await?;
    let s = cx
        .rt()
        .access
        .ingestion(&p, &org, req.param("project"), Role::Member)?;
    let id = req.id("deployment_id", "Deployment")?;
    cx.rt().pipeline.exists("deployment", s.project.id, id)?;
    let b: DeviceStatusBody = cx.json(&mut req).await?;
    cx.rt().access.check_device(&p, b.device_id)?;
    body::accepted(
        &cx.rt()
            .pipeline
            .report(s.project.id, id, b.device_id, b.status, b.message, false)
            .await?,
    )
}

/// `GET /deployments/{id}/rollout` (viewer): 404 for a package without a phase plan.
pub async fn rollout(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("deployment_id", "Deployment")?;
    body::ok(&cx.rt().pipeline.rollout(s.project.id, id).await?)
}

/// `POST /deployments/{id}/rollout/{pause|resume|abort}` (member): 409 when the rollout's
/// state does not allow it.
pub async fn rollout_action(
    cx: &mut Cx<'_>,
    req: Req,
    action: fleetops_actors::pipeline::rollouts::RolloutAction,
) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("deployment_id", "Deployment")?;
    cx.rt().pipeline.exists("deployment", s.project.id, id)?;
    body::ok(
        &cx.rt()
            .pipeline
            .rollout_action(s.project.id, id, action)
            .await?,
    )
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "PolicyPatch")]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyBody {
    #[serde(default)]
    require_passed_test_run: Option<bool>,
}

/// `GET /policy` (viewer).
pub async fn policy(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(&cx.rt().pipeline.policy(s.project.id)?)
}

/// `PATCH /policy` (admin).
pub async fn set_policy(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let b: PolicyBody = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .pipeline
            .set_policy(s.project.id, b.require_passed_test_run)
            .await?,
    )
}
