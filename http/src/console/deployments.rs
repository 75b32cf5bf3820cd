//! Deployments, a rollout's page, and the rollout actions and device retries it posts.

use super::*;

pub(super) async fn deployments(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let mut page = req.query.page()?;
    page.page_size = 50;
    let list = app
        .rt
        .pipeline
        .deployments(scope.project.id, None, page)
        .await?;
    Ok(s.page(org, project, |chrome| pages::deployments(chrome, &list)))
}

pub(super) async fn rollout(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let pid = scope.project.id;
    let id = parse_id(id, "Deployment")?;
    let p = app.rt.pipeline.rollout_page(pid, id).await?;
    let base = format!("/console/{org}/{project}/deployments/{id}/rollout");
    let actions = (scope.role >= Role::Member).then_some(base.as_str());
    Ok(s.page(org, project, |chrome| {
        pages::rollout(chrome, &p.name, p.rollout.as_ref(), actions, &p.blockers)
    }))
}

pub(super) async fn rollout_action(
    app: &App,
    mut req: Req,
    org: &str,
    project: &str,
    id: &str,
    action: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope, _)) = member_form(app, &mut req, org, project).await? else {
        return Ok(to_login());
    };
    let id = parse_id(id, "Deployment")?;
    use fleetops_actors::pipeline::rollouts::RolloutAction;
    let action = match action {
        "pause" => RolloutAction::Pause,
        "resume" => RolloutAction::Resume,
        _ => return Err(ApiError::NotFoundRoute),
    };
    app.rt
        .pipeline
        .rollout_action(scope.project.id, id, action)
        .await?;
    Ok(redirect(
        &format!("/console/{org}/{project}/deployments/{id}"),
        s.refresh,
    ))
}

/// A member's Retry of a device that failed the package: offered to it again.
pub(super) async fn retry_device(
    app: &App,
    mut req: Req,
    org: &str,
    project: &str,
    id: &str,
    device: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope, _)) = member_form(app, &mut req, org, project).await? else {
        return Ok(to_login());
    };
    let id = parse_id(id, "Deployment")?;
    let device = parse_id(device, "Device")?;
    app.rt
        .pipeline
        .retry_device(scope.project.id, id, device, s.principal.who())
        .await?;
    Ok(redirect(
        &format!("/console/{org}/{project}/deployments/{id}"),
        s.refresh,
    ))
}
