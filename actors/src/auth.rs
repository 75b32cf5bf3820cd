//! Who is calling: JWTs (HS256 only), API keys, device tokens and project secrets, resolved to
//! a [`Principal`]; password login, refresh within `[auth] refresh_window_seconds` of the
//! password sign-in, and the console's CSRF tokens. Reads only; writes (keys, secrets,
//! sign-outs, an API key's `last_used_at`) go through the directory actor.
//!
//! Keys and secrets are looked up by their SHA-256 (never a slow hash per request) and every
//! comparison of secret material is constant-time.
//!
//! Also kept: a login for an unknown e-mail verifies against a dummy hash, so timing does not
//! tell which addresses have accounts, and argon2 runs on a blocking thread; each password
//! sign-in carries a random id (`sid`) that refresh keeps, and a signed-out sign-in's tokens,
//! refreshes included, are refused from then on; an API key's `last_used_at` is written at
//! most once a minute per key, off the request path.
//!
//! Tested by the unit test below and through the API (`tests/api/accounts/`: login, refresh,
//! expired and forged tokens, the API key life cycle).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use fleetops_storage::{Device, Store, User};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::config::AuthConfig;
use crate::error::{Error, Result};
use crate::secrets::{self, API_KEY_PREFIX, DEVICE_TOKEN_PREFIX};

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iat: i64,
    exp: i64,
    /// Time of the password login this token descends from (refresh is bounded by it).
    auth_time: i64,
    /// The sign-in this token descends from (random, kept by refresh): what a sign-out ends.
    /// Tokens issued before it existed have none; theirs is told apart by `auth_time`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sid: Option<String>,
}

/// How the caller proved who it is.
#[derive(Debug, Clone)]
pub enum Credential {
    /// `sign_in` names the password sign-in the token descends from.
    Jwt {
        auth_time: i64,
        sign_in: String,
    },
    ApiKey {
        key_id: u64,
    },
    Device {
        project_id: u64,
        device_id: u64,
    },
}

/// An authenticated caller. Device tokens carry no user.
#[derive(Debug, Clone)]
pub struct Principal {
    pub user: Option<Arc<User>>,
    pub credential: Credential,
}

/// The party a rate-limit bucket belongs to: each credential has its own bucket, and the
/// project-secret routes share one per project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Caller {
    ApiKey(u64),
    User(u64),
    Device(u64),
    ProjectSecret(u64),
}

impl Principal {
    /// Who is charged for this request under the organization's rate limit.
    pub fn caller(&self) -> Caller {
        match &self.credential {
            Credential::ApiKey { key_id } => Caller::ApiKey(*key_id),
            Credential::Jwt { .. } => Caller::User(self.user.as_ref().map_or(0, |u| u.id)),
            Credential::Device { device_id, .. } => Caller::Device(*device_id),
        }
    }

    pub fn is_superuser(&self) -> bool {
        self.user.as_ref().is_some_and(|u| u.is_superuser)
    }

    /// Who acted, for a record a person reads: the user's e-mail (and the API key's id when
    /// it came through one), or the device.
    pub fn who(&self) -> String {
        let email = self.user.as_ref().map(|u| u.email.clone());
        match (&self.credential, email) {
            (Credential::ApiKey { key_id }, Some(e)) => format!("{e} (API key {key_id})"),
            (Credential::Device { device_id, .. }, _) => format!("device {device_id}"),
            (_, Some(e)) => e,
            (_, None) => "an unknown user".into(),
        }
    }
}

/// An issued access token.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Token {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
}

pub struct Authenticator {
    store: Store,
    enc: EncodingKey,
    dec: DecodingKey,
    validation: Validation,
    cfg: AuthConfig,
    /// Last `last_used_at` written per key, so a busy key costs one write a minute, not one
    /// per request.
    touched: DashMap<u64, i64>,
    /// A real hash of a random password, verified against when the e-mail is unknown so that
    /// timing does not tell which addresses have accounts.
    dummy_phc: String,
    /// Keys the console's CSRF tokens (derived from the JWT secret; never a JWT key itself).
    csrf_key: [u8; 32],
    /// Keys whose `last_used_at` should be persisted (drained by the directory actor).
    pub(crate) touch_tx: tokio::sync::mpsc::UnboundedSender<(u64, i64)>,
}

/// How often `last_used_at` of one API key is rewritten at most.
const TOUCH_EVERY_MS: i64 = 60_000;

impl Authenticator {
    pub(crate) fn new(
        store: Store,
        cfg: AuthConfig,
        secret: &[u8],
        touch_tx: tokio::sync::mpsc::UnboundedSender<(u64, i64)>,
    ) -> Result<Self> {
        let validation = jwt_validation();
        let a = Self {
            store,
            enc: EncodingKey::from_secret(secret),
            dec: DecodingKey::from_secret(secret),
            csrf_key: secrets::sha256(&[b"fleetops-console-csrf\0".as_slice(), secret].concat()),
            validation,
            cfg,
            touched: DashMap::new(),
            dummy_phc: secrets::hash_password(&secrets::random_token(16)?)?,
            touch_tx,
        };
        // jsonwebtoken panics on first use when its crypto backend is misconfigured: find
        // out at start-up, not on the first login.
        let t = a.issue(0, now_ms(), None)?;
        a.decode(&t.access_token)
            .map_err(|_| Error::Internal("JWT self-test failed".into()))?;
        Ok(a)
    }

