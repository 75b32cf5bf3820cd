//! A session's page: its lines with the query form, paged.

use super::*;

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
