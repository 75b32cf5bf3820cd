//! The webhook secret: verifying signatures (constant time), rotation with a grace period
//! for the previous secret, the one-time print of a generated secret, and the status the
//! superuser sees.

use super::RECENT_REJECTED;
use super::WebhooksHandle;
use super::intake;
use super::intake::IntakeMsg;
use super::intake::SecretState;
use super::views::DeliveryView;
use super::views::LogOutcome;
use super::views::Rotated;
use super::views::WebhooksStatus;
use crate::clock::fmt_ms;
use crate::config::ScmConfig;
use crate::error::Error;
use crate::error::Result;
use fleetops_storage::Store;

/// HMAC-SHA256 check in constant time, with aws-lc's assembly SHA-256 (the portable one was
/// a fifth of the intake's CPU on 23 KB deliveries).
fn hmac_ok(key: &[u8], body: &[u8], sig: &[u8]) -> bool {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    aws_lc_rs::hmac::verify(&key, body, sig).is_ok()
}

/// The MAC an `X-Hub-Signature-256` header carries (`sha256=<hex>`).
fn header_signature(header: Option<&str>) -> Option<Vec<u8>> {
    header
        .and_then(|h| h.trim().strip_prefix("sha256="))
        .and_then(|h| hex::decode(h).ok())
}

/// Whether `header` signs `body` under `secret` (the check [`WebhooksHandle::verify`] makes
/// for each live secret); for the fuzz targets.
pub(crate) fn signature_matches(secret: &[u8], header: Option<&str>, body: &[u8]) -> bool {
    header_signature(header).is_some_and(|sig| hmac_ok(secret, body, &sig))
}

/// Loads the secret state: the stored one, else seeded from the configuration.
pub(crate) fn load_secret(store: &Store, cfg: &ScmConfig) -> Result<SecretState> {
    if let Some(v) = store.meta_get(intake::SECRET_META)? {
        let s: SecretState =
            serde_json::from_slice(&v).map_err(|e| Error::Internal(e.to_string()))?;
        if !cfg.webhook_secret.is_empty() && cfg.webhook_secret != s.current {
            tracing::warn!(
                "the configured webhook secret differs from the one rotated through the API; the rotated one stays current"
            );
        }
        return Ok(s);
    }
    // Nothing configured: generate one, as with the JWT secret, so that a newcomer's host can
    // deliver at once; it is printed once by `serve` (see `take_generated_secret`).
    let generated = cfg.webhook_secret.is_empty();
    let current = if generated {
        crate::secrets::random_token(32)?
    } else {
        cfg.webhook_secret.clone()
    };
    let s = SecretState {
        current,
        created_at: crate::clock::now_ms(),
        ..SecretState::default()
    };
    let v = serde_json::to_vec(&s).map_err(|e| Error::Internal(e.to_string()))?;
    if generated {
        store.meta_put(UNSHOWN_SECRET_META, b"1")?;
    }
    store.meta_put(intake::SECRET_META, &v)?;
    store.flush_blocking()?;
    Ok(s)
}

/// The bus subject on which a node announces a rotation of the webhook secret.
pub(crate) const SECRET_SUBJECT: &str = "fleetops.webhook-secret";

/// Present while a generated webhook secret has not yet been printed by `serve`.
const UNSHOWN_SECRET_META: &str = "scm_webhook_secret_unshown";

impl WebhooksHandle {
    pub fn max_body_bytes(&self) -> u64 {
        self.cfg.max_body_bytes
    }

    /// The webhook secret fleetops generated, the first time this is asked after generating
    /// it (so `serve` prints it once, whichever command first opened the data directory).
    pub fn take_generated_secret(&self) -> Result<Option<String>> {
        if self.store.meta_get(UNSHOWN_SECRET_META)?.is_none() {
            return Ok(None);
        }
        let current = self
            .secret
            .read()
            .map(|s| s.current.clone())
            .unwrap_or_default();
        self.store.meta_remove(UNSHOWN_SECRET_META)?;
        self.store.flush_blocking()?;
        Ok((!current.is_empty()).then_some(current))
    }

    pub(super) fn note_rejected(
        &self,
        id: Option<&str>,
        event: Option<&str>,
        outcome: LogOutcome,
        reason: &str,
    ) {
        let now = self.clock.now_ms();
        if let Ok(mut r) = self.rejected.lock() {
            if r.len() >= RECENT_REJECTED {
                r.pop_front();
            }
            r.push_back(DeliveryView {
                // Header values as sent, clipped: the list is bounded in bytes too.
                delivery_id: crate::text::clip(id.unwrap_or_default(), 64),
                event: crate::text::clip(event.unwrap_or_default(), 64),
                action: None,
                received_at: fmt_ms(now),
                status_code: 401,
                outcome,
                reason: Some(reason.into()),
                installation_id: None,
                repository: None,
                project: None,
                test_run_id: None,
                received_ms: now,
            });
        }
    }