    fn issue(&self, user_id: u64, auth_time: i64, sid: Option<String>) -> Result<Token> {
        let now = now_ms() / 1000;
        let claims = Claims {
            sub: user_id.to_string(),
            iat: now,
            exp: now + self.cfg.token_ttl_seconds as i64,
            auth_time,
            sid,
        };
        let access_token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.enc)
            .map_err(|e| Error::Internal(format!("jwt encode: {e}")))?;
        Ok(Token {
            access_token,
            token_type: "bearer",
            expires_in: self.cfg.token_ttl_seconds,
        })
    }

    fn decode(&self, token: &str) -> Result<Claims> {
        jsonwebtoken::decode::<Claims>(token, &self.dec, &self.validation)
            .map(|d| d.claims)
            .map_err(|_| Error::Unauthorized)
    }

    /// Password login. Runs argon2 on a blocking thread.
    pub async fn login(self: &Arc<Self>, email: &str, password: &str) -> Result<Token> {
        let user = self.store.user_by_email(&email.trim().to_lowercase())?;
        let phc = user
            .as_ref()
            .map_or(self.dummy_phc.clone(), |u| u.password_hash.clone());
        let pw = password.to_string();
        let ok = tokio::task::spawn_blocking(move || secrets::verify_password(&pw, &phc))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?;
        match user {
            Some(u) if ok => self.issue(u.id, now_ms() / 1000, Some(secrets::random_token(16)?)),
            _ => Err(Error::Unauthorized),
        }
    }

    /// A new token for a JWT principal, within the refresh window of its original login.
    pub fn refresh(&self, p: &Principal) -> Result<Token> {
        let (Credential::Jwt { auth_time, sign_in }, Some(user)) = (&p.credential, &p.user) else {
            return Err(Error::Forbidden);
        };
        if now_ms() / 1000 - auth_time > self.cfg.refresh_window_seconds as i64 {
            return Err(Error::Unauthorized);
        }
        // The same sign-in: its id again (a token from before sign-ins had one stays without).
        let sid = sign_in.strip_prefix("s:").map(str::to_string);
        self.issue(user.id, *auth_time, sid)
    }

    /// The console's CSRF token of a signed-in user: an HMAC of the user and the time of the
    /// password sign-in, so it outlives the token refreshes of that sign-in (every tab's forms
    /// stay valid) and cannot be computed without the server's secret.
    pub fn csrf_token(&self, p: &Principal) -> Option<String> {
        use hmac::{KeyInit, Mac};
        let (Credential::Jwt { auth_time, .. }, Some(user)) = (&p.credential, &p.user) else {
            return None;
        };
        let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.csrf_key).ok()?;
        m.update(&user.id.to_be_bytes());
        m.update(&auth_time.to_be_bytes());
        Some(hex::encode(m.finalize().into_bytes()))
    }

    /// How long an issued JWT lives.
    pub fn token_ttl_seconds(&self) -> u64 {
        self.cfg.token_ttl_seconds
    }

    /// When a valid JWT was issued (Unix seconds); `None` for anything else. The console
    /// refreshes its cookie once half of the token's life has passed.
    pub fn issued_at(&self, token: &str) -> Option<i64> {
        self.decode(token).ok().map(|c| c.iat)
    }

    /// [`AuthHandle::resolve`] for a request's handler: a device token's lookup (the one no
    /// cache answers) is awaited, so on a network database no runtime thread waits for it.
    pub async fn resolve_async(&self, value: &str) -> Result<Principal> {
        if value.starts_with(DEVICE_TOKEN_PREFIX) {
            let hash = secrets::sha256(value.as_bytes());
            let d = self.store.device_by_token_async(&hash).await?;
            return self.device_principal(d, &hash);
        }
        self.resolve(value)
    }

    /// The principal of the device a token's lookup found.
    fn device_principal(&self, d: Option<Device>, hash: &[u8; 32]) -> Result<Principal> {
        let d = d.ok_or(Error::Unauthorized)?;
        // The index lookup already matched on the hash; compare once more in constant time
        // so that equality is never decided by a variable-time path.
        if !secrets::ct_eq(&d.token_hash, hash) {
            return Err(Error::Unauthorized);
        }
        // A deleted organization's devices are refused at once, while its data is purged.
        if self.store.project_retired(d.project_id) {
            return Err(Error::Unauthorized);
        }
        Ok(Principal {
            user: None,
            credential: Credential::Device {
                project_id: d.project_id,
                device_id: d.id,
            },
        })
    }

    /// Resolves a bearer value (JWT, API key or device token).
    pub fn resolve(&self, value: &str) -> Result<Principal> {
        if value.starts_with(DEVICE_TOKEN_PREFIX) {
            let hash = secrets::sha256(value.as_bytes());
            let d = self.store.device_by_token(&hash)?;
            return self.device_principal(d, &hash);
        }
        if value.starts_with(API_KEY_PREFIX) {
            let hash = secrets::sha256(value.as_bytes());
            let key = self
                .store
                .api_key_by_hash(&hash)?
                .ok_or(Error::Unauthorized)?;
            if !secrets::ct_eq(&key.hash, &hash) {
                return Err(Error::Unauthorized);
            }
            let user = self.store.user(key.user_id)?.ok_or(Error::Unauthorized)?;
            self.touch(key.id);
            return Ok(Principal {
                user: Some(user),
                credential: Credential::ApiKey { key_id: key.id },
            });
        }
        let claims = self.decode(value)?;
        let uid: u64 = claims.sub.parse().map_err(|_| Error::Unauthorized)?;
        let user = self.store.user(uid)?.ok_or(Error::Unauthorized)?;
        // A signed-out sign-in's tokens are never believed again (its refreshes included).
        let sign_in = sign_in_of(&claims);
        if self.store.is_signed_out(uid, &sign_in)? {
            return Err(Error::Unauthorized);
        }
        Ok(Principal {
            user: Some(user),
            credential: Credential::Jwt {
                auth_time: claims.auth_time,
                sign_in,
            },
        })
    }

    /// Checks a project secret against the project's stored hash.
    pub fn check_project_secret(
        &self,
        org_slug: &str,
        project_slug: &str,
        secret: &str,
    ) -> Result<(Arc<fleetops_storage::Organization>, u64)> {
        let org = self
            .store
            .org_by_slug(org_slug)?
            .ok_or(Error::Unauthorized)?;
        let p = self
            .store
            .project_by_slug(org.id, project_slug)?
            .ok_or(Error::Unauthorized)?;
        if secrets::ct_eq(&p.secret_hash, &secrets::sha256(secret.as_bytes())) {
            Ok((org, p.id))
        } else {
            Err(Error::Unauthorized)
        }
    }

    fn touch(&self, key_id: u64) {
        let now = now_ms();
        let due = self
            .touched
            .get(&key_id)
            .is_none_or(|last| now - *last >= TOUCH_EVERY_MS);
        if due {
            self.touched.insert(key_id, now);
            let _ = self.touch_tx.send((key_id, now));
        }
    }

    /// Drops the touch cache of keys not used for a while (called by the housekeeper).
    pub fn prune(&self) {
        let cutoff = now_ms() - 10 * TOUCH_EVERY_MS;
        self.touched.retain(|_, t| *t > cutoff);
    }

    pub fn token_ttl(&self) -> Duration {
        Duration::from_secs(self.cfg.token_ttl_seconds)
    }
}

