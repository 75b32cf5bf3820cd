//! Prometheus metrics of the edge and the runtime, rendered on `/metrics`. Labels are static
//! strings and integers, so recording a request allocates nothing.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// The route's path template, e.g. `/api/v1/organizations/{org}/devices`.
    route: &'static str,
    method: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActorLabels {
    /// The family of keyed actors (`project`, `session`, ...).
    actor: &'static str,
}

/// Figures the runtime keeps itself, read at each scrape.
#[derive(Debug, Default, Clone)]
pub struct RuntimeFigures {
    pub restarts: u64,
    pub log_batches_dropped: u64,
    pub evaluator_busy_seconds: f64,
    pub connections_open: i64,
    pub connection_waits: u64,
    pub header_timeouts: u64,
    pub keepalive_timeouts: u64,
    pub idle_closes: u64,
    pub body_timeouts: u64,
    pub body_budget_refusals: u64,
    pub body_budget_peak_bytes: u64,
    pub large_body_waits: u64,
    pub paced_waits: u64,
    pub live_batches_skipped: u64,
    pub bus_published: u64,
    pub bus_received: u64,
    pub bus_dropped: u64,
    pub bus_rejected: u64,
    pub session_actors: u64,
    pub per_address_refusals: u64,
    pub connection_refusals: u64,
    pub slow_uploads: u64,
    /// Per family of keyed actors: calls in all mailboxes, and in the fullest one.
    pub mailbox_depths: Vec<(&'static str, usize, usize)>,
    pub log_lines_ingested: u64,
    pub log_batches_sealed: u64,
    pub log_chunks_sealed: u64,
    pub log_seals_failed: u64,
    pub log_segments_written: u64,
    pub log_segment_bytes_written: u64,
    pub log_chunk_fetches: u64,
    pub log_chunk_cache_hits: u64,
    pub data_dir_free_bytes: u64,
    pub data_dir_min_free_bytes: u64,
    pub webhook_deliveries_queued: u64,
    pub webhook_deliveries_recovered: u64,
    pub notifications_sent: u64,
    pub notifications_retried: u64,
    pub notifications_failed: u64,
    pub orgs_being_deleted: u64,
}

/// The plain gauges: names and values are arrays of this length, so one added to one list
/// and not the other does not compile (a zip would drop the last one silently).
const EDGE: usize = 35;

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    /// How long each poll of a request's handler held its async thread: a blocking call in a
    /// handler shows here as a long poll.
    pub polls: std::sync::Arc<PollTimes>,
    restarts: Gauge,
    log_batches_dropped: Gauge,
    evaluator_busy: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The edge's limits: open connections, and how often each limit was hit.
    edge: [Gauge; EDGE],
    mailbox_waiting: Family<ActorLabels, Gauge>,
    mailbox_deepest: Family<ActorLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn method_label(m: &http::Method) -> &'static str {
    match *m {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

impl Metrics {
    /// Adds a histogram of durations kept elsewhere (the store's group-commit fsyncs).
    pub fn register_timings(
        &mut self,
        name: &'static str,
        help: &'static str,
        timings: std::sync::Arc<fleetops_actors::timings::Timings>,
    ) {
        self.registry.register_collector(Box::new(TimingsMetric {
            name,
            help,
            timings,
        }));
    }

    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fleetops");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route, method and status",
            requests.clone(),
        );
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 16))
        });
        registry.register(
            "http_request_duration_seconds",
            "Time to the response head, by route",
            latency.clone(),
        );
        let polls = std::sync::Arc::new(PollTimes::default());
        registry.register_collector(Box::new(TimingsMetric {
            name: "http_task_poll_seconds",
            help: "Time one poll of a request's handler held an async worker thread",
            timings: polls.clone(),
        }));
        let restarts = Gauge::default();
        registry.register(
            "actor_restarts",
            "Actor restarts by supervisors since start-up",
            restarts.clone(),
        );
        let log_batches_dropped = Gauge::default();
        registry.register(
            "alert_log_batches_dropped",
            "Log batches the alert evaluators did not see (over [alerts] max_log_bytes_in_flight)",
            log_batches_dropped.clone(),
        );
        let evaluator_busy = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "alert_evaluator_busy_seconds",
            "Seconds the rule evaluators spent evaluating since start-up (writes left out)",
            evaluator_busy.clone(),
        );
        let edge: [Gauge; EDGE] = std::array::from_fn(|_| Gauge::default());
        let names: [(&str, &str); EDGE] = [
            ("http_connections_open", "Connections being served now"),
            (
                "http_connection_limit_waits",
                "Times a new connection waited for [http] max_connections",
            ),
            (
                "http_header_timeouts",
                "Connections closed by [http] header_read_timeout_seconds",
            ),
            (
                "http_keepalive_timeouts",
                "HTTP/2 connections closed because the peer stopped answering pings",
            ),
            (
                "http_idle_closes",
                "Connections closed by [http] idle_timeout_seconds",
            ),
            (
                "http_body_timeouts",
                "Request bodies cut by [http] body_timeout_seconds",
            ),
            (
                "http_body_budget_refusals",
                "Requests refused (503) over [http] body_budget_bytes",
            ),
            (
                "http_body_budget_peak_bytes",
                "The most of [http] body_budget_bytes reserved at once by buffered request bodies since start-up",
            ),
            (
                "http_large_body_refusals",
                "Large bodies refused (503) after waiting 5 s for one of [http] max_large_bodies readers",
            ),
            (
                "http_unauthenticated_body_paced",
                "Times a large body on a route that takes no credential waited for [http] unauthenticated_body_bytes_per_second",
            ),
            (
                "live_batches_skipped",
                "Live log batches not queued for a subscriber over its [sessions] queue bound",
            ),
            (
                "bus_published",
                "Messages sent to the other nodes over [bus] since start-up",
            ),
            (
                "bus_received",
                "Messages received from the other nodes over [bus] since start-up",
            ),
            (
                "bus_dropped",
                "Messages for the other nodes dropped over [bus] max_queued_bytes or refused by the bus (each user of the bus catches up from the database)",
            ),
            (
                "bus_rejected",
                "Messages received over [bus] and dropped because they did not open with the nodes' bus key (forged, altered, moved to another subject or replayed)",
            ),
            (
                "session_actors_running",
                "Session actors running (idle ones stop after [sessions] idle_seconds)",
            ),
            (
                "http_per_address_refusals",
                "Requests refused (503) over [http] max_unauthenticated_per_address",
            ),
            (
                "http_connection_refusals",
                "Connections closed at once over [http] max_connections_per_address",
            ),
            (
                "http_slow_uploads",
                "Streamed uploads ended for coming slower than [http] min_upload_bytes_per_second",
            ),
            (
                "log_lines_ingested",
                "Log lines acknowledged (durable) since start-up; its rate is the ingest rate",
            ),
            (
                "log_batches_sealed",
                "Log batches sealed since start-up (merged into chunks of [logs] chunk_lines)",
            ),
            ("log_chunks_sealed", "Chunks those sealed batches became"),
            (
                "log_seals_failed",
                "Seals that failed (the store or the blob store erred): their batches stay unsealed and are sealed later",
            ),
            (
                "log_segments_written",
                "Log segments written to the blob store since start-up",
            ),
            ("log_segment_bytes_written", "Bytes of those segments"),
            (
                "log_chunk_fetches",
                "Sealed log chunks fetched from the blob store since start-up (ranged GETs; nearby chunks of one segment share one)",
            ),
            (
                "log_chunk_cache_hits",
                "Sealed log chunks read from the cache ([logs] cache_bytes) instead",
            ),
            (
                "data_dir_free_bytes",
                "Bytes free on the data directory's file system",
            ),
            (
                "data_dir_min_free_bytes",
                "[storage] min_free_bytes: below it, requests that write are refused with 507",
            ),
            (
                "webhook_deliveries_queued",
                "Accepted webhook deliveries waiting for the worker (the backlog)",
            ),
            (
                "webhook_deliveries_recovered",
                "Deliveries answered 202 before a crash that this start wrote again from the intake's journal",
            ),
            (
                "alert_notifications_sent",
                "Notification attempts the target accepted since start-up",
            ),
            (
                "alert_notifications_retried",
                "Notification attempts that failed and will be tried again, since start-up",
            ),
            (
                "alert_notifications_failed",
                "Notifications given up on (a final refusal or out of attempts) since start-up",
            ),
            (
                "orgs_being_deleted",
                "Deleted organizations whose data is still being purged",
            ),
        ];
        for (g, (name, help)) in edge.iter().zip(names) {
            registry.register(name, help, g.clone());
        }
        let mailbox_waiting = Family::<ActorLabels, Gauge>::default();
        registry.register(
            "mailbox_calls_waiting",
            "Calls queued or in progress across every actor of a family (bounded per actor by [supervision] mailbox_limit)",
            mailbox_waiting.clone(),
        );
        let mailbox_deepest = Family::<ActorLabels, Gauge>::default();
        registry.register(
            "mailbox_deepest",
            "Calls queued or in progress at the fullest actor of a family",
            mailbox_deepest.clone(),
        );
        Self {
            mailbox_waiting,
            mailbox_deepest,
            registry,
            requests,
            latency,
            polls,
            restarts,
            log_batches_dropped,
            evaluator_busy,
            edge,
        }
    }

    pub fn observe(&self, route: &'static str, method: &http::Method, status: u16, secs: f64) {
        self.requests
            .get_or_create(&RequestLabels {
                route,
                method: method_label(method),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels { route })
            .observe(secs);
    }

    /// The registry in OpenMetrics text (`openmetrics`), else in Prometheus' text exposition
    /// format 0.0.4, which every other scraper (Telegraf, Datadog's agent, `curl | grep`) reads.
    pub fn render(&self, rt: &RuntimeFigures, openmetrics: bool) -> String {
        self.restarts.set(rt.restarts as i64);
        self.log_batches_dropped.set(rt.log_batches_dropped as i64);
        self.evaluator_busy.set(rt.evaluator_busy_seconds);
        for (actor, waiting, deepest) in &rt.mailbox_depths {
            let labels = ActorLabels { actor };
            self.mailbox_waiting
                .get_or_create(&labels)
                .set(*waiting as i64);
            self.mailbox_deepest
                .get_or_create(&labels)
                .set(*deepest as i64);
        }
        let values: [i64; EDGE] = [
            rt.connections_open,
            rt.connection_waits as i64,
            rt.header_timeouts as i64,
            rt.keepalive_timeouts as i64,
            rt.idle_closes as i64,
            rt.body_timeouts as i64,
            rt.body_budget_refusals as i64,
            rt.body_budget_peak_bytes as i64,
            rt.large_body_waits as i64,
            rt.paced_waits as i64,
            rt.live_batches_skipped as i64,
            rt.bus_published as i64,
            rt.bus_received as i64,
            rt.bus_dropped as i64,
            rt.bus_rejected as i64,
            rt.session_actors as i64,
            rt.per_address_refusals as i64,
            rt.connection_refusals as i64,
            rt.slow_uploads as i64,
            rt.log_lines_ingested as i64,
            rt.log_batches_sealed as i64,
            rt.log_chunks_sealed as i64,
            rt.log_seals_failed as i64,
            rt.log_segments_written as i64,
            rt.log_segment_bytes_written as i64,
            rt.log_chunk_fetches as i64,
            rt.log_chunk_cache_hits as i64,
            rt.data_dir_free_bytes.min(i64::MAX as u64) as i64,
            rt.data_dir_min_free_bytes.min(i64::MAX as u64) as i64,
            rt.webhook_deliveries_queued as i64,
            rt.webhook_deliveries_recovered as i64,
            rt.notifications_sent as i64,
            rt.notifications_retried as i64,
            rt.notifications_failed as i64,
            rt.orgs_being_deleted as i64,
        ];
        for (g, v) in self.edge.iter().zip(values) {
            g.set(v);
        }
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        if openmetrics {
            out
        } else {
            to_prometheus_text(&out)
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text as text format 0.0.4: a counter's family is
/// named after its `_total` samples, and `# UNIT` and `# EOF` (OpenMetrics only) go. Samples
/// are the same in both formats for the counters, gauges and histograms registered here.
fn to_prometheus_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<&str> = None;
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            // Held until its TYPE line says whether the name takes `_total`.
            if let Some(h) = help.replace(rest) {
                push_line(&mut out, &["# HELP ", h]);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let suffix = if kind == "counter" { "_total" } else { "" };
            if let Some(h) = help.take() {
                let text = h.strip_prefix(name).unwrap_or(h);
                push_line(&mut out, &["# HELP ", name, suffix, text]);
            }
            push_line(&mut out, &["# TYPE ", name, suffix, " ", kind]);
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some(h) = help.take() {
            push_line(&mut out, &["# HELP ", h]);
        }
        push_line(&mut out, &[line]);
    }
    out
}

fn push_line(out: &mut String, parts: &[&str]) {
    for p in parts {
        out.push_str(p);
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_counters_by_their_samples() {
        let m = Metrics::new();
        m.observe("/x", &http::Method::GET, 200, 0.01);
        let om = m.render(
            &RuntimeFigures {
                restarts: 3,
                ..Default::default()
            },
            true,
        );
        assert!(
            om.contains("# TYPE fleetops_http_requests counter\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"));
        let text = m.render(
            &RuntimeFigures {
                restarts: 3,
                ..Default::default()
            },
            false,
        );
        assert!(
            text.contains("# HELP fleetops_http_requests_total HTTP requests"),
            "{text}"
        );
        assert!(text.contains("# TYPE fleetops_http_requests_total counter\n"));
        assert!(text.contains(
            "fleetops_http_requests_total{route=\"/x\",method=\"GET\",status=\"200\"} 1\n"
        ));
        assert!(text.contains("# TYPE fleetops_actor_restarts gauge\nfleetops_actor_restarts 3\n"));
        assert!(text.contains("# TYPE fleetops_http_request_duration_seconds histogram\n"));
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
    }
}

/// Every poll of a request's handler, timed (see `PollTimed` in `edge/connections.rs`).
pub type PollTimes = fleetops_actors::timings::Timings;

/// Renders a [`fleetops_actors::timings::Timings`] as a histogram under `name`.
#[derive(Debug)]
struct TimingsMetric {
    name: &'static str,
    help: &'static str,
    timings: std::sync::Arc<fleetops_actors::timings::Timings>,
}

impl prometheus_client::collector::Collector for TimingsMetric {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        // Per-bucket counts (the encoder sums them); `f64::MAX` is how it spells `+Inf`.
        let snap = self.timings.snapshot();
        let mut metric = encoder.encode_descriptor(
            self.name,
            self.help,
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            snap.sum_seconds,
            snap.count,
            &snap.buckets,
            None,
        )
    }
}
