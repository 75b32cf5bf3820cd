//! Integrations, alert rules and the alert history (project-scoped; admin to write, viewer
//! to read).

use fleetops_actors::alerts::{
    AlertFilter, BacktestRequest, IntegrationPatch, IntegrationRequest, RulePatchRequest,
    RuleRequest,
};
use fleetops_actors::rules::alert_conditions::is_server_wide;
use fleetops_actors::views::Items;
use fleetops_actors::{AlertState, Role};
use http::Response;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

pub async fn create_integration(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let b: IntegrationRequest = cx.json(&mut req).await?;
    body::created(&cx.rt().alerts.create_integration(s.project.id, b).await?)
}

pub async fn integrations(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(&Items {
        items: cx.rt().alerts.integrations(s.project.id)?,
    })
}

pub async fn integration(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("integration_id", "Integration")?;
    body::ok(&cx.rt().alerts.integration(s.project.id, id)?)
}

pub async fn patch_integration(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let id = req.id("integration_id", "Integration")?;
    cx.rt().alerts.integration(s.project.id, id)?;
    let b: IntegrationPatch = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .alerts
            .update_integration(s.project.id, id, b)
            .await?,
    )
}

pub async fn delete_integration(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let id = req.id("integration_id", "Integration")?;
    cx.rt().alerts.delete_integration(s.project.id, id).await?;
    body::no_content()
}

pub async fn test_integration(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let id = req.id("integration_id", "Integration")?;
    body::ok(
        &cx.rt()
            .alerts
            .test_integration(s.project.id, id, &s.project.slug)
            .await?,
    )
}

pub async fn create_rule(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (p, s) = cx.project(&req, Role::Admin).await?;
    let b: RuleRequest = cx.json(&mut req).await?;
    if is_server_wide(&b.condition) {
        cx.rt().access.require_superuser(&p)?;
    }
    body::created(&cx.rt().alerts.create_rule(s.project.id, b).await?)
}

pub async fn rules(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(&Items {
        items: cx.rt().alerts.rules(s.project.id)?,
    })
}

pub async fn rule(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("rule_id", "Alert rule")?;
    body::ok(&cx.rt().alerts.rule(s.project.id, id)?)
}

pub async fn patch_rule(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (p, s) = cx.project(&req, Role::Admin).await?;
    let id = req.id("rule_id", "Alert rule")?;
    cx.rt().alerts.rule(s.project.id, id)?;
    let b: RulePatchRequest = cx.json(&mut req).await?;
    if b.condition.as_ref().is_some_and(is_server_wide) {
        cx.rt().access.require_superuser(&p)?;
    }
    body::ok(&cx.rt().alerts.update_rule(s.project.id, id, b).await?)
}

pub async fn delete_rule(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let id = req.id("rule_id", "Alert rule")?;
    cx.rt().alerts.delete_rule(s.project.id, id).await?;
    body::no_content()
}

pub async fn list_alerts(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let state = req
        .query
        .get("state")
        .map(|v| {
            AlertState::parse(v)
                .ok_or_else(|| ApiError::unprocessable("state: must be firing or resolved"))
        })
        .transpose()?;
    let rule_id = req
        .query
        .get("rule_id")
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| ApiError::unprocessable("rule_id: must be a positive integer"))
        })
        .transpose()?;
    let page = req.query.page()?;
    body::ok(
        &cx.rt()
            .alerts
            .alerts(
                s.project.id,
                &AlertFilter {
                    state,
                    rule_id,
                    device_id: None,
                },
                page,
            )
            .await?,
    )
}

pub async fn alert(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("alert_id", "Alert")?;
    body::ok(&cx.rt().alerts.alert(s.project.id, id)?)
}

/// Reads only (nothing is sent), but scans history: members and above.
pub async fn backtest(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let b: BacktestRequest = cx.json(&mut req).await?;
    body::ok(&cx.rt().alerts.backtest(s.project.id, b).await?)
}