/// The sign-in a token descends from: its `sid`, or, for a token issued before sign-ins had
/// one, the time of its password sign-in (such tokens expire within the refresh window).
fn sign_in_of(c: &Claims) -> String {
    match &c.sid {
        Some(s) if !s.is_empty() && s.len() <= 64 => format!("s:{s}"),
        _ => format!("t:{}", c.auth_time),
    }
}

/// What a token must be to be believed: HS256, no leeway, `exp`, `sub` and `iat` present.
pub(crate) fn jwt_validation() -> Validation {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp", "sub", "iat"]);
    validation
}

/// Decodes a token the way [`Authenticator::resolve`] does, under `secret`, and reads its
/// subject; for the fuzz targets.
pub(crate) fn decode_with(secret: &[u8], token: &str) -> Result<u64> {
    let claims =
        jsonwebtoken::decode::<Claims>(token, &DecodingKey::from_secret(secret), &jwt_validation())
            .map(|d| d.claims)
            .map_err(|_| Error::Unauthorized)?;
    claims.sub.parse().map_err(|_| Error::Unauthorized)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_token_from_before_sign_ins_had_an_id_is_told_apart_by_its_sign_in_time() {
        let old: Claims =
            serde_json::from_str(r#"{"sub":"1","iat":5,"exp":9,"auth_time":5}"#).unwrap();
        assert_eq!(sign_in_of(&old), "t:5");
        let new: Claims =
            serde_json::from_str(r#"{"sub":"1","iat":5,"exp":9,"auth_time":5,"sid":"abc"}"#)
                .unwrap();
        assert_eq!(sign_in_of(&new), "s:abc");
        // An id no sign-in would have (empty, or longer than any made) is not trusted as one.
        let odd: Claims = serde_json::from_str(&format!(
            r#"{{"sub":"1","iat":5,"exp":9,"auth_time":7,"sid":"{}"}}"#,
            "x".repeat(65)
        ))
        .unwrap();
        assert_eq!(sign_in_of(&odd), "t:7");
    }
}
