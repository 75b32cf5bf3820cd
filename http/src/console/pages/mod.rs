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

pub struct FleetFilter<'a> {
    pub status: Option<&'a str>,
    pub name: Option<&'a str>,
}

pub fn fleet(
    chrome: &Chrome<'_>,
    counts: fleetops_actors::projects::FleetCounts,
    f: &FleetFilter<'_>,
    page: &Page<DeviceView>,
) -> Markup {
    let (org, project) = chrome.project.unwrap_or_default();
    let base = format!("/console/{org}/{project}");
    let fleetops_actors::projects::FleetCounts {
        total,
        online,
        offline,
    } = counts;
    let link = |p: usize| {
        let mut q = vec![format!("page={p}")];
        if let Some(s) = f.status {
            q.push(format!("status={s}"));
        }
        if let Some(n) = f.name {
            q.push(format!("name={}", urlencode(n)));
        }
        format!("{base}?{}", q.join("&"))
    };
    layout(
        "Fleet",
        Some(chrome),
        html! {
            ul class="counts" aria-label="Device counts" {
                li { a href=(base) { strong id="count-total" { (total) } " devices" } }
                li class="online" { a href={ (base) "?status=online" } { strong id="count-online" { (online) } " online" } }
                li class="offline" { a href={ (base) "?status=offline" } { strong id="count-offline" { (offline) } " offline" } }
            }
            form method="get" action=(base) class="filters" role="search" {
                label for="q" { "Name (exact)" }
                input id="q" name="name" type="search" value=(f.name.unwrap_or(""));
                label for="status" { "Status" }
                select id="status" name="status" {
                    option value="" selected[f.status.is_none()] { "any" }
                    option value="online" selected[f.status == Some("online")] { "online" }
                    option value="offline" selected[f.status == Some("offline")] { "offline" }
                }
                button type="submit" { "Filter" }
            }
            table {
                caption { (page.total) " matching, page " (page.page) }
                thead { tr { th scope="col" { "Device" } th scope="col" { "Status" } th scope="col" { "Last seen" } th scope="col" { "Labels" } th scope="col" { "Groups" } } }
                tbody {
                    @for d in &page.items {
                        tr {
                            td { a class="device" href={ (base) "/devices/" (d.id) } { (d.name) } }
                            td { span class={ "status " (d.status) } { (d.status) } }
                            td { (d.last_seen_at.as_deref().unwrap_or("never")) }
                            td { @for (k, v) in &d.labels { code { (k) "=" (v) } " " } }
                            td { @for g in &d.group_ids { (g) " " } }
                        }
                    }
                }
            }
            nav aria-label="Pages" class="pages" {
                @if page.page > 1 { a rel="prev" href=(link(page.page - 1)) { "Previous" } }
                @if page.has_more { a rel="next" href=(link(page.page + 1)) { "Next" } }
            }
        },
    )
}

/// A number as a person reads it: integers whole, anything else to at most three decimals
/// (the stored value keeps every digit; the API shows them all).
pub(crate) fn num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A time of day, UTC, for a chart's axis.
fn clock(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map(|t| format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second()))
        .unwrap_or_default()
}

