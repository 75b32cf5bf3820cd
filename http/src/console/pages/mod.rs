//! The console's pages as maud templates: compiled into the binary, escaped by construction,
//! no script needed to read them. Each takes the views the REST API serves.

use std::collections::BTreeMap;

use fleetops_actors::UpdateState;
use fleetops_actors::alerts::backtest::LAST_HOURS;
use fleetops_actors::pipeline::rollouts::ShownState;
use fleetops_actors::views::{DeviceView, Page, SessionItem};
use maud::{DOCTYPE, Markup, html};

/// What every signed-in page shows in its header.
pub struct Chrome<'a> {
    pub email: &'a str,
    pub csrf: &'a str,
    /// `(org, project)` when the page is about one project.
    pub project: Option<(&'a str, &'a str)>,
}

pub fn layout(title: &str, chrome: Option<&Chrome<'_>>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fleetops" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                a class="skip" href="#main" { "Skip to content" }
                header {
                    a class="brand" href="/console" { "fleetops" }
                    @if let Some(c) = chrome {
                        @if let Some((org, project)) = c.project {
                            nav aria-label="Project" {
                                a href={ "/console/" (org) "/" (project) } { "Fleet" }
                                a href={ "/console/" (org) "/" (project) "/pipeline" } { "Pipeline" }
                                a href={ "/console/" (org) "/" (project) "/deployments" } { "Deployments" }
                                a href={ "/console/" (org) "/" (project) "/alerts" } { "Alerts" }
                                a href={ "/console/" (org) "/" (project) "/rules" } { "Alert rules" }
                                a href={ "/console/" (org) "/" (project) "/webhooks" } { "Webhooks" }
                            }
                        }
                        form class="signout" method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(c.csrf);
                            span class="who" { (c.email) }
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" { h1 { (title) } (body) }
            }
        }
    }
}

pub fn login(error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            @if let Some(e) = error { p class="error" role="alert" { (e) } }
            form method="post" action="/console/login" class="card" {
                label for="email" { "E-mail" }
                input id="email" name="email" type="email" autocomplete="username" required autofocus;
                label for="password" { "Password" }
                input id="password" name="password" type="password" autocomplete="current-password" required;
                button type="submit" id="signin" { "Sign in" }
            }
        },
    )
}

/// An organization's slug and name, and its projects' slugs and names.
pub type OrgProjects = (String, String, Vec<(String, String)>);

pub fn projects(chrome: &Chrome<'_>, orgs: &[OrgProjects]) -> Markup {
    layout(
        "Projects",
        Some(chrome),
        html! {
            @for (slug, name, projects) in orgs {
                section {
                    h2 { (name) " " small { "(" (slug) ")" } }
                    ul {
                        @for (p, pname) in projects {
                            li { a href={ "/console/" (slug) "/" (p) } { (pname) " (" (p) ")" } }
                        }
                    }
                }
            }
        },
    )
}

pub fn message(title: &str, chrome: Option<&Chrome<'_>>, text: &str) -> Markup {
    layout(title, chrome, html! { p role="alert" { (text) } })
}

/// A line's message as shown: at most 2,000 characters (the rest is marked, not sent).
fn clip(m: &str) -> std::borrow::Cow<'_, str> {
    match m.char_indices().nth(2000) {
        Some((i, _)) => format!("{}… ({} more bytes)", &m[..i], m.len() - i).into(),
        None => m.into(),
    }
}

/// A file path for a link, each segment percent-encoded.
fn encode_path(p: &str) -> String {
    p.split('/')
        .map(|s| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The stylesheet and the live tail's script, embedded.
pub const CSS: &str = include_str!("../console.css");
pub const JS: &str = include_str!("../console.js");

mod deployments;
mod devices;
mod pipeline;
mod sessions;

pub use deployments::*;
pub use devices::*;
pub use pipeline::*;
pub use sessions::*;
