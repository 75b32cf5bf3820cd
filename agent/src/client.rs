//! Talking to the service: one HTTP client (TLS with the system's roots, plus a configured
//! CA), and a retry loop every call goes through. A connection failure, a timeout, 429 and
//! 5xx are tried again after `Retry-After` when the service says, else after an exponential
//! backoff with jitter (0.5 s doubling up to 30 s, each pause picked between half and all of it); any other answer is the caller's.
//! No answer of the service panics the agent: a body that does not parse is an error.

use std::time::Duration;

use reqwest::{RequestBuilder, Response, StatusCode};

use crate::config::Config;

/// What a call ended with when it did not succeed.
#[derive(Debug)]
pub enum CallError {
    /// The service answered this status (not one tried again).
    Status(StatusCode, String),
    /// Retries ran out (`give_up`), or the request could not be built.
    Gave(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Status(s, body) => write!(f, "the service answered {s}: {body}"),
            CallError::Gave(why) => write!(f, "{why}"),
        }
    }
}

pub fn http_client(cfg: &Config) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(120))
        .user_agent(concat!("fleetops-agent/", env!("CARGO_PKG_VERSION")));
    if let Some(ca) = &cfg.ca_file {
        let pem = std::fs::read(ca).map_err(|e| format!("ca_file {}: {e}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("ca_file {}: {e}", ca.display()))?;
        b = b.tls_certs_merge(certs);
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

/// The pause before try `n` (from 0): 0.5 s doubling, at most 30 s, uniformly jittered.
pub fn backoff(n: u32) -> Duration {
    let cap_ms = (500u64 << n.min(6)).min(30_000);
    Duration::from_millis(jitter(cap_ms))
}

/// A uniform pick in `[cap/2, cap]` milliseconds (half jitter: never a pause near zero).
fn jitter(cap_ms: u64) -> u64 {
    let mut b = [0u8; 8];
    let r = match getrandom::fill(&mut b) {
        Ok(()) => u64::from_ne_bytes(b),
        Err(_) => 0,
    };
    cap_ms / 2 + r % (cap_ms / 2 + 1)
}

/// Whether an answer is worth trying again.
fn transient(s: StatusCode) -> bool {
    s == StatusCode::TOO_MANY_REQUESTS || s == StatusCode::REQUEST_TIMEOUT || s.is_server_error()
}

/// `Retry-After` in seconds, when given (at most 10 minutes).
fn retry_after(r: &Response) -> Option<Duration> {
    let secs: u64 = r
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs.min(600)))
}

/// Sends what `make` builds until the service gives an answer that is not transient: that
/// answer when it is a success, else [`CallError::Status`]. `tries`: how many sends at most
/// (`None`: until it gets through).
pub async fn call(
    make: impl Fn() -> Result<RequestBuilder, String>,
    tries: Option<u32>,
) -> Result<Response, CallError> {
    let mut n = 0u32;
    let mut last_said = String::new();
    loop {
        let req = make().map_err(CallError::Gave)?;
        let pause = match req.send().await {
            Ok(r) if r.status().is_success() || r.status() == StatusCode::NOT_MODIFIED => {
                return Ok(r);
            }
            Ok(r) if transient(r.status()) => retry_after(&r)
                .unwrap_or_else(|| backoff(n))
                .max(Duration::from_millis(200)),
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                return Err(CallError::Status(status, body.chars().take(512).collect()));
            }
            Err(e) => {
                // Said once per kind of failure, not at every try: an unreachable service,
                // or a certificate this robot does not trust.
                let why = reason(&e);
                if why != last_said {
                    eprintln!("fleetops-agent: {why}; trying again");
                    last_said = why;
                }
                backoff(n)
            }
        };
        n = n.saturating_add(1);
        if tries.is_some_and(|t| n >= t) {
            return Err(CallError::Gave(format!("no answer after {n} tries")));
        }
        tokio::time::sleep(pause).await;
    }
}

/// A transport error with its causes ("error sending request for url (...): ...: invalid
/// peer certificate: UnknownIssuer").
fn reason(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_thirty_seconds_with_jitter() {
        for n in 0..20 {
            let d = backoff(n).as_millis() as u64;
            let cap = (500u64 << n.min(6)).min(30_000);
            assert!(d >= cap / 2 && d <= cap, "try {n}: {d} ms");
        }
    }
}
