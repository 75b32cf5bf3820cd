//! The console's home, a project's device list, a device's page and the
//! project's alerts.

use super::*;

pub(super) async fn home(app: &App, req: &Req) -> Result<Response<Body>, ApiError> {
    let Some(s) = signed(app, req)? else {
        return Ok(to_login());
    };
    let mut orgs = Vec::new();
    for o in app.rt.access.orgs(&s.principal)? {
        let projects = app
            .rt
            .access
            .projects(o.id)?
            .into_iter()
            .map(|p| (p.slug, p.name))
            .collect();
        orgs.push((o.slug, o.name, projects));
    }
    Ok(html(
        StatusCode::OK,
        pages::projects(&s.chrome(None), &orgs),
        s.refresh,
    ))
}

pub(super) async fn device_list(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((s, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let pid = scope.project.id;
    use fleetops_actors::projects::{DeviceFilter, DeviceStatus};
    let status = req.query.get("status").filter(|v| !v.is_empty());
    let name = req.query.get("name").filter(|v| !v.is_empty());
    let f = DeviceFilter {
        status: match status {
            None => None,
            Some(v) => Some(
                DeviceStatus::parse(v)
                    .ok_or_else(|| ApiError::unprocessable("status: must be online or offline"))?,
            ),
        },
        name: name.map(str::to_string),
    };
    let mut page = req.query.page()?;
    page.page_size = DEVICE_LIST_PAGE;
    let (counts, list) = app.rt.projects.devices_with_counts(pid, &f, page).await?;
    Ok(s.page(org, project, |chrome| {
        pages::device_list(
            chrome,
            counts,
            &pages::DeviceListFilter { status, name },
            &list,
        )
    }))
}

pub(super) fn parse_id(id: &str, what: &str) -> Result<u64, ApiError> {
    id.parse()
        .map_err(|_| ApiError::Domain(fleetops_actors::Error::not_found(what)))
}

pub(super) async fn device(
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
    let id = parse_id(id, "Device")?;
    let d = app.rt.projects.device(pid, id).await?;
    let metrics = app
        .rt
        .projects
        .metric_history(pid, id, 24, CHART_POINTS, CHART_SERIES)
        .await?;
    let sessions = app
        .rt
        .sessions
        .list(
            pid,
            &fleetops_actors::sessions::SessionFilter {
                device_id: Some(id),
                status: None,
                since: None,
                until: None,
            },
            fleetops_actors::views::PageReq {
                page: 1,
                page_size: 20,
            },
        )
        .await?;
    let history = app.rt.pipeline.device_history(pid, id).await?;
    let firing = app
        .rt
        .alerts
        .alerts(
            pid,
            &fleetops_actors::alerts::history::AlertFilter {
                state: Some(fleetops_actors::AlertState::Firing),
                rule_id: None,
                device_id: Some(id),
            },
            fleetops_actors::views::PageReq {
                page: 1,
                page_size: 50,
            },
        )
        .await?;
    let open = firing.items;
    Ok(s.page(org, project, |chrome| {
        pages::device(
            chrome,
            &pages::DevicePage {
                device: &d,
                metrics: &metrics,
                resolution_seconds: app.rt.alerts.history_resolution_seconds(),
                sessions: &sessions.items,
                history: &history,
                alerts: &open,
            },
        )
    }))
}

pub(super) async fn alerts(
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
        .alerts
        .alerts(
            scope.project.id,
            &fleetops_actors::alerts::history::AlertFilter::default(),
            page,
        )
        .await?;
    Ok(s.page(org, project, |chrome| pages::alerts(chrome, &list)))
}
