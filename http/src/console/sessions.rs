//! A session's page (its log lines, paged), its export and its files as downloads.

use super::*;

/// Lines a query page shows.
pub(super) const LOG_PAGE: usize = 200;

pub(super) async fn session_page(
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
    let id = parse_id(id, "Session")?;
    let detail = app.rt.sessions.detail(pid, id)?;
    let files = app.rt.sessions.artifacts(pid, id)?.items;
    // The API's own parsing of the filters (empty fields mean no filter).
    let mut q = req.query.clone();
    q.drop_empty();
    let filter = crate::handlers::sessions::log_filter_of(&q)?;
    let offset = q.u64("offset")?.unwrap_or(0) as usize;
    let logs = app
        .rt
        .sessions
        .logs(pid, id, filter, LOG_PAGE, offset)
        .await?;
    let get = |k: &str| req.query.get(k).unwrap_or("");
    let next = (offset.saturating_add(logs.items.len()) < logs.total).then(|| {
        let mut f = form_urlencoded::Serializer::new(String::new());
        for k in ["level", "module", "search", "since", "until"] {
            if !get(k).is_empty() {
                f.append_pair(k, get(k));
            }
        }
        f.append_pair("offset", &offset.saturating_add(LOG_PAGE).to_string());
        format!("?{}", f.finish())
    });
    let chrome = s.chrome(Some((org, project)));
    let form = pages::LogQueryForm {
        level: get("level"),
        module: get("module"),
        search: get("search"),
        since: get("since"),
        until: get("until"),
    };
    Ok(html(
        StatusCode::OK,
        pages::session(
            &chrome,
            &pages::SessionPage {
                detail: &detail,
                files: &files,
                logs: &logs,
                query: &form,
                next,
                ws: format!(
                    "/api/v1/ws/organizations/{org}/projects/{project}/sessions/{id}/logs?replay=200"
                ),
                export: format!("/console/{org}/{project}/sessions/{id}/export?{}", {
                    let mut f = form_urlencoded::Serializer::new(String::new());
                    for k in ["level", "module", "search", "since", "until"] {
                        if !get(k).is_empty() {
                            f.append_pair(k, get(k));
                        }
                    }
                    f.finish()
                }),
            },
        ),
        s.refresh.clone(),
    ))
}

/// The session's matching lines as a download (the API's export, streamed).
pub(super) async fn export(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((_, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let id = parse_id(id, "Session")?;
    let mut q = req.query.clone();
    q.drop_empty();
    // `nosniff` comes with the API's export.
    let r = crate::handlers::sessions::export_response(&app.rt, scope.project.id, id, &q)?;
    Ok(headers(r, None))
}

/// An artifact as a download. Robots upload these, so they are never shown inline under the
/// console's origin: `attachment`, `nosniff` and a sandboxing policy.
pub(super) async fn artifact(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
    id: &str,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let Some((_, scope)) = project_page(app, req, org, project, Role::Viewer)? else {
        return Ok(to_login());
    };
    let id = parse_id(id, "Session")?;
    let a = app.rt.sessions.artifact(scope.project.id, id, path)?;
    let stream = app.rt.sessions.artifact_bytes(&a, None).await?;
    let mut r = Response::new(crate::response::stream(stream));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    crate::response::attachment(h, path);
    if let Ok(v) = header::HeaderValue::from_str(&a.size_bytes.to_string()) {
        h.insert(header::CONTENT_LENGTH, v);
    }
    // The common headers (no-store, no framing), then the sandbox in place of the pages' CSP.
    let mut r = headers(r, None);
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    Ok(r)
}
