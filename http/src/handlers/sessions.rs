//! Sessions, their tags, log ingestion (JSON array or NDJSON) and the log query.

use fleetops_actors::logs::{LogFilter, MAX_BATCH_BYTES, MAX_QUERY_LIMIT, RawEntry, parse_level};
use fleetops_actors::sessions::{ExportFormat, SessionFilter, parse_status};
use fleetops_actors::{Principal, ProjectScope, Role, clock};
use http::Response;
use serde::Deserialize;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

/// Authenticated on a session route a device may use: 401 → 429 → 403 (project) → 404
/// (session) → 403 (another device's session). Returns the scope and the session id.
pub(super) async fn ingestion(
    cx: &mut Cx<'_>,
    req: &Req,
) -> ApiResult<(Principal, ProjectScope, u64)> {
    let org = req.param("org");
    let p = cx.authenticate(req, Some(org)).await?;
    let s = cx
        .rt()
        .access
        .ingestion(&p, org, req.param("project"), Role::Member)?;
    let id = req.id("session_id", "Session")?;
    let device = cx.rt().sessions.device_of(s.project.id, id)?;
    cx.rt().access.check_device(&p, device)?;
    Ok((p, s, id))
}

pub(crate) fn session_id(req: &Req) -> ApiResult<u64> {
    req.id("session_id", "Session")
}

fn time_param(q: &crate::query::Query, k: &str) -> ApiResult<Option<i64>> {
    q.get(k)
        .map(|v| {
            clock::parse_ms(v).ok_or_else(|| {
                ApiError::unprocessable(format!(
                    "{k}: must be an RFC 3339 datetime with Z or an offset"
                ))
            })
        })
        .transpose()
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateSession")]
pub(crate) struct CreateBody {
    #[serde(deserialize_with = "fleetops_actors::rules::whole::u64")]
    device_id: u64,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::tags")]
    tags: Vec<String>,
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::opt_u64")]
    package_id: Option<u64>,
}

pub async fn create(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let org = req.param("org").to_string();
    let p = cx.authenticate(&req, Some(&org)).await?;
    let s = cx
        .rt()
        .access
        .ingestion(&p, &org, req.param("project"), Role::Member)?;
    let b: CreateBody = cx.json(&mut req).await?;
    cx.rt().access.check_device(&p, b.device_id)?;
    body::created(
        &cx.rt()
            .sessions
            .create(s.project.id, b.device_id, b.tags, b.package_id)
            .await?,
    )
}

pub async fn list(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let status = req
        .query
        .get("status")
        .map(|v| {
            parse_status(v).ok_or_else(|| {
                ApiError::unprocessable("status: must be active, completed or failed")
            })
        })
        .transpose()?;
    let f = SessionFilter {
        device_id: req.query.u64("device_id")?,
        status,
        since: time_param(&req.query, "since")?,
        until: time_param(&req.query, "until")?,
    };
    body::ok(
        &cx.rt()
            .sessions
            .list(s.project.id, &f, req.query.page()?)
            .await?,
    )
}

pub async fn get(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(&cx.rt().sessions.detail(s.project.id, session_id(&req)?)?)
}

pub async fn delete(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    cx.rt()
        .sessions
        .delete(s.project.id, session_id(&req)?)
        .await?;
    body::no_content()
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "AddTag")]
pub(crate) struct TagBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::tag")]
    tag: String,
}

pub async fn add_tag(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = session_id(&req)?;
    cx.rt().sessions.device_of(s.project.id, id)?;
    let b: TagBody = cx.json(&mut req).await?;
    body::ok(&cx.rt().sessions.tag(s.project.id, id, b.tag, true).await?)
}

pub async fn remove_tag(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = session_id(&req)?;
    let tag = req.param("tag").to_string();
    body::ok(&cx.rt().sessions.tag(s.project.id, id, tag, false).await?)
}

/// Log batches larger than this are parsed on the blocking pool.
const PARSE_OFF_THREAD_BYTES: usize = 16 * 1024;

fn is_large_batch(req: &Req) -> bool {
    req.header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .is_none_or(|n| n > PARSE_OFF_THREAD_BYTES)
}

/// `application/x-ndjson` (or `application/jsonl`): one entry a line.
fn is_ndjson(req: &Req) -> bool {
    req.header("content-type").is_some_and(|v| {
        let v = v.to_ascii_lowercase();
        v.starts_with("application/x-ndjson")
            || v.starts_with("application/jsonl")
            || v.starts_with("application/ndjson")
    })
}

