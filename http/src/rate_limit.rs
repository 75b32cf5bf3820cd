//! Per-tier rate limits (governor, GCRA): one bucket per credential and organization, the
//! three `X-RateLimit-*` headers on every authenticated response, and a per-address login
//! limiter against password guessing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use http::HeaderValue;

use crate::config::Tier;
use crate::error::ApiError;

pub use fleetops_actors::auth::Caller;

/// One bucket: a caller within one organization (a key used in two organizations is charged
/// in each separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bucket {
    pub caller: Caller,
    pub org_id: u64,
}

type Keyed<K> = RateLimiter<K, DefaultKeyedStateStore<K>, DefaultClock, StateInformationMiddleware>;

/// The values of the three headers.
#[derive(Debug, Clone, Copy)]
pub struct RateHeaders {
    pub limit: u32,
    pub remaining: u32,
    pub reset: u64,
}

impl RateHeaders {
    pub fn apply(&self, h: &mut http::HeaderMap) {
        h.insert("x-ratelimit-limit", HeaderValue::from(self.limit));
        h.insert("x-ratelimit-remaining", HeaderValue::from(self.remaining));
        h.insert("x-ratelimit-reset", HeaderValue::from(self.reset));
    }
}

struct TierLimiter {
    limit: u32,
    /// Time for one request to be replenished.
    period: Duration,
    limiter: Keyed<Bucket>,
}

pub struct RateLimits {
    tiers: HashMap<String, TierLimiter>,
    /// Login attempts per client (an IPv6 client counted by its /64).
    login: Keyed<IpAddr>,
    /// Login attempts per account, by the SHA-256 of the address as given (trimmed and
    /// lower-cased), unknown addresses included, so rotating addresses does not lift it.
    login_account: Keyed<[u8; 32]>,
    clock: DefaultClock,
}

/// The key a client is counted under: an IPv4 address (an IPv4-mapped IPv6 one as its IPv4
/// form), or an IPv6 address's /64, the block one subscriber is usually given, so rotating
/// through it does not make a new client each time.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

fn quota(per_minute: u32) -> (Quota, u32, Duration) {
    let n = NonZeroU32::new(per_minute.max(1)).unwrap_or(NonZeroU32::MIN);
    let q = Quota::per_minute(n);
    (q, n.get(), q.replenish_interval())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl RateLimits {
    pub fn new(tiers: &[Tier], login_per_minute: u32, login_per_account_per_minute: u32) -> Self {
        let tiers = tiers
            .iter()
            .map(|t| {
                let (q, limit, period) = quota(t.requests_per_minute);
                let limiter = RateLimiter::keyed(q).with_middleware::<StateInformationMiddleware>();
                (
                    t.name.clone(),
                    TierLimiter {
                        limit,
                        period,
                        limiter,
                    },
                )
            })
            .collect();
        let (q, _, _) = quota(login_per_minute);
        let (qa, _, _) = quota(login_per_account_per_minute);
        Self {
            tiers,
            login: RateLimiter::keyed(q).with_middleware::<StateInformationMiddleware>(),
            login_account: RateLimiter::keyed(qa).with_middleware::<StateInformationMiddleware>(),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one request from `bucket` under `tier`. On success returns the headers; over the
    /// limit, the 429 (whose response also carries the headers).
    pub fn check(
        &self,
        tier: &str,
        bucket: Bucket,
    ) -> Result<RateHeaders, (ApiError, RateHeaders)> {
        let Some(t) = self.tiers.get(tier).or_else(|| self.tiers.get("free")) else {
            return Ok(RateHeaders {
                limit: 0,
                remaining: 0,
                reset: unix_now(),
            });
        };
        match t.limiter.check_key(&bucket) {
            Ok(snap) => {
                let remaining = snap.remaining_burst_capacity();
                let empty = t.period * (t.limit - remaining.min(t.limit));
                Ok(RateHeaders {
                    limit: t.limit,
                    remaining,
                    reset: unix_now() + empty.as_secs_f64().ceil() as u64,
                })
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                let retry_after = wait.as_secs_f64().ceil().max(1.0) as u64;
                let h = RateHeaders {
                    limit: t.limit,
                    remaining: 0,
                    reset: unix_now() + (t.period * t.limit).as_secs_f64().ceil() as u64,
                };
                Err((ApiError::RateLimited { retry_after }, h))
            }
        }
    }

    /// One login attempt from `addr` (counted by [`client_key`]).
    pub fn check_login(&self, addr: IpAddr) -> Result<(), ApiError> {
        self.limited(self.login.check_key(&client_key(addr)).map(|_| ()))
    }

    /// One login attempt for the account `email` names, whether or not it exists, before
    /// its password is hashed: guessing one account's password from many addresses is held
    /// to `login_per_account_per_minute`.
    pub fn check_login_account(&self, email: &str) -> Result<(), ApiError> {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(email.trim().to_lowercase().as_bytes()).into();
        self.limited(self.login_account.check_key(&key).map(|_| ()))
    }

    fn limited(
        &self,
        r: Result<(), governor::NotUntil<<DefaultClock as Clock>::Instant>>,
    ) -> Result<(), ApiError> {
        r.map_err(|n| {
            let retry_after = n
                .wait_time_from(self.clock.now())
                .as_secs_f64()
                .ceil()
                .max(1.0) as u64;
            ApiError::RateLimited { retry_after }
        })
    }

    /// Forgets buckets that are back to full, so keyed state does not grow without bound.
    pub fn prune(&self) {
        for t in self.tiers.values() {
            t.limiter.retain_recent();
            t.limiter.shrink_to_fit();
        }
        self.login.retain_recent();
        self.login.shrink_to_fit();
        self.login_account.retain_recent();
        self.login_account.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u64) -> Bucket {
        Bucket {
            caller: Caller::ApiKey(id),
            org_id: 0,
        }
    }

    #[test]
    fn counts_down_then_429_with_retry_after() {
        let rl = RateLimits::new(
            &[Tier {
                name: "free".into(),
                requests_per_minute: 3,
                storage_bytes: 0,
            }],
            10,
            10,
        );
        let h = rl.check("free", key(1)).unwrap();
        assert_eq!((h.limit, h.remaining), (3, 2));
        rl.check("free", key(1)).unwrap();
        let h = rl.check("free", key(1)).unwrap();
        assert_eq!(h.remaining, 0);
        let (e, h) = rl.check("free", key(1)).unwrap_err();
        assert_eq!(h.remaining, 0);
        match e {
            ApiError::RateLimited { retry_after } => assert!((1..=20).contains(&retry_after)),
            other => panic!("{other:?}"),
        }
        // Another bucket is untouched.
        assert_eq!(rl.check("free", key(2)).unwrap().remaining, 2);
    }

    #[test]
    fn clients_are_counted_by_ipv4_address_or_ipv6_64() {
        let k = |s: &str| client_key(s.parse().unwrap()).to_string();
        assert_eq!(k("192.0.2.7"), "192.0.2.7");
        assert_eq!(k("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(k("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
    }

    #[test]
    fn one_account_is_limited_whatever_the_address_and_spelling() {
        let rl = RateLimits::new(&[], 1000, 2);
        rl.check_login_account("Admin@Example.com").unwrap();
        rl.check_login_account(" admin@example.com ").unwrap();
        assert!(matches!(
            rl.check_login_account("ADMIN@example.com"),
            Err(ApiError::RateLimited { .. })
        ));
        rl.check_login_account("other@example.com").unwrap();
    }
}