    /// Whether `X-Hub-Signature-256` matches the raw body under the current secret (or one
    /// it replaced, during that one's grace period), in constant time.
    fn signature_ok(&self, header: Option<&str>, body: &[u8]) -> bool {
        let sig = header_signature(header);
        match (&sig, self.secret.read()) {
            (Some(sig), Ok(s)) => {
                let now = self.clock.now_ms();
                (!s.current.is_empty() && hmac_ok(s.current.as_bytes(), body, sig))
                    || s.live_earlier(now)
                        .iter()
                        .any(|e| hmac_ok(e.secret.as_bytes(), body, sig))
            }
            _ => false,
        }
    }

    /// Takes `next` as the secret state unless it is older than the one held: of two
    /// rotations, the later stored names the other's secret among its earlier ones, so an
    /// answer that comes second never rolls the state back.
    fn adopt(&self, next: SecretState) {
        if let Ok(mut s) = self.secret.write()
            && (s.current.is_empty()
                || s.current == next.current
                || next.earlier.iter().any(|e| e.secret == s.current))
        {
            *s = next;
        }
    }

    /// Reads the secret state again from the store (another node rotated it).
    pub(crate) fn reload_secret(&self) -> Result<()> {
        if let Some(v) = self.store.meta_get(intake::SECRET_META)? {
            let s: SecretState =
                serde_json::from_slice(&v).map_err(|e| Error::Internal(e.to_string()))?;
            self.adopt(s);
        }
        Ok(())
    }

    /// Checks the signature; a failure is counted and noted. A large body is hashed on the
    /// blocking pool (25 MiB of HMAC-SHA256 is tens of milliseconds of CPU).
    pub async fn verify(
        &self,
        header: Option<&str>,
        body: &bytes::Bytes,
        id: Option<&str>,
        event: Option<&str>,
    ) -> Result<()> {
        let signed = header.is_some_and(|h| h.trim().starts_with("sha256="));
        let ok = if signed && body.len() > 64 * 1024 {
            let (me, header, body) = (self.clone(), header.map(str::to_string), body.clone());
            crate::off_thread(move || Ok(me.signature_ok(header.as_deref(), &body))).await?
        } else {
            self.signature_ok(header, body)
        };
        if ok {
            return Ok(());
        }
        // Several nodes: another may have rotated the secret and its announcement been lost.
        let now = self.clock.now_ms();
        let read_at = self
            .secret_read_at
            .load(std::sync::atomic::Ordering::Relaxed);
        if signed && self.bus.is_shared() && now - read_at >= 1_000 {
            self.secret_read_at
                .store(now, std::sync::atomic::Ordering::Relaxed);
            let me = self.clone();
            crate::off_thread(move || me.reload_secret()).await?;
            let (me, header, body) = (self.clone(), header.map(str::to_string), body.clone());
            if crate::off_thread(move || Ok(me.signature_ok(header.as_deref(), &body))).await? {
                return Ok(());
            }
        }
        if let Ok(mut f) = self.failures.lock() {
            let now = self.clock.now_ms();
            while f.front().is_some_and(|t| *t < now - 3_600_000) {
                f.pop_front();
            }
            if f.len() < 100_000 {
                f.push_back(now);
            }
        }
        self.note_rejected(id, event, LogOutcome::Rejected, "invalid_signature");
        Err(Error::Rejected("Invalid signature".into()))
    }

    /// A new secret; the one it replaces keeps verifying for `rotation_grace_seconds`, and
    /// each earlier one until its own grace period ends.
    pub async fn rotate(&self) -> Result<Rotated> {
        let fresh = format!(
            "whsec_{}",
            hex::encode(
                crate::secrets::random_bytes(32).map_err(|e| Error::Internal(e.to_string()))?
            )
        );
        let now = self.clock.now_ms();
        let grace_ms = self.cfg.rotation_grace_seconds.saturating_mul(1000);
        let next = self
            .intake
            .call(|reply| IntakeMsg::Rotate {
                fresh: fresh.clone(),
                now,
                grace_ms,
                reply,
            })
            .await?;
        self.store.durable().await?;
        self.adopt(next.clone());
        if self.bus.is_shared() {
            self.bus.publish(SECRET_SUBJECT.into(), &[]);
        }
        Ok(Rotated {
            webhook_secret: fresh,
            previous_valid_until: next.previous_valid_until.map(fmt_ms),
        })
    }

    pub fn status(&self) -> WebhooksStatus {
        let now = self.clock.now_ms();
        let s = self.secret.read().map(|s| s.clone()).unwrap_or_default();
        let age = (!s.current.is_empty()).then(|| (now - s.created_at).max(0) / 86_400_000);
        let failures = self
            .failures
            .lock()
            .map(|f| f.iter().filter(|t| **t >= now - 3_600_000).count())
            .unwrap_or(0);
        WebhooksStatus {
            secret_age_days: age,
            rotation_due: age.is_some_and(|a| a >= self.cfg.rotation_days),
            signature_failures_last_hour: failures,
            signature_failure_alert: failures
                >= self.cfg.signature_failure_alert_threshold as usize,
        }
    }
}
