//! What every handler gets: the shared [`App`], the request as [`Req`], and a per-request
//! [`Cx`] that authenticates, rate-limits and authorizes in one fixed order
//! (401 → 429 → 403 → 404), remembering the rate-limit headers for the response.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use fleetops_actors::{OrgScope, Principal, ProjectScope, Role, Runtime};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

use crate::body;
use crate::config::{HttpConfig, Tier};
use crate::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::query::Query;
use crate::rate_limit::{Bucket, Caller, RateHeaders, RateLimits};
use crate::router::Router;

/// Shared by every connection.
pub struct App {
    pub rt: Runtime,
    pub cfg: HttpConfig,
    pub tiers: Vec<Tier>,
    pub limits: RateLimits,
    pub metrics: Metrics,
    pub router: Router,
    /// The OpenAPI document, rendered once.
    pub openapi: Bytes,
    /// Cancelled on shutdown: open WebSockets close with 1001.
    pub closing: tokio_util::sync::CancellationToken,
    pub edge: Arc<crate::edge::Edge>,
    /// The operations that take no credential (counted per client address).
    pub unauthenticated: std::collections::HashSet<crate::router::Op>,
}

/// One request, split for handlers.
pub struct Req {
    pub parts: http::request::Parts,
    body: Option<Incoming>,
    edge: Arc<crate::edge::Edge>,
    /// The budget share of a body read whole, held until the request is done.
    held: Option<crate::edge::BodyPermit>,
    pub params: Vec<(String, String)>,
    pub query: Query,
    pub peer: SocketAddr,
}

impl Req {
    pub fn new(
        parts: http::request::Parts,
        body: Incoming,
        params: Vec<(String, String)>,
        peer: SocketAddr,
        edge: Arc<crate::edge::Edge>,
    ) -> ApiResult<Self> {
        let params = params
            .into_iter()
            .map(|(k, v)| {
                percent_encoding::percent_decode_str(&v)
                    .decode_utf8()
                    .map(|d| (k, d.into_owned()))
                    .map_err(|_| ApiError::bad_request("Path is not valid UTF-8"))
            })
            .collect::<ApiResult<_>>()?;
        let query = Query::parse(parts.uri.query());
        Ok(Self {
            parts,
            body: Some(body),
            edge,
            held: None,
            params,
            query,
            peer,
        })
    }

    pub fn param(&self, k: &str) -> &str {
        self.params
            .iter()
            .find(|(key, _)| key == k)
            .map_or("", |(_, v)| v.as_str())
    }

    /// An integer path id; anything else cannot name a record.
    pub fn id(&self, k: &str, what: &str) -> ApiResult<u64> {
        self.param(k)
            .parse()
            .map_err(|_| ApiError::Domain(fleetops_actors::Error::not_found(what)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.parts.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the peer is one of the trusted proxies (an IPv4 peer on a dual-stack listener
    /// arrives IPv4-mapped, and is compared as IPv4).
    pub fn from_trusted_proxy(&self, trusted: &[IpAddr]) -> bool {
        trusted.contains(&self.peer.ip().to_canonical())
    }

    /// The client address, believing `X-Forwarded-For` only from trusted proxies.
    pub fn client_ip(&self, trusted: &[IpAddr]) -> IpAddr {
        let peer = self.peer.ip().to_canonical();
        if self.from_trusted_proxy(trusted)
            && let Some(ip) = self
                .header("x-forwarded-for")
                .and_then(|v| v.split(',').next_back())
                .and_then(|v| v.trim().parse().ok())
        {
            return ip;
        }
        peer
    }

    /// The body's length as its `Content-Length` declares it.
    pub fn declared_len(&self) -> Option<u64> {
        self.header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
    }

    /// The bearer value from `Authorization: Bearer` or `X-API-Key`.
    pub fn credential(&self) -> Option<&str> {
        credential(self.header("authorization"), self.header("x-api-key"))
    }

    /// The body as a stream of pieces (for uploads that must not be held in memory), whose
    /// writer buffers up to `buffer` bytes: that much (or the declared length, when smaller)
    /// is reserved from the body budget from its first read until the upload ends (an error
    /// of kind `ResourceBusy`, 503, when it cannot be). A sender that pauses longer than
    /// `[http] body_timeout_seconds`, or brings less than `min_upload_bytes_per_second`,
    /// ends it with an error of kind `TimedOut` (408).
    pub fn body_stream(
        &mut self,
        buffer: usize,
    ) -> futures::stream::BoxStream<'static, std::io::Result<Bytes>> {
        use futures::{StreamExt, TryStreamExt};
        let Some(b) = self.body.take() else {
            return futures::stream::empty().boxed();
        };
        let reserve = match self.declared_len() {
            Some(0) => None,
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX).min(buffer)),
            None => Some(buffer),
        };
        self.edge.idle_limited(
            http_body_util::BodyDataStream::new(b)
                .map_err(std::io::Error::other)
                .boxed(),
            reserve,
        )
    }

    /// The whole body, at most `limit` bytes (413 at once when it declares more), within the
    /// body deadline, its bytes reserved from the budget all buffered bodies share as they
    /// arrive and held until the request is done.
    pub async fn body_bytes(&mut self, limit: usize) -> ApiResult<Bytes> {
        self.body_bytes_paced(limit, crate::edge::Pace::Authenticated)
            .await
    }

    /// As [`Req::body_bytes`], for a route that reads the body before it knows the sender:
    /// a large body is read at `[http] unauthenticated_body_bytes_per_second`.
    pub async fn body_bytes_paced(
        &mut self,
        limit: usize,
        pace: crate::edge::Pace,
    ) -> ApiResult<Bytes> {
        let Some(b) = self.body.take() else {
            return Ok(Bytes::new());
        };
        let declared = self.declared_len();
        if declared.is_some_and(|len| len > limit as u64) {
            return Err(ApiError::too_large(format!(
                "Request body exceeds the limit of {limit} bytes"
            )));
        }
        let declared = declared.and_then(|d| usize::try_from(d).ok());
        let (bytes, permit) = self
            .edge
            .within_deadline(self.edge.read_budgeted(b, limit, declared, pace))
            .await?;
        self.held = Some(permit);
        Ok(bytes)
    }
}

/// Per-request state carried through a handler.
pub struct Cx<'a> {
    pub app: &'a App,
    /// Set once the caller is authenticated; added to every response after that.
    pub rate: Option<RateHeaders>,
    /// The request writes to the data directory: once its caller is known (401 and 429
    /// first), it is refused with 507 while the disk is below its floor.
    pub writes_disk: bool,
}