/// A small line chart of one metric, drawn on the server as SVG (no script): the samples the
/// heartbeat history keeps (at most one per `resolution` seconds), then the latest
/// heartbeat's value; one point is drawn as a dot. The time axis is labelled at both ends.
fn chart(name: &str, points: &[(i64, f64)], resolution: u64) -> Markup {
    let (w, plot_h, h) = (600.0, 120.0, 140.0);
    let (t0, t1) = (
        points.first().map_or(0, |p| p.0),
        points.last().map_or(0, |p| p.0),
    );
    let (lo, hi) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let span_t = ((t1 - t0) as f64).max(1.0);
    let span_v = (hi - lo).max(f64::EPSILON);
    let xy = |(t, v): &(i64, f64)| {
        let x = if t1 == t0 {
            w / 2.0
        } else {
            (*t - t0) as f64 / span_t * w
        };
        let y = if hi == lo {
            plot_h / 2.0
        } else {
            plot_h - (v - lo) / span_v * (plot_h - 10.0) - 5.0
        };
        (x, y)
    };
    let path: Vec<String> = points
        .iter()
        .map(|p| {
            let (x, y) = xy(p);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let n = points.len();
    html! {
        figure class="chart" {
            svg viewBox={ "0 0 " (w) " " (h) } role="img" aria-label={ (name) " over the last 24 hours, from " (num(lo)) " to " (num(hi)) } {
                @if n == 1 {
                    @let (x, y) = xy(&points[0]);
                    circle class="point" cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="4" fill="currentColor" {}
                } @else {
                    polyline fill="none" stroke="currentColor" stroke-width="2" points=(path.join(" ")) {}
                }
                text class="axis" x="0" y=(h - 2.0) text-anchor="start" { (clock(t0)) @if t1 == t0 { " UTC" } }
                @if t1 != t0 {
                    text class="axis" x=(w) y=(h - 2.0) text-anchor="end" { (clock(t1)) " UTC" }
                }
            }
            figcaption {
                (name) ": " (n) @if n == 1 { " point" } @else { " points" }
                " (one kept per " (resolution) " s at most, and the latest heartbeat), min "
                (num(lo)) ", max " (num(hi))
            }
        }
    }
}

pub struct DevicePage<'a> {
    pub device: &'a DeviceView,
    pub metrics: &'a [(i64, BTreeMap<String, f64>)],
    /// The heartbeat history keeps at most one sample per device per this many seconds.
    pub resolution_seconds: u64,
    pub sessions: &'a [SessionItem],
    pub history: &'a fleetops_actors::pipeline::updates::DeviceHistory,
    pub alerts: &'a [fleetops_actors::alerts::history::AlertView],
}

/// The samples of metric `k`'s chart, `None` past 16 charts (whatever names a robot sends).
fn chart_series<'m, 's>(
    series: &'s mut BTreeMap<&'m str, Vec<(i64, f64)>>,
    k: &'m str,
) -> Option<&'s mut Vec<(i64, f64)>> {
    if series.len() >= 16 && !series.contains_key(k) {
        return None;
    }
    Some(series.entry(k).or_default())
}

pub fn device(chrome: &Chrome<'_>, p: &DevicePage<'_>) -> Markup {
    let d = p.device;
    let mut series: BTreeMap<&str, Vec<(i64, f64)>> = BTreeMap::new();
    for (t, m) in p.metrics {
        for (k, v) in m {
            if let Some(s) = chart_series(&mut series, k) {
                s.push((*t, *v));
            }
        }
    }
    // The latest heartbeat's values end each chart, so it agrees with "Latest metrics" even
    // when that heartbeat came too soon after the last kept sample to be kept itself.
    let last_seen = d.last_seen_at.as_deref().and_then(|s| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
            .ok()
            .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
    });
    if let Some(at) = last_seen {
        for (k, v) in &d.metrics {
            if let Some(s) = chart_series(&mut series, k)
                && s.last().is_none_or(|(t, _)| *t < at)
            {
                s.push((at, *v));
            }
        }
    }
    layout(
        &d.name,
        Some(chrome),
        html! {
            dl class="facts" {
                dt { "Status" } dd { span id="device-status" class={ "status " (d.status) } { (d.status) } }
                dt { "Last seen" } dd { (d.last_seen_at.as_deref().unwrap_or("never")) }
                dt { "Labels" } dd { @for (k, v) in &d.labels { code { (k) "=" (v) } " " } }
                dt { "Latest metrics" } dd { @for (k, v) in &d.metrics { code { (k) "=" (num(*v)) } " " } }
            }
            h2 { "Metrics" }
            @if series.is_empty() { p { "No heartbeat metrics kept." } }
            @for (name, points) in &series { (chart(name, points, p.resolution_seconds)) }
            h2 { "Open alerts" }
            @if p.alerts.is_empty() { p { "None." } }
            ul { @for a in p.alerts { li { strong { (a.rule_name) } " — " (a.summary) " (since " (a.fired_at) ")" } } }
            h2 { "Sessions" }
            table {
                thead { tr { th scope="col" { "Session" } th scope="col" { "Status" } th scope="col" { "Started" } th scope="col" { "Tags" } } }
                tbody {
                    @for s in p.sessions {
                        tr {
                            td { a class="session" href={ "/console/" (chrome.project.unwrap_or_default().0) "/" (chrome.project.unwrap_or_default().1) "/sessions/" (s.id) } { "Session " (s.id) } }
                            td { (s.status) } td { (s.started_at) } td { (s.tags.join(", ")) }
                        }
                    }
                }
            }
            h2 { "Deployment history" }
            table {
                thead { tr { th scope="col" { "Package" } th scope="col" { "Capsule" } th scope="col" { "State" } th scope="col" { "Last report" } } }
                tbody {
                    @for h in &p.history.items {
                        tr {
                            td { (h.deployment_name.as_deref().unwrap_or("(deleted)")) " #" (h.deployment_id) }
                            td { @if let Some(c) = &h.capsule { (c.name) " " (c.version) } }
                            td { (h.state) }
                            td { (h.last_reported_at) }
                        }
                    }
                }
            }
        },
    )
}

