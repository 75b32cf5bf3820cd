//! The operator console: HTML pages at `/console` (and `/` redirects there), rendered on the
//! server from maud templates compiled into the binary (`pages.rs`), with one embedded
//! stylesheet and one small script of its own for the live tail. Pages read the same handles
//! the REST API calls, through its paginated, server-filtered queries. Like the API's
//! handlers, each page parses, authorizes (the signed-in user's roles, through `access`),
//! calls the runtime and renders; no business rule lives here, and permissions are the API's.
//!
//! Invariants a change must keep:
//! - Sign-in keeps the API's JWT in a cookie (`session.rs`); every page is charged to the user
//!   under the organization's rate limit and carries the API's `X-RateLimit-*` headers.
//! - A form that changes something is refused (403, nothing changed) unless a browser's
//!   `Origin`, when sent, is exactly this console's and the user has the role, both checked
//!   before its body (at most 8 KiB) is read, and unless it carries the sign-in's CSRF token.
//! - Every page is sent `no-store`, unframeable and under a strict `Content-Security-Policy`
//!   that runs no script but the console's own; a session's files are served only as
//!   downloads (`attachment`, `nosniff`, a sandboxing policy), never rendered under the
//!   console's origin.
//! - The live tail's WebSocket takes the cookie as its credential only when the handshake's
//!   `Origin` is exactly this console's ([`same_origin`]).
//!
//! Tested by the unit tests of `session.rs`, over plain HTTP, and in a real browser
//! (`tests/api/console.rs`: Debian's Chromium driven through chromedriver).

pub mod pages;
pub mod session;

use std::net::SocketAddr;

use bytes::Bytes;
use fleetops_actors::{Principal, Role};
use http::{Method, Response, StatusCode, header};
use hyper::body::Incoming;
use maud::Markup;

use crate::app::{App, Req};

use crate::error::ApiError;
use crate::response::Body;
use pages::Chrome;

/// Whether `path` is the console's (served before the API's route table).
pub fn owns(path: &str) -> bool {
    path == "/" || path == "/console" || path.starts_with("/console/")
}

/// Forms are small: sign-in, sign-out and rollout actions.
const FORM_LIMIT: usize = 8 * 1024;
/// Devices per fleet page.
const FLEET_PAGE: usize = 50;
/// A device page charts at most this many metrics, each with at most this many points.
const CHART_SERIES: usize = 16;
const CHART_POINTS: usize = 600;

tokio::task_local! {
    /// The rate-limit headers of the page being served, set where the page is charged
    /// (`signed`): every authenticated response carries them, as on the API.
    static RATE: std::cell::Cell<Option<crate::rate_limit::RateHeaders>>;
}

pub async fn handle(
    app: &App,
    parts: http::request::Parts,
    body: Incoming,
    peer: SocketAddr,
) -> Response<Body> {
    RATE.scope(std::cell::Cell::new(None), async {
        let mut r = route(app, parts, body, peer).await;
        if let Some(h) = RATE.with(|c| c.get()) {
            h.apply(r.headers_mut());
        }
        r
    })
    .await
}

