//! One table from error kind to status and `detail`, and the one error envelope
//! `{"detail", "status_code"}` (429 adds `retry_after`). 5xx bodies say nothing internal; the
//! cause goes to tracing.

use bytes::Bytes;
use fleetops_actors::Error;
use http::{HeaderValue, Response, StatusCode, header};

use crate::response::{Body, json_bytes};

/// An error answered by the edge itself (before or after the actors).
#[derive(Debug)]
pub enum ApiError {
    Domain(Error),
    NotFoundRoute,
    MethodNotAllowed(String),
    RateLimited {
        retry_after: u64,
    },
    /// A WebSocket handshake in a version other than 13 (RFC 6455 section 4.4).
    UpgradeRequired,
    /// The body did not arrive within `[http] body_timeout_seconds`.
    BodyTimeout,
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError::Domain(e)
    }
}

impl ApiError {
    pub fn bad_request(detail: impl Into<String>) -> Self {
        ApiError::Domain(Error::BadRequest(detail.into()))
    }
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        ApiError::Domain(Error::Unprocessable(detail.into()))
    }
    pub fn too_large(detail: impl Into<String>) -> Self {
        ApiError::Domain(Error::TooLarge(detail.into()))
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Domain(e) => match e {
                Error::Unauthorized => StatusCode::UNAUTHORIZED,
                Error::Rejected(_) => StatusCode::UNAUTHORIZED,
                Error::Forbidden => StatusCode::FORBIDDEN,
                Error::NotFound(_) => StatusCode::NOT_FOUND,
                Error::Conflict(_) => StatusCode::CONFLICT,
                Error::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
                Error::BadRequest(_) => StatusCode::BAD_REQUEST,
                Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                Error::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
                Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
                Error::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
                Error::Internal(_) | Error::Storage(_) | Error::Damaged(_) => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            },
            ApiError::NotFoundRoute => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::UpgradeRequired => StatusCode::UPGRADE_REQUIRED,
            ApiError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let mut retry = None;
        let mut headers: Vec<(header::HeaderName, String)> = Vec::new();
        let detail = match &self {
            ApiError::Domain(Error::Internal(cause)) => {
                tracing::error!(%cause, "internal error");
                "Internal server error".to_string()
            }
            ApiError::Domain(Error::Storage(e)) => {
                let cause = std::error::Error::source(e).map(|s| s.to_string());
                tracing::error!(error = %e, ?cause, "storage error");
                "Internal server error".to_string()
            }
            ApiError::Domain(e @ Error::Damaged(_)) => {
                tracing::error!(error = %e, "damaged data");
                e.to_string()
            }
            ApiError::Domain(e @ Error::Unavailable { retry_after_secs }) => {
                headers.push((header::RETRY_AFTER, retry_after_secs.to_string()));
                e.to_string()
            }
            ApiError::Domain(e @ Error::BodyTimeout(_)) => {
                headers.push((header::CONNECTION, "close".into()));
                e.to_string()
            }
            ApiError::Domain(e) => e.to_string(),
            ApiError::NotFoundRoute => "Not found".into(),
            ApiError::MethodNotAllowed(allow) => {
                headers.push((header::ALLOW, allow.clone()));
                "Method not allowed".into()
            }
            ApiError::RateLimited { retry_after } => {
                retry = Some(*retry_after);
                headers.push((header::RETRY_AFTER, retry_after.to_string()));
                format!("Rate limit exceeded. Try again in {retry_after} seconds.")
            }
            ApiError::UpgradeRequired => {
                headers.push((header::SEC_WEBSOCKET_VERSION, "13".into()));
                "Unsupported WebSocket version: only 13 is spoken".into()
            }
            ApiError::BodyTimeout => {
                headers.push((header::CONNECTION, "close".into()));
                "The request body was not received in time".into()
            }
        };
        let body = ErrorEnvelope {
            detail,
            status_code: status.as_u16(),
            retry_after: retry,
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = json_bytes(status, Bytes::from(bytes));
        for (k, v) in headers {
            if let Ok(v) = HeaderValue::from_str(&v) {
                resp.headers_mut().insert(k, v);
            }
        }
        resp
    }
}

/// The one error body every route answers; the OpenAPI document's `Error` schema is this type.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorEnvelope {
    pub detail: String,
    pub status_code: u16,
    /// Seconds to wait, on 429 only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

pub type ApiResult<T = Response<Body>> = Result<T, ApiError>;
