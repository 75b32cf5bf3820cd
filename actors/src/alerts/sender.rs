//! Sends one rendered notification: HTTP through a client that resolves names itself and
//! connects only to vetted addresses (no proxy, no redirects, timeouts on connect and on the
//! whole request), e-mail through the configured SMTP server. Says whether a failure is
//! worth retrying.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lettre::AsyncTransport;

use crate::config::{AlertsConfig, SmtpConfig};
use crate::rules::notifications::Outbound;
use crate::rules::targets::{is_private, outbound_url};

/// Why a send failed, and whether to try again.
#[derive(Debug, Clone, PartialEq)]
pub enum SendError {
    /// A 5xx, 429, timeout or connection error; `after` is a `Retry-After` when one came.
    Retry {
        message: String,
        after: Option<Duration>,
    },
    /// Any other refusal: recorded, never retried.
    Final(String),
}

impl SendError {
    pub fn message(&self) -> &str {
        match self {
            SendError::Retry { message, .. } | SendError::Final(message) => message,
        }
    }
}

/// The resolver's refusal, found again by type in the client's error chain.
#[derive(Debug)]
struct RefusedTarget(String);

impl std::fmt::Display for RefusedTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} resolves only to loopback, private or other special-purpose addresses",
            self.0
        )
    }
}

impl std::error::Error for RefusedTarget {}

/// The longest wait a `Retry-After` can impose, whatever the configuration says.
const RETRY_AFTER_CEILING_SECS: u64 = 300;

/// Resolves with `[alerts] hosts` first, then the system's resolver, and keeps only the
/// addresses the guard allows; no address left is an error, so nothing connects elsewhere.
struct VettingResolver {
    hosts: std::collections::BTreeMap<String, std::net::IpAddr>,
    allow_private: bool,
}