async fn route(
    app: &App,
    parts: http::request::Parts,
    body: Incoming,
    peer: SocketAddr,
) -> Response<Body> {
    let path = parts.uri.path().to_string();
    let method = parts.method.clone();
    let req = match Req::new(parts, body, Vec::new(), peer, app.edge.clone()) {
        Ok(r) => r,
        Err(e) => return error_page(&e, None),
    };
    let segs: Vec<&str> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let r = match (&method, segs.as_slice()) {
        (&Method::GET, []) => Ok(redirect("/console", None)),
        (&Method::GET, ["console", "assets", "console.css"]) => {
            Ok(asset(pages::CSS, "text/css; charset=utf-8"))
        }
        (&Method::GET, ["console", "assets", "console.js"]) => {
            Ok(asset(pages::JS, "text/javascript; charset=utf-8"))
        }
        (&Method::GET, ["console", org, project, "sessions", id]) => {
            session_page(app, &req, org, project, id).await
        }
        (&Method::GET, ["console", org, project, "sessions", id, "export"]) => {
            export(app, &req, org, project, id).await
        }
        (&Method::GET, ["console", org, project, "sessions", id, "files", rest @ ..]) => {
            let path = rest
                .iter()
                .map(|p| {
                    percent_encoding::percent_decode_str(p)
                        .decode_utf8()
                        .map(|d| d.into_owned())
                        .map_err(|_| ApiError::bad_request("Path is not valid UTF-8"))
                })
                .collect::<Result<Vec<_>, _>>();
            match path {
                Ok(p) => artifact(app, &req, org, project, id, &p.join("/")).await,
                Err(e) => Err(e),
            }
        }
        (&Method::GET, ["console", org, project, "pipeline"]) => {
            pipeline_page(app, &req, org, project).await
        }
        (&Method::GET, ["console", org, project, "configurations", id]) => {
            explain_page(app, &req, org, project, id).await
        }
        (&Method::GET, ["console", org, project, "webhooks"]) => {
            webhooks_page(app, &req, org, project).await
        }
        (&Method::POST, ["console", org, project, "rules", "backtest"]) => {
            let (org, project) = (org.to_string(), project.to_string());
            backtest(app, req, &org, &project).await
        }
        (&Method::GET, ["console", org, project, "rules"]) => {
            rules_page(app, &req, org, project).await
        }
        (&Method::GET, ["console", "login"]) => Ok(html(StatusCode::OK, pages::login(None), None)),
        (&Method::POST, ["console", "login"]) => login(app, req).await,
        (&Method::POST, ["console", "logout"]) => logout(app, req).await,
        (&Method::GET, ["console"]) => home(app, &req).await,
        (&Method::GET, ["console", org, project]) => fleet(app, &req, org, project).await,
        (&Method::GET, ["console", org, project, "devices", id]) => {
            device(app, &req, org, project, id).await
        }
        (&Method::GET, ["console", org, project, "alerts"]) => {
            alerts(app, &req, org, project).await
        }
        (&Method::GET, ["console", org, project, "deployments"]) => {
            deployments(app, &req, org, project).await
        }
        (&Method::GET, ["console", org, project, "deployments", id]) => {
            rollout(app, &req, org, project, id).await
        }
        (
            &Method::POST,
            [
                "console",
                org,
                project,
                "deployments",
                id,
                "rollout",
                action,
            ],
        ) => {
            let (org, project, id, action) = (
                org.to_string(),
                project.to_string(),
                id.to_string(),
                action.to_string(),
            );
            rollout_action(app, req, &org, &project, &id, &action).await
        }
        (
            &Method::POST,
            [
                "console",
                org,
                project,
                "deployments",
                id,
                "rollout",
                "devices",
                device,
                "retry",
            ],
        ) => {
            let (org, project, id, device) = (
                org.to_string(),
                project.to_string(),
                id.to_string(),
                device.to_string(),
            );
            retry_device(app, req, &org, &project, &id, &device).await
        }
        _ => Err(ApiError::NotFoundRoute),
    };
    r.unwrap_or_else(|e| error_page(&e, None))
}

/// The signed-in user of a page, and the cookie that refreshes the session when due.
struct Signed {
    principal: Principal,
    token: String,
    email: String,
    /// The CSRF token of this sign-in (stable across refreshes).
    csrf: String,
    refresh: Option<String>,
}

impl Signed {
    /// A project page drawn inside this session's chrome: 200, with the refreshed cookie
    /// when one is due.
    fn page(
        &self,
        org: &str,
        project: &str,
        draw: impl FnOnce(&Chrome) -> Markup,
    ) -> Response<Body> {
        html(
            StatusCode::OK,
            draw(&self.chrome(Some((org, project)))),
            self.refresh.clone(),
        )
    }

