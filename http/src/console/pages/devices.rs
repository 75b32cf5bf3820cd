//! A project's device list (filtered and paged), a device's page with its
//! metric charts, and the project's alerts.

use super::*;

pub struct DeviceListFilter<'a> {
    pub status: Option<&'a str>,
    pub name: Option<&'a str>,
}

pub fn device_list(
    chrome: &Chrome<'_>,
    counts: fleetops_actors::projects::DeviceCounts,
    f: &DeviceListFilter<'_>,
    page: &Page<DeviceView>,
) -> Markup {
    let (org, project) = chrome.project.unwrap_or_default();
    let base = format!("/console/{org}/{project}");
    let fleetops_actors::projects::DeviceCounts {
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
pub(super) fn clock(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .map(|t| format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second()))
        .unwrap_or_default()
}

/// A small line chart of one metric, drawn on the server as SVG (no script): the samples the
/// heartbeat history keeps (at most one per `resolution` seconds), then the latest
/// heartbeat's value; one point is drawn as a dot. The time axis is labelled at both ends.
pub(super) fn chart(name: &str, points: &[(i64, f64)], resolution: u64) -> Markup {
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
pub(super) fn chart_series<'m, 's>(
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
