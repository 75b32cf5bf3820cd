//! The pipeline's page, a configuration's explanation, the webhook deliveries, and the
//! alert rules with their backtest.

use super::*;

pub(super) async fn pipeline_page(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let pid = scope.project.id;
    let capsules = app
        .rt
        .pipeline
        .capsules(pid, &fleetops_actors::pipeline::CapsuleFilter::default())?;
    let configs = app
        .rt
        .pipeline
        .configurations(
            pid,
            &fleetops_actors::pipeline::configurations::ConfigFilter::default(),
            fleetops_actors::views::PageReq {
                page: 1,
                page_size: 100,
            },
        )
        .await?;
    Ok(s.page(org, project, |chrome| {
        pages::pipeline(chrome, &capsules, &configs)
    }))
}

pub(super) async fn explain_page(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let id = parse_id(id, "Configuration")?;
    let e = app.rt.pipeline.explain(scope.project.id, id)?;
    Ok(s.page(org, project, |chrome| pages::explain(chrome, &e)))
}

pub(super) async fn webhooks_page(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let pid = scope.project.id;
    let run_status = req.query.get("run_status").filter(|v| !v.is_empty());
    let status = match run_status {
        None => None,
        Some(v) => Some(fleetops_actors::RunStatus::parse(v).ok_or_else(|| {
            ApiError::unprocessable(
                "run_status: must be queued, running, passed, failed or cancelled",
            )
        })?),
    };
    let page = fleetops_actors::views::PageReq {
        page: 1,
        page_size: 50,
    };
    let runs = app
        .rt
        .webhooks
        .runs(
            pid,
            &fleetops_actors::webhooks::RunFilter {
                status,
                repository: None,
                commit_sha: None,
            },
            page,
        )
        .await?;
    let deliveries = app
        .rt
        .webhooks
        .deliveries(
            Some(pid),
            &fleetops_actors::webhooks::DeliveryFilter {
                outcome: None,
                reason: None,
            },
            page,
        )
        .await?;
    Ok(s.page(org, project, |chrome| {
        pages::webhooks(chrome, &deliveries, &runs, run_status)
    }))
}

pub(super) async fn rules_page(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    rules_view(app, &s, scope.project.id, org, project, "", 24, None)
}

/// A backtest of a draft rule: a POST with the sign-in's CSRF token (it reads up to millions
/// of stored lines, so a reload or a link never starts one), a member's, as in the API.
pub(super) async fn backtest(
    app: &App,
    mut req: Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope, body)) = member_form(app, &mut req, org, project).await? else {
        return Ok(to_login());
    };
    let pid = scope.project.id;
    let condition = form1(&body, "condition")
        .unwrap_or_default()
        .trim()
        .to_string();
    let hours = form1(&body, "hours")
        .and_then(|h| h.trim().parse::<u64>().ok())
        .map_or(24, fleetops_actors::alerts::backtest::last_hours);
    let result = {
        match serde_json::from_str::<serde_json::Value>(&condition) {
            Err(e) => Err(format!("The condition is not JSON: {e}")),
            Ok(c) => match app.rt.alerts.backtest_last_hours(pid, c, hours).await {
                Ok(b) => Ok(b),
                // Logged once, by the error page.
                Err(e @ fleetops_actors::Error::Internal(_)) => return Err(ApiError::Domain(e)),
                Err(e) => Err(e.to_string()),
            },
        }
    };
    rules_view(app, &s, pid, org, project, &condition, hours, Some(&result))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rules_view(
    app: &App,
    s: &Signed,
    pid: u64,
    org: &str,
    project: &str,
    condition: &str,
    hours: u64,
    backtest: Option<&Result<fleetops_actors::alerts::backtest::BacktestView, String>>,
) -> Result<Response<Body>, ApiError> {
    let rules = app.rt.alerts.rules(pid)?;
    let integrations = app.rt.alerts.integrations(pid)?;
    Ok(s.page(org, project, |chrome| {
        pages::rules(
            chrome,
            &pages::RulesPage {
                rules: &rules,
                integrations: &integrations,
                condition,
                hours,
                backtest,
            },
        )
    }))
}
