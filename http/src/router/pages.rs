//! The console's part of the route table: its pages, each a method, a path and what serves
//! it.

use super::*;

/// The console's pages: HTML, served before the API's routes and not in the OpenAPI
/// document (`console/` renders them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// `/`: redirects to the console.
    Root,
    Css,
    Js,
    SignInForm,
    SignIn,
    SignOut,
    Home,
    DeviceList,
    Device,
    Alerts,
    Deployments,
    Rollout,
    RolloutAction,
    RetryDevice,
    Session,
    SessionExport,
    SessionFile,
    Pipeline,
    Configuration,
    Webhooks,
    Rules,
    Backtest,
}

/// One console page: its method, its path and what serves it.
pub struct PageDef {
    pub method: Method,
    pub path: &'static str,
    pub page: Page,
}

/// The console's part of the route table (looked up with empty segments left out).
pub fn pages() -> Vec<PageDef> {
    let page = |method: Method, path: &'static str, page: Page| PageDef { method, path, page };
    vec![
        page(Method::GET, "/", Page::Root),
        page(Method::GET, "/console", Page::Home),
        page(Method::GET, "/console/assets/console.css", Page::Css),
        page(Method::GET, "/console/assets/console.js", Page::Js),
        page(Method::GET, "/console/login", Page::SignInForm),
        page(Method::POST, "/console/login", Page::SignIn),
        page(Method::POST, "/console/logout", Page::SignOut),
        page(Method::GET, "/console/{org}/{project}", Page::DeviceList),
        page(
            Method::GET,
            "/console/{org}/{project}/devices/{id}",
            Page::Device,
        ),
        page(Method::GET, "/console/{org}/{project}/alerts", Page::Alerts),
        page(
            Method::GET,
            "/console/{org}/{project}/deployments",
            Page::Deployments,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/deployments/{id}",
            Page::Rollout,
        ),
        page(
            Method::POST,
            "/console/{org}/{project}/deployments/{id}/rollout/{action}",
            Page::RolloutAction,
        ),
        page(
            Method::POST,
            "/console/{org}/{project}/deployments/{id}/rollout/devices/{device}/retry",
            Page::RetryDevice,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/sessions/{id}",
            Page::Session,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/sessions/{id}/export",
            Page::SessionExport,
        ),
        // The file's path may be empty (the session's file named ""): answered as before.
        page(
            Method::GET,
            "/console/{org}/{project}/sessions/{id}/files",
            Page::SessionFile,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/sessions/{id}/files/{*path}",
            Page::SessionFile,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/pipeline",
            Page::Pipeline,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/configurations/{id}",
            Page::Configuration,
        ),
        page(
            Method::GET,
            "/console/{org}/{project}/webhooks",
            Page::Webhooks,
        ),
        page(Method::GET, "/console/{org}/{project}/rules", Page::Rules),
        page(
            Method::POST,
            "/console/{org}/{project}/rules/backtest",
            Page::Backtest,
        ),
    ]
}
