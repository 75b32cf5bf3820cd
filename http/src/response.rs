//! Response bodies out: a full buffer, a stream of pieces, or nothing; a JSON answer's bytes
//! with its status; and the headers that keep a device's file from being shown as a page.
//! A leaf: it knows neither errors nor handlers.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};

/// Every response body: a full buffer or a stream.
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A body fed by a channel of pieces; the producer stops when the client goes away.
pub fn channel(s: fleetops_actors::sessions::ExportStream) -> Body {
    let fleetops_actors::sessions::ExportStream { rx, done } = s;
    // A stream whose producer stopped before its last piece (its reader stalled) ends in an
    // error, so the response is cut off rather than ending as if it were whole.
    let stream = futures::stream::unfold(Some(rx), move |rx| {
        let done = done.clone();
        async move {
            let mut rx = rx?;
            match rx.recv().await {
                Some(piece) => Some((piece.map(hyper::body::Frame::data), Some(rx))),
                None if done.load(std::sync::atomic::Ordering::Acquire) => None,
                None => Some((
                    Err(std::io::Error::other("the download was cut short")),
                    None,
                )),
            }
        }
    });
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

/// A body fed by a stream of pieces (a blob being read).
pub fn stream(s: futures::stream::BoxStream<'static, std::io::Result<Bytes>>) -> Body {
    use futures::TryStreamExt;
    http_body_util::StreamBody::new(s.map_ok(hyper::body::Frame::data)).boxed_unsync()
}

pub fn empty() -> Body {
    full(Bytes::new())
}

/// A JSON answer: `bytes` with `status` and `Content-Type: application/json`.
pub fn json_bytes(status: StatusCode, bytes: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A device's file is saved, never shown by the browser as a page of this origin: it is an
/// attachment named after the last segment of its path (`[A-Za-z0-9._-]` only), its type is
/// not sniffed, and it runs in a sandbox with nothing allowed if opened anyway.
pub(crate) fn attachment(h: &mut http::HeaderMap, path: &str) {
    let name: String = path
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    if let Ok(v) = http::HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        if name.is_empty() { "file" } else { &name }
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    no_sniff(h);
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static("sandbox; default-src 'none'"),
    );
}

/// Bytes of a declared type are read as that type only.
pub(crate) fn no_sniff(h: &mut http::HeaderMap) {
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        http::HeaderValue::from_static("nosniff"),
    );
}
