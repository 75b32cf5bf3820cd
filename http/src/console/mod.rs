//! The operator console: HTML pages at `/console` (and `/` redirects there), rendered on the
//! server from maud templates compiled into the binary (`pages/`), with one embedded
//! stylesheet and one small script of its own for the live tail. Pages read the same handles
//! the REST API calls, through its paginated, server-filtered queries. Like the API's
//! handlers, each page parses, authorizes (the signed-in user's roles, through `access`),
//! calls the runtime and renders; no business rule lives here, and permissions are the API's.
//!
//! Invariants a change must keep:
//! - Sign-in (`signin.rs`) keeps the API's JWT in a cookie (`cookie.rs`); every page is charged to the user
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
//! Its pages are listed in the one route table (`router/pages.rs`, [`fn@crate::router::pages`]);
//! `route` serves the page the table names.
//!
//! Tested by the unit tests of `cookie.rs`, over plain HTTP, and in a real browser
//! (`tests/api/console/`: Debian's Chromium driven through chromedriver).

pub mod cookie;
mod deployments;
mod devices;
pub mod pages;
mod pipeline;
mod sessions;
mod signin;

use deployments::*;
use devices::*;
use pipeline::*;
use sessions::*;
use signin::*;

use std::net::SocketAddr;

use bytes::Bytes;
use fleetops_actors::{Principal, Role};
use http::{Response, StatusCode, header};
use hyper::body::Incoming;
use maud::Markup;

use crate::app::{App, Req};

use crate::error::ApiError;
use crate::response::Body;
use crate::router::Page;
use pages::Chrome;

/// Whether `path` is the console's (served before the API's route table).
pub fn owns(path: &str) -> bool {
    path == "/" || path == "/console" || path.starts_with("/console/")
}

/// Forms are small: sign-in, sign-out and rollout actions.
const FORM_LIMIT: usize = 8 * 1024;
/// Devices per page of the device list.
const DEVICE_LIST_PAGE: usize = 50;
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
    // Empty segments are ignored (`/console/` is `/console`), as browsers and proxies vary.
    let segs: Vec<&str> = parts
        .uri
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let page = app
        .router
        .page(&parts.method, &format!("/{}", segs.join("/")));
    let req = match Req::new(parts, body, Vec::new(), peer, app.edge.clone()) {
        Ok(r) => r,
        Err(e) => return error_page(&e, None),
    };
    let Some((page, params)) = page else {
        return error_page(&ApiError::NotFoundRoute, None);
    };
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map_or(String::new(), |(_, v)| v.clone())
    };
    let (org, project, id) = (param("org"), param("project"), param("id"));
    let (org, project, id) = (org.as_str(), project.as_str(), id.as_str());
    let r = match page {
        Page::Root => Ok(redirect("/console", None)),
        Page::Css => Ok(asset(pages::CSS, "text/css; charset=utf-8")),
        Page::Js => Ok(asset(pages::JS, "text/javascript; charset=utf-8")),
        Page::SignInForm => Ok(html(StatusCode::OK, pages::login(None), None)),
        Page::SignIn => login(app, req).await,
        Page::SignOut => logout(app, req).await,
        Page::Home => home(app, &req).await,
        Page::DeviceList => device_list(app, &req, org, project).await,
        Page::Device => device(app, &req, org, project, id).await,
        Page::Alerts => alerts(app, &req, org, project).await,
        Page::Deployments => deployments(app, &req, org, project).await,
        Page::Rollout => rollout(app, &req, org, project, id).await,
        Page::RolloutAction => rollout_action(app, req, org, project, id, &param("action")).await,
        Page::RetryDevice => retry_device(app, req, org, project, id, &param("device")).await,
        Page::Session => session_page(app, &req, org, project, id).await,
        Page::SessionExport => export(app, &req, org, project, id).await,
        Page::SessionFile => {
            let path = param("path")
                .split('/')
                .filter(|p| !p.is_empty())
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
        Page::Pipeline => pipeline_page(app, &req, org, project).await,
        Page::Configuration => explain_page(app, &req, org, project, id).await,
        Page::Webhooks => webhooks_page(app, &req, org, project).await,
        Page::Rules => rules_page(app, &req, org, project).await,
        Page::Backtest => backtest(app, req, org, project).await,
    };
    r.unwrap_or_else(|e| error_page(&e, None))
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
