//! The device update API (the device's own token): what to run now, with an ETag so an
//! unchanged answer is a 304, and the device's reports on a package; the members' view of a
//! device's history.

use http::{Response, StatusCode};
use serde::Deserialize;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;
use fleetops_actors::Role;

/// 200 with the package and its `ETag`, 304 when `If-None-Match` names that ETag, 204 when
/// nothing is assigned.
pub async fn current(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    let (pid, device) = cx.rt().access.require_device(&p)?;
    let Some(offered) = cx.rt().pipeline.device_update(pid, device).await? else {
        return body::no_content();
    };
    let (answer, etag) = (&offered.answer, &offered.etag);
    let status = if req
        .header("if-none-match")
        .is_some_and(|v| etag_matches(v, etag))
    {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    };
    let b = if status == StatusCode::OK {
        crate::response::full(answer.body.clone())
    } else {
        crate::response::empty()
    };
    Response::builder()
        .status(status)
        .header(http::header::ETAG, etag.as_str())
        .header(http::header::CACHE_CONTROL, "no-cache")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(b)
        .map_err(|e| ApiError::Domain(fleetops_actors::Error::Internal(e.to_string())))
}

/// `If-None-Match` (RFC 9110 13.1.2): `*`, or a list of entity tags compared weakly.
fn etag_matches(header: &str, etag: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").to_string();
    header
        .split(',')
        .any(|t| t.trim() == "*" || bare(t) == bare(etag))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "DeviceUpdateReport")]
pub(crate) struct ReportBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::reportable_state")]
    status: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<2000>")]
    message: Option<String>,
}

/// 202 once durable: `downloading`, `installing`, `rebooting`, or a final `succeeded` /
/// `failed` (the package's rollout result).
pub async fn report(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let p = cx.authenticate(&req, None).await?;
    let (pid, device) = cx.rt().access.require_device(&p)?;
    let id = req.id("deployment_id", "Deployment")?;
    cx.rt().pipeline.exists("deployment", pid, id)?;
    let b: ReportBody = cx.json(&mut req).await?;
    body::accepted(
        &cx.rt()
            .pipeline
            .report(pid, id, device, b.status, b.message, true)
            .await?,
    )
}

/// `GET .../devices/{device_id}/history` (viewer).
pub async fn history(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("device_id", "Device")?;
    body::ok(&cx.rt().pipeline.device_history(s.project.id, id).await?)
}

#[cfg(test)]
mod tests {
    use super::etag_matches;

    #[test]
    fn if_none_match_lists_and_weak_tags() {
        let e = "\"fleetops-d1-c2-f0\"";
        assert!(etag_matches(e, e));
        assert!(etag_matches("\"x\", W/\"fleetops-d1-c2-f0\"", e));
        assert!(etag_matches("*", e));
        assert!(!etag_matches("\"fleetops-d1-c2-f3\"", e));
        assert!(!etag_matches("", e));
    }
}
