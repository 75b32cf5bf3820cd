//! Request bodies in (size-capped, then JSON with 400 for syntax and 422 naming the field for
//! anything that parses but does not fit), and the JSON answers handlers return.

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ApiResult};
use crate::response::{Body, empty, json_bytes};

/// Reads the whole body, refusing (413) anything over `limit` bytes, by its declared length
/// before reading and by counting while reading.
pub async fn read(headers: &http::HeaderMap, body: Incoming, limit: usize) -> ApiResult<Bytes> {
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(limit)),
        Err(_) => Err(ApiError::bad_request("Could not read the request body")),
    }
}

fn too_large(limit: usize) -> ApiError {
    ApiError::too_large(format!("Request body exceeds the limit of {limit} bytes"))
}

/// As [`parse`], for a body that must be a JSON object (serde would also read a struct from
/// an array of its fields): anything else that parses is 422.
pub fn parse_object<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // A body that is not JSON at all (or not UTF-8) is still 400.
        let _: serde_json::Value = parse(bytes)?;
        return Err(ApiError::unprocessable("body: must be a JSON object"));
    }
    parse(bytes)
}

/// Parses JSON: syntax errors are 400, type and missing-field errors 422 with the field path.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    // Syntax first, so that a truncated document is 400 even when its first values already
    // break the expected types.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
        return Err(ApiError::bad_request(format!(
            "Malformed JSON body: {}",
            strip_position(&e.to_string())
        )));
    }
    parse_well_formed(bytes)
}

/// A JSON array of at most `max` items: counted before any item is built (a body of tiny
/// items must not cost a typed value each, up to its byte limit, only to be refused), then
/// parsed as [`parse`] does. More than `max` is 413 `too_many`.
pub fn parse_bounded_array<T: DeserializeOwned>(
    bytes: &[u8],
    max: usize,
    too_many: impl FnOnce() -> String,
) -> ApiResult<Vec<T>> {
    // `IgnoredAny` has no size, so this vector allocates nothing; it is also the syntax
    // check. Anything but a well-formed array is left to `parse` to name.
    match serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(bytes) {
        Ok(items) if items.len() > max => Err(ApiError::too_large(too_many())),
        Ok(_) => parse_well_formed(bytes),
        Err(_) => parse(bytes),
    }
}

/// [`parse`] past its syntax check (`bytes` is known to be well-formed JSON).
fn parse_well_formed<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize(de) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match inner.classify() {
                serde_json::error::Category::Data => {
                    let msg = strip_position(&inner.to_string());
                    let detail = if path == "." || path.is_empty() {
                        msg
                    } else {
                        format!("{path}: {msg}")
                    };
                    Err(ApiError::unprocessable(detail))
                }
                _ => Err(ApiError::bad_request(format!(
                    "Malformed JSON body: {}",
                    strip_position(&inner.to_string())
                ))),
            }
        }
    }
}

/// serde_json appends " at line L column C"; the field path says more.
fn strip_position(s: &str) -> String {
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s.to_string(),
    }
}

/// Reads and parses a JSON body with the ordinary limit.
pub async fn json<T: DeserializeOwned>(
    headers: &http::HeaderMap,
    body: Incoming,
    limit: usize,
) -> ApiResult<T> {
    let bytes = read(headers, body, limit).await?;
    parse(&bytes)
}

pub fn ok<T: serde::Serialize>(v: &T) -> ApiResult<Response<Body>> {
    with_status(StatusCode::OK, v)
}

pub fn created<T: serde::Serialize>(v: &T) -> ApiResult<Response<Body>> {
    with_status(StatusCode::CREATED, v)
}

pub fn accepted<T: serde::Serialize>(v: &T) -> ApiResult<Response<Body>> {
    with_status(StatusCode::ACCEPTED, v)
}

pub fn no_content() -> ApiResult<Response<Body>> {
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::NO_CONTENT;
    Ok(r)
}

pub fn with_status<T: serde::Serialize>(status: StatusCode, v: &T) -> ApiResult<Response<Body>> {
    let bytes = serde_json::to_vec(v)
        .map_err(|e| ApiError::Domain(fleetops_actors::Error::Internal(e.to_string())))?;
    Ok(json_bytes(status, Bytes::from(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct B {
        name: String,
        n: Option<u32>,
    }

    #[test]
    fn syntax_is_400_and_types_are_422_with_field() {
        assert_eq!(
            parse::<B>(b"{").unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            parse::<B>(b"").unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
        let e = parse::<B>(br#"{"name": 1}"#).unwrap_err();
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(format!("{e:?}").contains("name"));
        let e = parse::<B>(br#"{"n": 1}"#).unwrap_err();
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(format!("{e:?}").contains("name"));
        let e = parse::<B>(br#"{"name": "x", "n": -1}"#).unwrap_err();
        assert!(format!("{e:?}").contains("n:"));
    }
}