fn parse_ndjson(bytes: &[u8]) -> ApiResult<Vec<RawEntry>> {
    let lines = || {
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
    };
    // Counted first, as a JSON array is: too many entries is 413 whatever they hold.
    let max = fleetops_actors::logs::MAX_BATCH_ENTRIES;
    if lines().nth(max).is_some() {
        return Err(ApiError::too_large(format!(
            "A batch holds at most {max} entries"
        )));
    }
    let mut out = Vec::new();
    for (i, line) in lines().enumerate() {
        let e: RawEntry = serde_json::from_slice(line).map_err(|e| {
            let msg = e.to_string();
            let msg = msg
                .split(" at line ")
                .next()
                .unwrap_or_default()
                .to_string();
            ApiError::unprocessable(format!("entry {i}: {msg}"))
        })?;
        out.push(e);
    }
    Ok(out)
}

/// A log batch body: NDJSON, or a JSON array of entries (422 naming the entry that is wrong).
pub(crate) fn parse_batch(bytes: &[u8], ndjson: bool) -> ApiResult<Vec<RawEntry>> {
    if ndjson {
        return parse_ndjson(bytes);
    }
    let max = fleetops_actors::logs::MAX_BATCH_ENTRIES;
    body::parse_bounded_array(bytes, max, || {
        format!("A batch holds at most {max} entries")
    })
    .map_err(|e| match e {
        // "[3].level: ..." names the entry's index already; say it plainly.
        ApiError::Domain(fleetops_actors::Error::Unprocessable(d)) if d.starts_with('[') => {
            let (idx, rest) = d
                .trim_start_matches('[')
                .split_once(']')
                .unwrap_or(("?", &d));
            ApiError::unprocessable(format!("entry {idx}: {}", rest.trim_start_matches('.')))
        }
        other => other,
    })
}

pub async fn append_logs(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s, id) = ingestion(cx, &req).await?;
    let batch = batch_sequence(&req)?;
    let ndjson = is_ndjson(&req);
    let gzip = gzipped(&req)?;
    let bytes = req.body_bytes(MAX_BATCH_BYTES).await?;
    let parse = move || {
        if gzip {
            parse_batch(&gunzip(&bytes)?, ndjson)
        } else {
            parse_batch(&bytes, ndjson)
        }
    };
    // A batch of a thousand lines is a millisecond or more of parsing: past a few KiB (or
    // compressed) it goes to the blocking pool rather than hold an async thread.
    let entries = if gzip || is_large_batch(&req) {
        tokio::task::spawn_blocking(parse).await.map_err(|e| {
            ApiError::Domain(fleetops_actors::Error::Internal(format!(
                "log batch parsing did not finish: {e}"
            )))
        })??
    } else {
        parse()?
    };
    body::accepted(
        &cx.rt()
            .sessions
            .append(s.project.id, id, entries, batch)
            .await?,
    )
}

/// Whether the batch comes gzip-compressed (`Content-Encoding: gzip`); another coding than
/// gzip or identity is 400.
fn gzipped(req: &Req) -> ApiResult<bool> {
    match req.header("content-encoding").map(str::trim) {
        None => Ok(false),
        Some(e) if e.eq_ignore_ascii_case("identity") => Ok(false),
        Some(e) if e.eq_ignore_ascii_case("gzip") => Ok(true),
        Some(_) => Err(ApiError::bad_request(
            "Content-Encoding: a log batch is sent as is or gzip-compressed",
        )),
    }
}

/// A gzip body decoded, at most `MAX_BATCH_BYTES` once decoded (413 past it, however
/// small the compressed body: no bomb gets past the bound); 400 when it is not gzip.
fn gunzip(bytes: &[u8]) -> ApiResult<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(MAX_BATCH_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| ApiError::bad_request("Content-Encoding: the body is not valid gzip"))?;
    if out.len() > MAX_BATCH_BYTES {
        return Err(ApiError::too_large(format!(
            "A log batch is at most {MAX_BATCH_BYTES} bytes once decompressed"
        )));
    }
    Ok(out)
}

/// `X-Batch-Sequence`: the sender's number for a batch, rising within the session, so a batch
/// sent again after a lost answer is stored once.
fn batch_sequence(req: &Req) -> ApiResult<Option<u64>> {
    req.header(BATCH_SEQUENCE)
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    ApiError::unprocessable("X-Batch-Sequence: must be a whole number from 1")
                })
        })
        .transpose()
}

