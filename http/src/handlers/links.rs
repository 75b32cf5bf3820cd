//! The local backend's presigned links, for capsules and configurations alike: `PUT` streams
//! the bytes to the blob store, `GET` streams them back. The signed token is the credential.

use http::{HeaderValue, Response, header};

use crate::app::{Cx, Req};
use crate::body;
use crate::error::ApiResult;
use crate::response::Body;

#[derive(serde::Serialize, schemars::JsonSchema)]
pub(crate) struct Uploaded {
    /// Always `uploaded`.
    status: &'static str,
    size_bytes: u64,
}

pub async fn upload(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let token = req.param("token").to_string();
    let stream = req.body_stream(cx.rt().upload_buffer_bytes());
    let size = cx.rt().pipeline.upload(&token, stream).await?;
    body::ok(&Uploaded {
        status: "uploaded",
        size_bytes: size,
    })
}

/// A linked file, whole or a single `Range` of it (206), so a device resumes a download.
pub async fn download(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let d = cx.rt().pipeline.linked_file(req.param("token"))?;
    let range = match super::artifacts::requested_range(&req, d.size) {
        Ok(r) => r,
        Err(unsatisfiable) => return Ok(*unsatisfiable),
    };
    let stream = cx.rt().pipeline.download_bytes(&d, range.clone()).await?;
    let mut r = super::artifacts::ranged(crate::response::stream(stream), d.size, range);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(d.content_type),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{}\"", d.filename)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    crate::response::no_sniff(h);
    Ok(r)
}
