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

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    restarts: Gauge,
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
        let restarts = Gauge::default();
        registry.register(
            "actor_restarts",
            "Actor restarts by supervisors since start-up",
            restarts.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            restarts,
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

    pub fn render(&self, restarts: u64) -> String {
        self.restarts.set(restarts as i64);
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