pub fn alerts(
    chrome: &Chrome<'_>,
    page: &Page<fleetops_actors::alerts::history::AlertView>,
) -> Markup {
    layout(
        "Alerts",
        Some(chrome),
        html! {
            table {
                caption { (page.total) " alerts, newest first" }
                thead { tr { th scope="col" { "Rule" } th scope="col" { "State" } th scope="col" { "Device" } th scope="col" { "Summary" } th scope="col" { "Fired" } th scope="col" { "Notifications" } } }
                tbody {
                    @for a in &page.items {
                        tr class={ "alert " (a.state) } {
                            td { (a.rule_name) }
                            td { span class={ "state " (a.state) } { (a.state) } }
                            td { @if let Some(d) = a.device_id { (d) } @else { "the server" } }
                            td { (a.summary) }
                            td { (a.fired_at) }
                            td {
                                @for n in &a.notifications {
                                    span class="notification" {
                                        "integration " (n.integration_id) ": "
                                        @if n.pending { "pending" } @else if n.success { "delivered" } @else { "failed" }
                                        @if let Some(e) = &n.last_error { " (" (e) ")" }
                                    }
                                    " "
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub fn deployments(
    chrome: &Chrome<'_>,
    page: &Page<fleetops_actors::pipeline::deployments::DeploymentView>,
) -> Markup {
    let (org, project) = chrome.project.unwrap_or_default();
    layout(
        "Deployments",
        Some(chrome),
        html! {
            table {
                thead { tr { th scope="col" { "Package" } th scope="col" { "Status" } th scope="col" { "Capsule" } th scope="col" { "Activated" } } }
                tbody {
                    @for d in &page.items {
                        tr {
                            td { a href={ "/console/" (org) "/" (project) "/deployments/" (d.id) } { (d.name) } }
                            td { (d.deployment_status) }
                            td { (d.capsule_id) }
                            td { (d.deployed_at.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        },
    )
}

pub fn rollout(
    chrome: &Chrome<'_>,
    name: &str,
    r: Option<&fleetops_actors::pipeline::rollouts::RolloutView>,
    // `None` for a viewer: no pause or resume offered.
    action_base: Option<&str>,
    blockers: &[fleetops_actors::pipeline::deployments::Blocker],
) -> Markup {
    layout(
        name,
        Some(chrome),
        html! {
            @if !blockers.is_empty() {
                h2 { "What blocks activating it" }
                ul id="blockers" { @for b in blockers { li { (b.status) " " code { (b.field) } ": " (b.reason) } } }
            }
            @match r {
                None => p { "This package has no phased rollout: it reaches every target at activation." }
                Some(r) => {
                    p { "Rollout: " strong id="rollout-state" { (r.state.as_str()) }
                        @if let Some(c) = &r.current_phase { ", phase " strong id="current-phase" { (c) } } }
                    @if let Some(base) = action_base {
                        @if matches!(r.state, ShownState::Running | ShownState::Paused) {
                            form method="post" action={ (base) "/" (if r.state == ShownState::Running { "pause" } else { "resume" }) } {
                                input type="hidden" name="csrf" value=(chrome.csrf);
                                button type="submit" id="rollout-action" { (if r.state == ShownState::Running { "Pause" } else { "Resume" }) }
                            }
                        }
                    }
                    ol class="phases" {
                        @for p in &r.phases {
                            li class={ "phase " (p.status) } {
                                h2 { (p.name) " — " (p.status) }
                                label { (p.counts.succeeded) " of " (p.device_count) " succeeded, "
                                    (p.counts.failed + p.counts.rolled_back + p.counts.rollback_failed) " failed"
                                    progress max=(p.device_count.max(1)) value=(p.counts.succeeded) {} }
                                @let failed: Vec<_> = p.devices.iter().filter(|d| matches!(d.state, Some(UpdateState::Failed | UpdateState::RolledBack | UpdateState::RollbackFailed))).collect();
                                @if !failed.is_empty() {
                                    table class="failed-devices" {
                                        thead { tr { th scope="col" { "Device" } th scope="col" { "State" } th scope="col" { "Why" } th {} } }
                                        tbody {
                                            @for d in failed {
                                                tr {
                                                    td { (d.name) } td { (d.state.map_or("", |s| s.as_str())) }
                                                    td { (d.message.as_deref().unwrap_or("")) }
                                                    td { @if let Some(base) = action_base {
                                                        form method="post" action={ (base) "/devices/" (d.id) "/retry" } {
                                                            input type="hidden" name="csrf" value=(chrome.csrf);
                                                            button type="submit" class="retry" id={ "retry-" (d.id) } { "Retry" }
                                                        }
                                                    } }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    h2 { "Decisions" }
                    table {
                        thead { tr { th scope="col" { "At" } th scope="col" { "Phase" } th scope="col" { "Action" } th scope="col" { "Reason" } } }
                        tbody { @for d in &r.decisions { tr { td { (d.at) } td { (d.phase) } td { (d.action) } td { (d.reason) } } } }
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
pub const CSS: &str = include_str!("console.css");
pub const JS: &str = include_str!("console.js");

pub struct SessionPage<'a> {
    pub detail: &'a fleetops_actors::views::SessionDetail,
    pub files: &'a [fleetops_actors::views::ArtifactView],
    pub logs: &'a fleetops_actors::views::LogPage,
    pub query: &'a LogQueryForm<'a>,
    /// Where the query's next page is, if any.
    pub next: Option<String>,
    /// The WebSocket path of the live tail.
    pub ws: String,
    /// The export's path with this query's filters (`format` is appended).
    pub export: String,
}

/// The log query's fields as the reader typed them.
pub struct LogQueryForm<'a> {
    pub level: &'a str,
    pub module: &'a str,
    pub search: &'a str,
    pub since: &'a str,
    pub until: &'a str,
}

pub fn session(chrome: &Chrome<'_>, p: &SessionPage<'_>) -> Markup {
    let s = &p.detail.item;
    let q = p.query;
    layout(
        &format!("Session {} on {}", s.id, s.device_name),
        Some(chrome),
        html! {
            dl class="facts" {
                dt { "Status" } dd { (s.status) }
                dt { "Started" } dd { (s.started_at) }
                dt { "Lines" } dd { (p.detail.metrics.log_count) }
                dt { "Tags" } dd { (s.tags.join(", ")) }
            }
            section id="tail" data-ws=(p.ws) aria-labelledby="tail-h" {
                h2 id="tail-h" { "Live tail" }
                p id="tail-status" role="status" aria-live="polite" { "Connecting…" }
                button type="button" id="tail-resume" hidden { "Resume" }
                ol id="tail-lines" class="lines tail" tabindex="0" aria-label="Live log lines" data-received="0" {}
            }
            h2 { "Query" }
            form method="get" class="filters" role="search" {
                label for="level" { "Level" }
                select id="level" name="level" {
                    @for l in ["", "debug", "info", "warn", "error"] {
                        option value=(l) selected[q.level == l] { (if l.is_empty() { "any" } else { l }) }
                    }
                }
                label for="module" { "Module" }
                input id="module" name="module" value=(q.module);
                label for="search" { "Text" }
                input id="search" name="search" type="search" value=(q.search);
                label for="since" { "Since" }
                input id="since" name="since" placeholder="2026-01-01T00:00:00Z" value=(q.since);
                label for="until" { "Until" }
                input id="until" name="until" placeholder="2026-01-02T00:00:00Z" value=(q.until);
                button type="submit" { "Search" }
            }
            p id="log-total" { (p.logs.total) " matching lines" }
            ol class="lines" id="log-lines" {
                @for e in &p.logs.items {
                    li class={ "lvl-" (e.level) } { (e.timestamp) " " (e.level.to_uppercase()) " [" (e.module) "] " (clip(&e.message)) }
                }
            }
            @if let Some(n) = &p.next { a rel="next" href=(n) { "More" } }
            @if !p.files.is_empty() {
                h2 { "Files" @if p.files.len() > 500 { " (the first 500 of " (p.files.len()) ")" } }
                ul id="files" {
                    @for f in p.files.iter().take(500) {
                        li { a class="file" href={ "/console/" (chrome.project.unwrap_or_default().0) "/" (chrome.project.unwrap_or_default().1) "/sessions/" (s.id) "/files/" (encode_path(&f.path)) } download { (f.path) } " (" (f.size_bytes) " bytes, " (f.content_type) ")" }
                    }
                }
            }
            p {
                "Download the matching lines: "
                a id="export-csv" href={ (p.export) "&format=csv" } { "CSV" } " · "
                a href={ (p.export) "&format=json" } { "JSON" }
            }
        },
    )
}

pub fn pipeline(
    chrome: &Chrome<'_>,
    capsules: &[fleetops_actors::pipeline::CapsuleItem],
    configs: &Page<fleetops_actors::pipeline::configurations::ConfigurationView>,
) -> Markup {
    let (org, project) = chrome.project.unwrap_or_default();
    layout(
        "Pipeline",
        Some(chrome),
        html! {
            h2 { "Capsules" }
            table {
                caption { (capsules.len()) " versions" @if capsules.len() > 500 { ", the newest 500 shown" } }
                thead { tr { th scope="col" { "Name" } th scope="col" { "Version" } th scope="col" { "Type" } th scope="col" { "Size" } th scope="col" { "Validation" } th scope="col" { "Latest" } } }
                tbody {
                    @for c in capsules.iter().take(500) {
                        tr { td { (c.name) } td { (c.version) } td { (c.capsule_type) } td { (c.file_size_bytes) } td { (c.validation_status) } td { @if c.is_latest { "latest" } } }
                    }
                }
            }
            h2 { "Configurations" }
            table {
                caption { (configs.total) " configurations" @if configs.has_more { ", the first " (configs.items.len()) " shown" } }
                thead { tr { th scope="col" { "Name" } th scope="col" { "Version" } th scope="col" { "Environment" } th scope="col" { "Validation" } th scope="col" { "Keys" } } }
                tbody {
                    @for c in &configs.items {
                        tr {
                            td { (c.name) }
                            td { (c.version) }
                            td { (c.environment) }
                            td { (c.validation_status) }
                            td { a class="explain" href={ "/console/" (org) "/" (project) "/configurations/" (c.id) } { "Who set what" } }
                        }
                    }
                }
            }
        },
    )
}

pub fn explain(
    chrome: &Chrome<'_>,
    e: &fleetops_actors::pipeline::configurations::Explain,
) -> Markup {
    layout(
        &format!("{} {}", e.name, e.version),
        Some(chrome),
        html! {
            p { "Validation: " strong { (e.validation_status) } ". Chain (root first): "
                @for (i, c) in e.chain.iter().enumerate() { @if i > 0 { " → " } (c.name) " " (c.version) } }
            @if let Some(s) = &e.schema_from { p { "Schema from " (s.name) " " (s.version) } }
            table {
                caption { "Every key of the effective configuration and the configuration that set it" }
                thead { tr { th scope="col" { "Key (JSON Pointer)" } th scope="col" { "Value" } th scope="col" { "Set by" } } }
                tbody {
                    @for s in &e.sources {
                        tr { td { code { (s.pointer) } } td { code { (s.value.to_string()) } } td { (s.set_by.name) " " (s.set_by.version) } }
                    }
                }
            }
            @if !e.schema_errors.is_empty() {
                h2 { "Schema errors" }
                ul { @for x in &e.schema_errors { li { code { (x.pointer) } ": " (x.message) } } }
            }
        },
    )
}

pub fn webhooks(
    chrome: &Chrome<'_>,
    deliveries: &Page<fleetops_actors::webhooks::DeliveryView>,
    runs: &Page<fleetops_actors::webhooks::TestRunView>,
    run_status: Option<&str>,
) -> Markup {
    layout(
        "Webhooks and test runs",
        Some(chrome),
        html! {
            h2 { "Test runs" }
            form method="get" class="filters" {
                label for="run_status" { "Status" }
                select id="run_status" name="run_status" {
                    @for st in ["", "queued", "running", "passed", "failed", "cancelled"] {
                        option value=(st) selected[run_status.unwrap_or("") == st] { (if st.is_empty() { "any" } else { st }) }
                    }
                }
                button type="submit" { "Filter" }
            }
            table {
                caption { (runs.total) " runs" }
                thead { tr { th scope="col" { "Run" } th scope="col" { "Status" } th scope="col" { "Repository" } th scope="col" { "Commit" } th scope="col" { "Ref" } th scope="col" { "Event" } th scope="col" { "Attempt" } } }
                tbody {
                    @for r in &runs.items {
                        tr { td { (r.id) } td { span class={ "run " (r.status) } { (r.status) } } td { (r.repository) } td { code { (r.commit_sha.get(..12).unwrap_or(&r.commit_sha)) } } td { (r.git_ref) } td { (r.event) } td { (r.attempt) } }
                    }
                }
            }
            h2 { "Delivery log" }
            table {
                caption { (deliveries.total) " deliveries, newest first" }
                thead { tr { th scope="col" { "Received" } th scope="col" { "Event" } th scope="col" { "Outcome" } th scope="col" { "Reason" } th scope="col" { "Repository" } th scope="col" { "Test run" } } }
                tbody {
                    @for d in &deliveries.items {
                        tr {
                            td { (d.received_at) }
                            td { (d.event) @if let Some(a) = &d.action { "." (a) } }
                            td { (d.outcome.as_str()) }
                            td { (d.reason.as_deref().unwrap_or("")) }
                            td { (d.repository.as_deref().unwrap_or("")) }
                            td { @if let Some(t) = d.test_run_id { (t) } }
                        }
                    }
                }
            }
        },
    )
}

pub struct RulesPage<'a> {
    pub rules: &'a [fleetops_actors::alerts::rules::RuleView],
    pub integrations: &'a [fleetops_actors::alerts::integrations::IntegrationView],
    pub condition: &'a str,
    pub hours: u64,
    pub backtest: Option<&'a Result<fleetops_actors::alerts::backtest::BacktestView, String>>,
}

/// When a draft rule would have fired: one row per device, a mark per firing, on a shared
/// time axis (server-drawn SVG).
fn timeline(b: &fleetops_actors::alerts::backtest::BacktestView) -> Markup {
    let t0 = fleetops_actors::clock::parse_ms(&b.from).unwrap_or(0);
    let t1 = fleetops_actors::clock::parse_ms(&b.to).unwrap_or(t0 + 1);
    let span = ((t1 - t0) as f64).max(1.0);
    let rows = b.devices.len().min(50);
    let h = 20 * rows.max(1) + 10;
    html! {
        svg viewBox={ "0 0 600 " (h) } class="timeline" role="img" aria-label={ "Firings of " (b.devices.len()) " devices between " (b.from) " and " (b.to) } {
            @for (i, d) in b.devices.iter().take(50).enumerate() {
                // At most 200 marks a device; more would not be told apart at this width.
                @for f in d.firings.iter().take(200) {
                    @let a = fleetops_actors::clock::parse_ms(&f.fired_at).unwrap_or(t0);
                    @let z = f.resolved_at.as_deref().and_then(fleetops_actors::clock::parse_ms).unwrap_or(t1);
                    rect x=(format!("{:.1}", (a - t0) as f64 / span * 600.0)) y=(i * 20 + 5) width=(format!("{:.1}", ((z - a) as f64 / span * 600.0).max(2.0))) height="14" fill="currentColor" {}
                }
            }
        }
    }
}

pub fn rules(chrome: &Chrome<'_>, p: &RulesPage<'_>) -> Markup {
    layout(
        "Alert rules",
        Some(chrome),
        html! {
            table {
                caption { (p.rules.len()) " rules" }
                thead { tr { th scope="col" { "Rule" } th scope="col" { "Condition" } th scope="col" { "Severity" } th scope="col" { "Integrations" } th scope="col" { "Enabled" } } }
                tbody {
                    @for r in p.rules {
                        tr { td { (r.name) } td { code { (r.condition.to_string()) } } td { (r.severity) } td { @for i in &r.integration_ids { (i) " " } } td { (if r.enabled { "yes" } else { "no" }) } }
                    }
                }
            }
            h2 { "Integrations" }
            table {
                thead { tr { th scope="col" { "Integration" } th scope="col" { "Type" } th scope="col" { "Enabled" } th scope="col" { "Configuration (secrets masked)" } } }
                tbody {
                    @for i in p.integrations {
                        tr { td { (i.name) " #" (i.id) } td { (i.kind) } td { (if i.enabled { "yes" } else { "no" }) } td { code { (i.config.to_string()) } } }
                    }
                }
            }
            h2 { "Backtest a draft rule" }
            form method="post" action={ "/console/" (chrome.project.unwrap_or_default().0) "/" (chrome.project.unwrap_or_default().1) "/rules/backtest" } class="card" {
                input type="hidden" name="csrf" value=(chrome.csrf);
                label for="condition" { "Condition (JSON, as in the API)" }
                textarea id="condition" name="condition" rows="4" cols="60" { (p.condition) }
                label for="hours" { "Hours back" }
                input id="hours" name="hours" type="number" min=(LAST_HOURS.start()) max=(LAST_HOURS.end()) value=(p.hours);
                button type="submit" id="backtest" { "Backtest" }
            }
            @match p.backtest {
                None => {}
                Some(Err(e)) => p class="error" role="alert" { (e) }
                Some(Ok(b)) => {
                    p id="backtest-result" { (b.devices.len()) " of " (b.devices_evaluated) " devices would have fired between " (b.from) " and " (b.to) }
                    @if b.truncated { p role="alert" { "The log-line budget ran out: later lines were not read." } }
                    @if b.devices.len() > 50 { p { "The first 50 devices are drawn." } }
                    (timeline(b))
                    ul { @for d in b.devices.iter().take(50) { li { (d.device_name) ": " (d.firings.len()) " firings" } } }
                }
            }
        },
    )
}
