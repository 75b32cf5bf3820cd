//! Session artifacts: upload (streamed), list, download with a single `Range`, and the ZIP of
//! them all.

use std::ops::Range;

use fleetops_actors::Role;
use http::{HeaderValue, Response, StatusCode, header};

use super::sessions::{ingestion, session_id};
use crate::app::{Cx, Req};
use crate::body;
use crate::error::ApiResult;
use crate::response::Body;
use crate::response::json_bytes;

fn file_path(req: &Req) -> String {
    match req.param("path") {
        // The static `/files/download` route: a file literally named `download`.
        "" => "download".to_string(),
        p => p.to_string(),
    }
}

pub async fn put(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s, id) = ingestion(cx, &req).await?;
    let path = file_path(&req);
    let content_type = req.header("content-type").map(str::to_string);
    let stream = req.body_stream(cx.rt().upload_buffer_bytes());
    body::created(
        &cx.rt()
            .sessions
            .put_artifact(s.project.id, id, path, content_type, stream)
            .await?,
    )
}

pub async fn list(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(
        &cx.rt()
            .sessions
            .artifacts(s.project.id, session_id(&req)?)?,
    )
}

/// A single `bytes=` range against a file of `size` bytes: `Ok(None)` for no (or a
/// multi-range, which is answered whole) header, `Err(())` when unsatisfiable.
fn parse_range(header: Option<&str>, size: u64) -> Result<Option<Range<u64>>, ()> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let (a, b) = spec.split_once('-').ok_or(())?;
    let (a, b) = (a.trim(), b.trim());
    let range = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        size.saturating_sub(n)..size
    } else {
        let start: u64 = a.parse().map_err(|_| ())?;
        let end = if b.is_empty() {
            size
        } else {
            let e: u64 = b.parse().map_err(|_| ())?;
            if e < start {
                return Err(());
            }
            e.saturating_add(1).min(size)
        };
        start..end
    };
    if range.start >= size || range.is_empty() {
        return Err(());
    }
    Ok(Some(range))
}

pub async fn get(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let a = cx
        .rt()
        .sessions
        .artifact(s.project.id, session_id(&req)?, &file_path(&req))?;
    let range = match requested_range(&req, a.size_bytes) {
        Ok(r) => r,
        Err(unsatisfiable) => return Ok(*unsatisfiable),
    };
    let stream = cx.rt().sessions.artifact_bytes(&a, range.clone()).await?;
    let mut r = ranged(crate::response::stream(stream), a.size_bytes, range);
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&a.content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    crate::response::attachment(h, &a.path);
    Ok(r)
}

/// The single range `req` asks of a file of `size` bytes (`None`: all of it), or the 416
/// answer to send.
pub(crate) fn requested_range(
    req: &Req,
    size: u64,
) -> Result<Option<Range<u64>>, Box<Response<Body>>> {
    parse_range(req.header("range"), size).map_err(|()| {
        let body = serde_json::json!({"detail": "Range not satisfiable", "status_code": 416});
        let mut r = json_bytes(
            StatusCode::RANGE_NOT_SATISFIABLE,
            serde_json::to_vec(&body).unwrap_or_default().into(),
        );
        if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
            r.headers_mut().insert(header::CONTENT_RANGE, v);
        }
        Box::new(r)
    })
}

/// A file's answer: 200 with all `size` bytes, or 206 with `range` of them and its
/// `Content-Range`; `Accept-Ranges` either way.
pub(crate) fn ranged(body: Body, size: u64, range: Option<Range<u64>>) -> Response<Body> {
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let len = match &range {
        Some(rg) => {
            *r.status_mut() = StatusCode::PARTIAL_CONTENT;
            if let Ok(v) =
                HeaderValue::from_str(&format!("bytes {}-{}/{size}", rg.start, rg.end - 1))
            {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            rg.end - rg.start
        }
        None => size,
    };
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    r
}

pub async fn download(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = session_id(&req)?;
    let rx = cx.rt().sessions.zip(s.project.id, id)?;
    let mut r = Response::new(crate::response::channel(rx));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/zip"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "attachment; filename=\"session-{id}-artifacts.zip\""
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    crate::response::no_sniff(h);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some(0..4)));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some(5..10)));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Ok(Some(7..10)));
        assert_eq!(parse_range(Some("bytes=8-100"), 10), Ok(Some(8..10)));
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=4-2"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=x-2"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=-0"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=0-0"), 0), Err(()));
    }
}
