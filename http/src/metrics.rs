//! Prometheus metrics of the edge and the runtime, rendered on `/metrics`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = [(&'static str, String); 3];

pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    latency: Family<[(&'static str, String); 1], Histogram>,
    restarts: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fleetops");
        let requests = Family::<Labels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by operation, method and status",
            requests.clone(),
        );
        let latency =
            Family::<[(&'static str, String); 1], Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.0, 16))
            });
        registry.register(
            "http_request_duration_seconds",
            "Time to the response head, by operation",
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

    pub fn observe(&self, op: &str, method: &str, status: u16, secs: f64) {
        self.requests
            .get_or_create(&[
                ("op", op.to_string()),
                ("method", method.to_string()),
                ("status", status.to_string()),
            ])
            .inc();
        self.latency
            .get_or_create(&[("op", op.to_string())])
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
