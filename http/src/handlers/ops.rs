//! Operational endpoints: health, metrics, the OpenAPI document.

use fleetops_actors::secrets::ct_eq;
use http::{HeaderValue, Response, StatusCode, header};

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::json_bytes;
use crate::response::{Body, full};

/// The health answer: `ok`, or while a part is down `degraded` with the parts' names (503,
/// which adds the error envelope's `detail` and `status_code`). Entities past their restart
/// budget (`session 42`) are listed in `contained` without failing the check: each refuses
/// only its own requests, and a load balancer should keep sending the rest.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub(crate) struct Health {
    status: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    down: Vec<&'static str>,
    /// At most 100 names, as `kind id`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    contained: Vec<String>,
    /// How many entities are past their budget (all of them, named or not).
    #[serde(skip_serializing_if = "is_zero")]
    contained_count: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_code: Option<u16>,
}

/// 200 `{"status": "ok"}`; while a part of the supervision tree is down (failed and not
/// running again yet), 503 naming it, so a load balancer or an operator sees which.
pub fn healthz(cx: &Cx<'_>) -> ApiResult<Response<Body>> {
    let down = cx.rt().health.down();
    let (contained, contained_count) = cx.rt().health.contained();
    if down.is_empty() {
        return body::ok(&Health {
            status: "ok",
            down: Vec::new(),
            contained,
            contained_count,
            detail: None,
            status_code: None,
        });
    }
    let detail = Some(format!("Not running: {}", down.join(", ")));
    let bytes = serde_json::to_vec(&Health {
        status: "degraded",
        down,
        contained,
        contained_count,
        detail,
        status_code: Some(503),
    })
    .unwrap_or_default();
    let mut r = json_bytes(StatusCode::SERVICE_UNAVAILABLE, bytes.into());
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    Ok(r)
}

/// The readiness answer: `ready` with each engine `ok` (the bus `in-process` on one node);
/// `degraded` with a `detail` while only the bus is out of reach (still 200: every node is
/// alike then, and still serves); or 503 `not_ready` while the database or the blob store is,
/// with the error envelope's `detail` and `status_code`.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub(crate) struct Ready {
    #[serde(flatten)]
    checks: fleetops_actors::Readiness,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_code: Option<u16>,
}