impl reqwest::dns::Resolve for VettingResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
        let fixed = self.hosts.get(&host).copied();
        let allow_private = self.allow_private;
        Box::pin(async move {
            let found: Vec<SocketAddr> = match fixed {
                Some(ip) => vec![SocketAddr::new(ip, 0)],
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            let vetted: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| allow_private || !is_private(a.ip()))
                .collect();
            if vetted.is_empty() {
                let why: Box<dyn std::error::Error + Send + Sync> = if found.is_empty() {
                    format!("{host} did not resolve").into()
                } else {
                    Box::new(RefusedTarget(host.clone()))
                };
                return Err(why);
            }
            Ok(Box::new(vetted.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[derive(Clone)]
pub struct Sender {
    http: reqwest::Client,
    cfg: Arc<AlertsConfig>,
    smtp: Arc<SmtpConfig>,
}

impl Sender {
    pub fn new(cfg: &AlertsConfig, smtp: &SmtpConfig) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .dns_resolver(Arc::new(VettingResolver {
                hosts: cfg
                    .hosts
                    .iter()
                    .map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), *v))
                    .collect(),
                allow_private: cfg.allow_private_targets,
            }))
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(cfg.connect_timeout_seconds.max(1)))
            .timeout(Duration::from_secs(cfg.request_timeout_seconds.max(1)))
            .user_agent(concat!("fleetops/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            cfg: Arc::new(cfg.clone()),
            smtp: Arc::new(smtp.clone()),
        })
    }

    pub fn pagerduty_url(&self) -> &str {
        &self.cfg.pagerduty_events_url
    }

    /// One attempt. `Ok` carries a short description of the answer.
    pub async fn send(&self, out: &Outbound) -> Result<String, SendError> {
        match out {
            Outbound::Http {
                method,
                url,
                headers,
                body,
            } => self.http_once(method, url, headers, body).await,
            Outbound::Mail { to, subject, body } => self.mail_once(to, subject, body).await,
        }
    }

    async fn http_once(
        &self,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<String, SendError> {
        // An address literal never reaches the resolver: vet it here, at send time too.
        let url = outbound_url("url", url, self.cfg.allow_private_targets)
            .map_err(|e| SendError::Final(format!("refused target: {e}")))?;
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| SendError::Final(format!("bad method {method}")))?;
        let mut rb = self.http.request(method, url).body(body.to_vec());
        for (k, v) in headers {
            rb = rb.header(k, v);
        }
        let resp = match rb.send().await {
            Ok(r) => r,
            Err(e) => return Err(classify(&e)),
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(format!("HTTP {}", status.as_u16()));
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after)
            .map(|d| {
                d.min(Duration::from_secs(
                    self.cfg
                        .max_retry_after_seconds
                        .min(RETRY_AFTER_CEILING_SECS),
                ))
            });
        let message = format!("HTTP {}", status.as_u16());
        if status.is_server_error() || status.as_u16() == 429 {
            Err(SendError::Retry {
                message,
                after: retry_after,
            })
        } else {
            Err(SendError::Final(message))
        }
    }

    async fn mail_once(
        &self,
        to: &[String],
        subject: &str,
        body: &str,
    ) -> Result<String, SendError> {
        use lettre::transport::smtp::client::{Tls, TlsParameters};
        let s = &self.smtp;
        if s.host.is_empty() {
            return Err(SendError::Final(
                "no SMTP server is configured ([smtp] host)".into(),
            ));
        }
        let from: lettre::message::Mailbox = s
            .from
            .parse()
            .map_err(|e| SendError::Final(format!("[smtp] from: {e}")))?;
        let mut m = lettre::Message::builder().from(from).subject(subject);
        for r in to {
            let mb: lettre::message::Mailbox = r
                .parse()
                .map_err(|e| SendError::Final(format!("recipient {r}: {e}")))?;
            m = m.to(mb);
        }
        let msg = m
            .body(body.to_string())
            .map_err(|e| SendError::Final(format!("message: {e}")))?;
        let params = TlsParameters::new(s.host.clone())
            .map_err(|e| SendError::Final(format!("TLS: {e}")))?;
        let mut t =
            lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::builder_dangerous(&s.host)
                .port(s.port)
                .timeout(Some(Duration::from_secs(s.timeout_seconds.max(1))));
        if s.implicit_tls {
            t = t.tls(Tls::Wrapper(params));
        } else if s.username.is_empty() {
            t = t.tls(Tls::Opportunistic(params));
        } else {
            t = t.tls(Tls::Required(params));
        }
        if !s.username.is_empty() {
            t = t.credentials(lettre::transport::smtp::authentication::Credentials::new(
                s.username.clone(),
                s.password.clone(),
            ));
        }
        match t.build().send(msg).await {
            Ok(r) => Ok(format!("SMTP {}", r.code())),
            // A permanent reply, or a client-side failure (TLS required and not offered, a
            // refused certificate): the same on every attempt.
            Err(e) if e.is_permanent() || e.is_client() || e.is_tls() => {
                Err(SendError::Final(format!("SMTP: {e}")))
            }
            Err(e) => Err(SendError::Retry {
                message: format!("SMTP: {e}"),
                after: None,
            }),
        }
    }
}

fn classify(e: &reqwest::Error) -> SendError {
    // The resolver's refusal is final: the target is not allowed, trying again changes nothing.
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<RefusedTarget>() {
            return SendError::Final(format!("refused target: {r}"));
        }
        src = s.source();
    }
    if e.is_builder() || e.is_redirect() {
        return SendError::Final(format!("request failed: {}", root_cause(e)));
    }
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    SendError::Retry {
        message: format!("{kind}: {}", root_cause(e)),
        after: None,
    }
}

fn root_cause(e: &dyn std::error::Error) -> String {
    let mut last = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        last = s.to_string();
        src = s.source();
    }
    last
}

/// `Retry-After` as seconds or an HTTP date.
fn parse_retry_after(v: &str) -> Option<Duration> {
    if let Ok(n) = v.trim().parse::<u64>() {
        return Some(Duration::from_secs(n));
    }
    let t = time::OffsetDateTime::parse(v.trim(), &time::format_description::well_known::Rfc2822)
        .ok()?;
    let secs = (t - time::OffsetDateTime::now_utc()).whole_seconds();
    Some(Duration::from_secs(secs.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