impl<'a> Cx<'a> {
    pub fn rt(&self) -> &'a Runtime {
        &self.app.rt
    }

    /// 507 for a request that writes to the data directory while it is below its floor.
    pub fn disk_floor(&self) -> ApiResult<()> {
        if self.writes_disk {
            self.app.rt.disk.check_write()?;
        }
        Ok(())
    }

    /// 401 for bad or missing credentials, then 429 over the caller's tier.
    pub async fn authenticate(&mut self, req: &Req, org: Option<&str>) -> ApiResult<Principal> {
        self.authenticate_with(req.credential(), org).await
    }

    /// As [`Cx::authenticate`], with the credential taken from elsewhere (a WebSocket's
    /// `?token=`).
    pub async fn authenticate_with(
        &mut self,
        value: Option<&str>,
        org: Option<&str>,
    ) -> ApiResult<Principal> {
        let value = value.ok_or(ApiError::Domain(fleetops_actors::Error::Unauthorized))?;
        let p = self.app.rt.auth.resolve_async(value).await?;
        let (tier, org_id) = self.app.rt.access.tier_for(&p, org)?;
        let bucket = Bucket {
            caller: p.caller(),
            org_id,
        };
        match self.app.limits.check(&tier, bucket) {
            Ok(h) => {
                self.rate = Some(h);
                self.disk_floor()?;
                Ok(p)
            }
            Err((e, h)) => {
                self.rate = Some(h);
                Err(e)
            }
        }
    }

    /// The project-secret routes: `X-Project-Secret` only (a JWT or API key alone is 401; an
    /// unknown organization or project is 401 too), then the organization's tier limit.
    pub fn project_secret(
        &mut self,
        req: &Req,
    ) -> ApiResult<(u64, std::sync::Arc<fleetops_actors::Organization>)> {
        let secret = req
            .header("x-project-secret")
            .filter(|s| !s.is_empty())
            .ok_or(ApiError::Domain(fleetops_actors::Error::Unauthorized))?;
        let (org, pid) = self.app.rt.auth.check_project_secret(
            req.param("org"),
            req.param("project"),
            secret,
        )?;
        match self.app.limits.check(
            &org.tier,
            Bucket {
                caller: Caller::ProjectSecret(pid),
                org_id: org.id,
            },
        ) {
            Ok(h) => {
                self.rate = Some(h);
                self.disk_floor()?;
                Ok((pid, org))
            }
            Err((e, h)) => {
                self.rate = Some(h);
                Err(e)
            }
        }
    }

    /// Authenticated, rate-limited and at least `min` in the path's organization.
    pub async fn org(&mut self, req: &Req, min: Role) -> ApiResult<(Principal, OrgScope)> {
        let org = req.param("org");
        let p = self.authenticate(req, Some(org)).await?;
        let s = self.app.rt.access.org(&p, org, min)?;
        Ok((p, s))
    }

    /// As [`Cx::org`], then the path's project (404 when absent).
    pub async fn project(&mut self, req: &Req, min: Role) -> ApiResult<(Principal, ProjectScope)> {
        let org = req.param("org");
        let p = self.authenticate(req, Some(org)).await?;
        let s = self
            .app
            .rt
            .access
            .project(&p, org, req.param("project"), min)?;
        Ok((p, s))
    }

    /// Reads and parses the JSON body under the ordinary limit.
    pub async fn json<T: DeserializeOwned>(&self, req: &mut Req) -> ApiResult<T> {
        let bytes = req.body_bytes(self.app.cfg.max_body_bytes).await?;
        body::parse_object(&bytes)
    }
}

/// The bearer value from an `Authorization: Bearer` header, else from `X-API-Key`.
pub(crate) fn credential<'a>(
    authorization: Option<&'a str>,
    api_key: Option<&'a str>,
) -> Option<&'a str> {
    if let Some(v) = authorization {
        let (scheme, rest) = v.split_once(' ')?;
        if scheme.eq_ignore_ascii_case("bearer") && !rest.trim().is_empty() {
            return Some(rest.trim());
        }
        return None;
    }
    api_key.map(str::trim).filter(|v| !v.is_empty())
}