/// How long `/readyz` waits for each engine.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// 200 while this node reaches its database and blob store (each asked at once, given 2 s,
/// the answer kept for a second); otherwise 503 with `Retry-After`, so a load balancer stops
/// sending here. `/healthz` stays liveness: a node that cannot reach PostgreSQL is alive and
/// not ready.
pub async fn readyz(cx: &Cx<'_>) -> ApiResult<Response<Body>> {
    let checks = cx.rt().readiness(READY_WAIT).await;
    if checks.is_ready() {
        let detail = (checks.bus == "unreachable").then(|| "Not reachable: bus".to_string());
        return body::ok(&Ready {
            checks,
            detail,
            status_code: None,
        });
    }
    let failed: Vec<&str> = [
        ("database", &checks.database),
        ("object_store", &checks.object_store),
        ("bus", &checks.bus),
    ]
    .into_iter()
    .filter(|(_, v)| v.starts_with("unreachable"))
    .map(|(k, _)| k)
    .collect();
    let detail = Some(format!("Not reachable: {}", failed.join(", ")));
    let bytes = serde_json::to_vec(&Ready {
        checks,
        detail,
        status_code: Some(503),
    })
    .unwrap_or_default();
    let mut r = json_bytes(StatusCode::SERVICE_UNAVAILABLE, bytes.into());
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    Ok(r)
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

pub fn openapi(cx: &Cx<'_>) -> ApiResult<Response<Body>> {
    Ok(json_bytes(StatusCode::OK, cx.app.openapi.clone()))
}

pub fn metrics(cx: &Cx<'_>, req: &Req) -> ApiResult<Response<Body>> {
    let token = &cx.app.cfg.metrics_token;
    if !token.is_empty() {
        let given = req
            .header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !ct_eq(given.as_bytes(), token.as_bytes()) {
            return Err(ApiError::Domain(fleetops_actors::Error::Unauthorized));
        }
    }
    // The negotiation Prometheus' own client libraries do: OpenMetrics only when asked for.
    let openmetrics = req
        .header("accept")
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    let edge = &cx.app.edge;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let stored = cx.rt().store_figures();
    let segments = &stored.segments;
    let figures = crate::metrics::RuntimeFigures {
        restarts: cx.rt().restarts(),
        log_batches_dropped: cx.rt().alerts.log_batches_dropped(),
        evaluator_busy_seconds: cx.rt().alerts.evaluator_busy_seconds(),
        connections_open: edge
            .connections_open
            .load(std::sync::atomic::Ordering::Relaxed),
        connection_waits: n(&edge.connection_waits),
        header_timeouts: n(&edge.header_timeouts),
        keepalive_timeouts: n(&edge.keepalive_timeouts),
        idle_closes: n(&edge.idle_closes),
        body_timeouts: n(&edge.body_timeouts),
        body_budget_refusals: n(&edge.budget_refusals),
        body_budget_peak_bytes: n(&edge.budget_peak_kib) * 1024,
        large_body_waits: n(&edge.large_body_waits),
        paced_waits: n(&edge.paced_waits),
        live_batches_skipped: cx.rt().live_batches_skipped(),
        bus_published: cx.rt().bus.stats().published,
        bus_received: cx.rt().bus.stats().received,
        bus_dropped: cx.rt().bus.stats().dropped,
        bus_rejected: cx.rt().bus.stats().rejected,
        session_actors: cx.rt().sessions.running_actors() as u64,
        per_address_refusals: n(&edge.per_address_refusals),
        connection_refusals: n(&edge.connection_refusals),
        slow_uploads: n(&edge.slow_uploads),
        mailbox_depths: cx.rt().mailbox_depths(),
        log_lines_ingested: n(&cx.rt().counters.log_lines),
        log_batches_sealed: n(&cx.rt().counters.log_batches_sealed),
        log_chunks_sealed: n(&cx.rt().counters.log_chunks_sealed),
        log_seals_failed: n(&cx.rt().counters.log_seals_failed),
        log_segments_written: segments.segments_written,
        log_segment_bytes_written: segments.segment_bytes_written,
        log_chunk_fetches: segments.fetches,
        log_chunk_cache_hits: segments.cache_hits,
        data_dir_free_bytes: cx.rt().disk.free_bytes(),
        data_dir_min_free_bytes: cx.rt().disk.floor(),
        webhook_deliveries_queued: stored.deliveries_queued,
        webhook_deliveries_recovered: stored.deliveries_recovered,
        notifications_sent: n(&cx.rt().counters.notifications_sent),
        notifications_retried: n(&cx.rt().counters.notifications_retried),
        notifications_failed: n(&cx.rt().counters.notifications_failed),
        orgs_being_deleted: cx.rt().directory.purging().map_or(0, |v| v.len() as u64),
    };
    let text = cx.app.metrics.render(&figures, openmetrics);
    let mut r = Response::new(full(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if openmetrics {
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        } else {
            "text/plain; version=0.0.4; charset=utf-8"
        }),
    );
    Ok(r)
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "BackupRequest")]
pub(crate) struct BackupBody {
    to: String,
}

/// Superuser: every organization, and how many deleted ones are still being purged.
pub async fn admin_orgs(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_superuser(&p)?;
    body::ok(&cx.rt().directory.all_orgs()?)
}

/// Superuser: a consistent copy of the data directory on the server's host.
pub async fn backup(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    cx.rt().access.require_superuser(&p)?;
    let b: BackupBody = cx.json(&mut req).await?;
    body::created(&cx.rt().backups.take(&b.to).await?)
}