/// The header a sender numbers its batches in.
pub(crate) const BATCH_SEQUENCE: &str = "x-batch-sequence";

/// The filters shared by the query and the export.
pub(crate) fn log_filter(req: &Req) -> ApiResult<LogFilter> {
    log_filter_of(&req.query)
}

/// The log filter of a query string (the console's session page reads it too).
pub(crate) fn log_filter_of(q: &crate::query::Query) -> ApiResult<LogFilter> {
    let mut levels = 0u8;
    if let Some(v) = q.get("level") {
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let l = parse_level(part).ok_or_else(|| {
                ApiError::unprocessable(
                    "level: must be debug, info, warn or error (comma-separated)",
                )
            })?;
            levels |= 1 << l;
        }
    }
    Ok(LogFilter {
        levels,
        module: q.get("module").map(str::to_string),
        search: q.get("search").map(str::to_lowercase),
        since: time_param(q, "since")?,
        until: time_param(q, "until")?,
    })
}

pub async fn query_logs(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = session_id(&req)?;
    let f = log_filter(&req)?;
    let limit = req.query.u64("limit")?.unwrap_or(100) as usize;
    if limit == 0 || limit > MAX_QUERY_LIMIT {
        return Err(ApiError::unprocessable(format!(
            "limit: must be between 1 and {MAX_QUERY_LIMIT}"
        )));
    }
    let offset = req.query.u64("offset")?.unwrap_or(0) as usize;
    body::ok(
        &cx.rt()
            .sessions
            .logs(s.project.id, id, f, limit, offset)
            .await?,
    )
}

pub async fn export_logs(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = session_id(&req)?;
    export_response(cx.rt(), s.project.id, id, &req.query)
}

/// The streamed export of a session's matching lines (the API's route and the console's
/// download).
pub(crate) fn export_response(
    rt: &fleetops_actors::Runtime,
    pid: u64,
    id: u64,
    q: &crate::query::Query,
) -> ApiResult<Response<Body>> {
    let (format, ext, mime) = match q.get("format").unwrap_or("json") {
        "json" => (ExportFormat::Json, "json", "application/json"),
        "csv" => (ExportFormat::Csv, "csv", "text/csv; charset=utf-8"),
        _ => return Err(ApiError::unprocessable("format: must be json or csv")),
    };
    let f = log_filter_of(q)?;
    let rx = rt.sessions.export(pid, id, f, format)?;
    let mut r = Response::new(crate::response::channel(rx));
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(mime),
    );
    if let Ok(v) =
        http::HeaderValue::from_str(&format!("attachment; filename=\"session-{id}-logs.{ext}\""))
    {
        h.insert(http::header::CONTENT_DISPOSITION, v);
    }
    crate::response::no_sniff(h);
    Ok(r)
}

/// `PATCH /log-retention`.
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "LogRetentionPatch")]
#[serde(deny_unknown_fields)]
pub(crate) struct RetentionBody {
    /// Days an ended session is kept with its logs and files (0: for good); null or absent:
    /// the server's default.
    #[serde(default)]
    #[schemars(range(min = 0, max = 36_500))]
    retention_days: Option<u32>,
}

/// `GET /log-retention` (viewer).
pub async fn log_retention(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    body::ok(&cx.rt().sessions.log_retention(s.project.id)?)
}

/// `PATCH /log-retention` (admin).
pub async fn set_log_retention(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Admin).await?;
    let b: RetentionBody = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .sessions
            .set_log_retention(s.project.id, b.retention_days)
            .await?,
    )
}

/// The two ways a session can end.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(rename = "SessionEnd")]
pub(crate) enum SessionStatusBody {
    Completed,
    Failed,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CompleteSession")]
pub(crate) struct CompleteBody {
    status: SessionStatusBody,
}

pub async fn complete(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (_, s, id) = ingestion(cx, &req).await?;
    let b: CompleteBody = cx.json(&mut req).await?;
    let status = match b.status {
        SessionStatusBody::Completed => fleetops_actors::sessions::EndStatus::Completed,
        SessionStatusBody::Failed => fleetops_actors::sessions::EndStatus::Failed,
    };
    body::ok(&cx.rt().sessions.complete(s.project.id, id, status).await?)
}