    fn chrome<'a>(&'a self, project: Option<(&'a str, &'a str)>) -> Chrome<'a> {
        Chrome {
            email: &self.email,
            csrf: &self.csrf,
            project,
        }
    }
}

/// Whether the request came over TLS (through a trusted proxy: fleetops itself speaks
/// plain HTTP), so the cookie is `Secure`.
fn secure(app: &App, req: &Req) -> bool {
    req.from_trusted_proxy(&app.cfg.trusted_proxies)
        && req
            .header("x-forwarded-proto")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The session of the request, or `None` (the page redirects to sign-in). A token past half
/// its life is exchanged for a new one, as the API's refresh does (within its window). Every
/// page is charged to the user's bucket under the organization's rate limit, as the API is.
fn signed(app: &App, req: &Req) -> Result<Option<Signed>, ApiError> {
    let Some(token) = session::token(req.header("cookie")).map(str::to_string) else {
        return Ok(None);
    };
    let Ok(p) = app.rt.auth.resolve(&token) else {
        return Ok(None);
    };
    if !matches!(p.credential, fleetops_actors::auth::Credential::Jwt { .. }) {
        return Ok(None);
    }
    let Some(email) = p.user.as_ref().map(|u| u.email.clone()) else {
        return Ok(None);
    };
    // The organization a page is about (`/console/{org}/...`) sets the tier, as on the API.
    let org = req
        .parts
        .uri
        .path()
        .strip_prefix("/console/")
        .and_then(|r| r.split('/').next())
        .filter(|o| !o.is_empty() && *o != "login" && *o != "logout" && *o != "assets");
    let (tier, org_id) = app.rt.access.tier_for(&p, org)?;
    let charged = app.limits.check(
        &tier,
        crate::rate_limit::Bucket {
            caller: p.caller(),
            org_id,
        },
    );
    let rate = match &charged {
        Ok(h) | Err((_, h)) => *h,
    };
    let _ = RATE.try_with(|c| c.set(Some(rate)));
    charged.map_err(|(e, _)| e)?;
    let csrf = app.rt.auth.csrf_token(&p).unwrap_or_default();
    let ttl = app.rt.auth.token_ttl_seconds();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut out = Signed {
        principal: p,
        token,
        email,
        csrf,
        refresh: None,
    };
    if app
        .rt
        .auth
        .issued_at(&out.token)
        .is_some_and(|iat| session::needs_refresh(iat, now, ttl))
        && let Ok(t) = app.rt.auth.refresh(&out.principal)
    {
        out.refresh = Some(session::set(
            &t.access_token,
            t.expires_in,
            secure(app, req),
        ));
        out.token = t.access_token;
    }
    Ok(Some(out))
}

/// A project page's signed-in user and their scope in the project (at least `min`); `None`
/// when the page should send to sign-in.
fn project_page(
    app: &App,
    req: &Req,
    org: &str,
    project: &str,
    min: Role,
) -> Result<Option<(Signed, fleetops_actors::ProjectScope)>, ApiError> {
    let Some(s) = signed(app, req)? else {
        return Ok(None);
    };
    let scope = app.rt.access.project(&s.principal, org, project, min)?;
    Ok(Some((s, scope)))
}

fn to_login() -> Response<Body> {
    redirect("/console/login", None)
}

async fn login(app: &App, mut req: Req) -> Result<Response<Body>, ApiError> {
    let ip = req.client_ip(&app.cfg.trusted_proxies);
    // As the API's login: one in-flight slot per address, and the per-address limit.
    let _slot = app.edge.per_address(ip)?;
    app.limits.check_login(ip)?;
    // A sign-in posted from another site's page (login CSRF) is refused.
    if !origin_matches(app, &req, false) {
        return Err(ApiError::Domain(fleetops_actors::Error::Forbidden));
    }
    let bytes = req.body_bytes(FORM_LIMIT).await?;
    let (email, password) = form2(&bytes, "email", "password");
    app.limits.check_login_account(&email)?;
    match app.rt.auth.login(&email, &password).await {
        Ok(t) => Ok(redirect(
            "/console",
            Some(session::set(
                &t.access_token,
                t.expires_in,
                secure(app, &req),
            )),
        )),
        Err(fleetops_actors::Error::Unauthorized) => Ok(html(
            StatusCode::UNAUTHORIZED,
            pages::login(Some("Wrong e-mail or password.")),
            None,
        )),
        Err(e) => Err(ApiError::Domain(e)),
    }
}

/// A form that changes something: its CSRF field must be this sign-in's, and a browser's
/// `Origin`, when sent, must be this console's.
async fn checked_form(app: &App, req: &mut Req) -> Result<Option<(Signed, Bytes)>, ApiError> {
    Ok(checked_form_for(app, req, |_| Ok(()))
        .await?
        .map(|(s, (), b)| (s, b)))
}

/// As [`checked_form`], with `allowed` (a role check) run before the body is read, so a
/// caller without the role is told 403 whatever the body's size, as on the API.
async fn checked_form_for<T>(
    app: &App,
    req: &mut Req,
    allowed: impl FnOnce(&Signed) -> Result<T, ApiError>,
) -> Result<Option<(Signed, T, Bytes)>, ApiError> {
    let Some(s) = signed(app, req)? else {
        return Ok(None);
    };
    if !origin_matches(app, req, false) {
        return Err(ApiError::Domain(fleetops_actors::Error::Forbidden));
    }
    let t = allowed(&s)?;
    let bytes = req.body_bytes(FORM_LIMIT).await?;
    let given = form1(&bytes, "csrf");
    if !session::csrf_ok(&s.csrf, given.as_deref()) {
        return Err(ApiError::Domain(fleetops_actors::Error::Forbidden));
    }
    Ok(Some((s, t, bytes)))
}

/// Whether the request's `Origin` is this console's: the scheme (https when it came through
/// a trusted TLS proxy) and the `Host` the request names (a proxy must pass `Host` through).
/// Without an `Origin`, `required` decides; without a `Host`, no origin matches.
fn origin_matches(app: &App, req: &Req, required: bool) -> bool {
    let Some(origin) = req.header("origin") else {
        return !required;
    };
    // HTTP/2 names the host in `:authority`, not in a `Host` header.
    let Some(host) = req
        .header("host")
        .or_else(|| req.parts.uri.authority().map(|a| a.as_str()))
    else {
        return false;
    };
    let scheme = if secure(app, req) { "https" } else { "http" };
    origin.eq_ignore_ascii_case(&format!("{scheme}://{host}"))
}

/// Signs out for real: the sign-in the cookie's token descends from ends server-side (a
/// copy of the token is refused from now on, refreshes included), then the cookie goes.
async fn logout(app: &App, mut req: Req) -> Result<Response<Body>, ApiError> {
    match checked_form(app, &mut req).await? {
        None => Ok(to_login()),
        Some((s, _)) => {
            app.rt.directory.sign_out(&s.principal).await?;
            Ok(redirect(
                "/console/login",
                Some(session::clear(secure(app, &req))),
            ))
        }
    }
}

async fn home(app: &App, req: &Req) -> Result<Response<Body>, ApiError> {
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

async fn fleet(app: &App, req: &Req, org: &str, project: &str) -> Result<Response<Body>, ApiError> {
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
    page.page_size = FLEET_PAGE;
    let (counts, list) = app.rt.projects.fleet_page(pid, &f, page).await?;
    Ok(s.page(org, project, |chrome| {
        pages::fleet(chrome, counts, &pages::FleetFilter { status, name }, &list)
    }))
}

fn parse_id(id: &str, what: &str) -> Result<u64, ApiError> {
    id.parse()
        .map_err(|_| ApiError::Domain(fleetops_actors::Error::not_found(what)))
}

async fn device(
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

async fn alerts(
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

async fn deployments(
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

async fn rollout(
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

async fn rollout_action(
    app: &App,
    mut req: Req,
    org: &str,
    project: &str,
    id: &str,
    action: &str,
) -> Result<Response<Body>, ApiError> {
    let member = |s: &Signed| {
        Ok(app
            .rt
            .access
            .project(&s.principal, org, project, Role::Member)?)
    };
    let Some((s, scope, _)) = checked_form_for(app, &mut req, member).await? else {
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
async fn retry_device(
    app: &App,
    mut req: Req,
    org: &str,
    project: &str,
    id: &str,
    device: &str,
) -> Result<Response<Body>, ApiError> {
    let member = |s: &Signed| {
        Ok(app
            .rt
            .access
            .project(&s.principal, org, project, Role::Member)?)
    };
    let Some((s, scope, _)) = checked_form_for(app, &mut req, member).await? else {
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

/// Lines a query page shows.
const LOG_PAGE: usize = 200;

async fn session_page(
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
async fn export(
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
async fn artifact(
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

async fn pipeline_page(
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

async fn explain_page(
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

async fn webhooks_page(
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

async fn rules_page(
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
async fn backtest(
    app: &App,
    mut req: Req,
    org: &str,
    project: &str,
) -> Result<Response<Body>, ApiError> {
    let member = |s: &Signed| {
        Ok(app
            .rt
            .access
            .project(&s.principal, org, project, Role::Member)?)
    };
    let Some((s, scope, body)) = checked_form_for(app, &mut req, member).await? else {
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
fn rules_view(
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

/// Whether a WebSocket handshake comes from a console page: its `Origin` (a browser always
/// sends one) is this console's.
pub fn same_origin(app: &App, req: &Req) -> bool {
    origin_matches(app, req, true)
}

/// The first values of two fields of a form body.
fn form2(b: &[u8], a: &str, c: &str) -> (String, String) {
    (
        form1(b, a).unwrap_or_default(),
        form1(b, c).unwrap_or_default(),
    )
}

fn form1(b: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(b)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

fn headers(mut r: Response<Body>, cookie: Option<String>) -> Response<Body> {
    let h = r.headers_mut();
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    h.insert(
        header::X_FRAME_OPTIONS,
        header::HeaderValue::from_static("DENY"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("same-origin"),
    );
    if let Some(c) = cookie.and_then(|c| header::HeaderValue::from_str(&c).ok()) {
        h.append(header::SET_COOKIE, c);
    }
    r
}

fn html(status: StatusCode, m: Markup, cookie: Option<String>) -> Response<Body> {
    let mut r = Response::new(crate::response::full(m.into_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers(r, cookie)
}

fn redirect(to: &str, cookie: Option<String>) -> Response<Body> {
    let mut r = Response::new(crate::response::empty());
    *r.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(v) = header::HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    headers(r, cookie)
}

fn asset(text: &'static str, kind: &'static str) -> Response<Body> {
    let mut r = Response::new(crate::response::full(text));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("public, max-age=3600"),
    );
    r
}

fn error_page(e: &ApiError, chrome: Option<&Chrome<'_>>) -> Response<Body> {
    let status = e.status();
    let text = match e {
        ApiError::Domain(fleetops_actors::Error::Internal(cause)) => {
            tracing::error!(%cause, "console: internal error");
            "Something went wrong on the server; it was logged.".to_string()
        }
        ApiError::Domain(fleetops_actors::Error::Forbidden) => "Not enough permissions.".into(),
        ApiError::Domain(d) => d.to_string(),
        ApiError::NotFoundRoute => "No such page.".into(),
        ApiError::RateLimited { retry_after } => {
            format!("Too many requests. Try again in {retry_after} seconds.")
        }
        other => format!("{}", other.status()),
    };
    let mut r = html(
        status,
        pages::message(status.canonical_reason().unwrap_or("Error"), chrome, &text),
        None,
    );
    if let ApiError::RateLimited { retry_after } = e
        && let Ok(v) = header::HeaderValue::from_str(&retry_after.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}
