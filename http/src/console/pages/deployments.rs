//! Deployments and a rollout's page (phases, members, actions).

use super::*;

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
