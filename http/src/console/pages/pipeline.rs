//! The pipeline, a configuration's explanation, webhook deliveries, and alert rules with
//! their backtest's timeline.

use super::*;

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
pub(super) fn timeline(b: &fleetops_actors::alerts::backtest::BacktestView) -> Markup {
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
