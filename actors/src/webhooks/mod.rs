//! Inbound webhooks from the source-code host, as mailbox flows:
//!
//! ```text
//! POST /scm/webhooks ─ verify (HMAC, constant time) ─▶ IntakeActor (claim id + store, atomic)
//!        ◀── 202 once durable (group commit) ─────────┘        │ seq
//!                                                               ▼
//!                       WorkerActor (arrival order) ─▶ InstallationActor (one per installation)
//!                                                               │
//!                                                               ▼
//!                                                         JobDispatcher ─▶ test runs
//! ```
//!
//! A delivery answered 202 is on disk with its payload and a place in the queue; the worker's
//! effect and the delivery's outcome are written in one batch, so after a crash every queued
//! delivery is processed exactly once. Reads (lists, status) go to the store.

pub(crate) mod dispatcher;
pub(crate) mod installation;
pub(crate) mod intake;
pub mod payload;
pub(crate) mod worker;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use fleetops_storage::{Delivery, Installation, RepoLink, Store, TestRun, scm::ScmBatch};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::clock::fmt_ms;
use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::mailbox::Slot;
use crate::views::{Page, PageReq};
use dispatcher::DispatcherMsg;
use fleetops_storage::DeliveryOutcome;
use installation::{InstallationActor, InstallationMsg};
use intake::IntakeMsg;
use payload::Payload;

pub use crate::config::{RunsConfig, ScmConfig};

/// The webhook secret: the current one, since when, and the previous one during its grace.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SecretState {
    pub current: String,
    pub created_at: i64,
    pub previous: Option<String>,
    pub previous_valid_until: Option<i64>,
}

/// A delivery being worked, with its parsed payload.
pub(crate) struct Work {
    pub delivery: Delivery,
    pub payload: Payload,
}

/// A PATCH of a repository link.
#[derive(Debug, Clone, Default)]
pub struct RepoPatch {
    pub branch_patterns: Option<Vec<String>>,
    pub include_drafts: Option<bool>,
}

/// Whether a delivery is still waiting to be worked (a retried call finds it done).
pub(crate) fn still_queued(store: &Store, seq: u64) -> Result<bool> {
    Ok(store
        .delivery(seq)?
        .is_some_and(|d| d.outcome == DeliveryOutcome::Queued))
}

/// Records a delivery as skipped with a reason.
pub(crate) fn skip(store: &Store, d: &Delivery, reason: &str) -> Result<()> {
    let mut d = d.clone();
    d.outcome = DeliveryOutcome::Skipped;
    d.reason = Some(reason.into());
    let mut b = ScmBatch::default();
    b.finish_delivery(&d)?;
    Ok(b.commit(store)?)
}

/// What `POST /scm/webhooks` answers with 202.
#[derive(Debug, Serialize)]
pub struct Accepted {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
}

/// A delivery in the log.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryView {
    pub delivery_id: String,
    pub event: String,
    pub action: Option<String>,
    pub received_at: String,
    pub status_code: u16,
    pub outcome: String,
    pub reason: Option<String>,
    pub installation_id: Option<u64>,
    pub repository: Option<String>,
    /// The resolved project's slug.
    pub project: Option<String>,
    pub test_run_id: Option<u64>,
    #[serde(skip)]
    received_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryView,
    /// The body as received (a JSON string when it was not JSON; null when not kept).
    pub payload: Option<Box<RawValue>>,
}

#[derive(Debug, Default, Clone)]
pub struct DeliveryFilter {
    pub outcome: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct InstallationView {
    pub id: u64,
    pub account_login: String,
    pub account_type: String,
    pub repository_selection: String,
    pub state: String,
    pub repositories: Vec<String>,
}

impl From<&Installation> for InstallationView {
    fn from(i: &Installation) -> Self {
        Self {
            id: i.id,
            account_login: i.account_login.clone(),
            account_type: i.account_type.clone(),
            repository_selection: i.repository_selection.clone(),
            state: i.state.to_string(),
            repositories: i.repositories.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct RepoView {
    pub id: u64,
    pub full_name: String,
    /// pending (no installation holds it), connected, disconnected (removed; history kept).
    pub state: &'static str,
    pub installation_id: Option<u64>,
    pub branch_patterns: Vec<String>,
    pub include_drafts: bool,
    pub created_at: String,
    pub updated_at: String,
}

#[derive(Debug, Serialize)]
pub struct TestRunView {
    pub id: u64,
    pub repository: String,
    pub commit_sha: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub event: String,
    pub pull_request_number: Option<u64>,
    pub status: fleetops_storage::RunStatus,
    pub attempt: u32,
    pub idempotency_key: String,
    pub delivery_id: Option<String>,
    pub summary: Option<String>,
    pub urls: Box<RawValue>,
    pub lease_expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&TestRun> for TestRunView {
    fn from(r: &TestRun) -> Self {
        Self {
            id: r.id,
            repository: r.repository.clone(),
            commit_sha: r.commit_sha.clone(),
            git_ref: r.git_ref.clone(),
            event: r.event.clone(),
            pull_request_number: r.pull_request_number,
            status: r.status,
            attempt: r.attempt,
            idempotency_key: r.idempotency_key.clone(),
            delivery_id: r.delivery_id.clone(),
            summary: r.summary.clone(),
            urls: crate::pipeline::raw_json(&r.urls_json, "{}"),
            lease_expires_at: r.lease_expires_at.map(fmt_ms),
            created_at: fmt_ms(r.created_at),
            updated_at: fmt_ms(r.updated_at),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct RunFilter {
    pub status: Option<String>,
    pub repository: Option<String>,
    pub commit_sha: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Rotated {
    pub webhook_secret: String,
    pub previous_valid_until: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ScmStatus {
    pub secret_age_days: Option<i64>,
    pub rotation_due: bool,
    pub signature_failures_last_hour: usize,
    pub signature_failure_alert: bool,
}

/// Rejected and duplicate deliveries kept in memory (never their bodies).
const RECENT_REJECTED: usize = 1000;

#[derive(Clone)]
pub struct WebhooksHandle {
    pub(crate) store: Store,
    pub(crate) intake: Arc<Slot<IntakeMsg>>,
    pub(crate) dispatcher: Arc<Slot<DispatcherMsg>>,
    pub(crate) installations: Keyed<InstallationActor>,
    pub(crate) secret: Arc<RwLock<SecretState>>,
    pub(crate) cfg: ScmConfig,
    pub(crate) rejected: Arc<Mutex<VecDeque<DeliveryView>>>,
    pub(crate) failures: Arc<Mutex<VecDeque<i64>>>,
    pub(crate) clock: crate::clock::Clock,
}

/// HMAC-SHA256 check in constant time, with aws-lc's assembly SHA-256 (the portable one was
/// a fifth of the intake's CPU on 23 KB deliveries).
fn hmac_ok(key: &[u8], body: &[u8], sig: &[u8]) -> bool {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, key);
    aws_lc_rs::hmac::verify(&key, body, sig).is_ok()
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
        previous: None,
        previous_valid_until: None,
    };
    let v = serde_json::to_vec(&s).map_err(|e| Error::Internal(e.to_string()))?;
    if generated {
        store.meta_put(UNSHOWN_SECRET_META, b"1")?;
    }
    store.meta_put(intake::SECRET_META, &v)?;
    store.flush_blocking()?;
    Ok(s)
}

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

    fn note_rejected(&self, id: Option<&str>, event: Option<&str>, outcome: &str, reason: &str) {
        let now = self.clock.now_ms();
        if let Ok(mut r) = self.rejected.lock() {
            if r.len() >= RECENT_REJECTED {
                r.pop_front();
            }
            r.push_back(DeliveryView {
                // Header values as sent, clipped: the list is bounded in bytes too.
                delivery_id: crate::configs::clip(id.unwrap_or_default(), 64),
                event: crate::configs::clip(event.unwrap_or_default(), 64),
                action: None,
                received_at: fmt_ms(now),
                status_code: 401,
                outcome: outcome.into(),
                reason: Some(reason.into()),
                installation_id: None,
                repository: None,
                project: None,
                test_run_id: None,
                received_ms: now,
            });
        }
    }

    /// Checks `X-Hub-Signature-256` over the raw body with the current secret (or the previous
    /// one during its grace period), in constant time. A failure is counted and noted.
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        id: Option<&str>,
        event: Option<&str>,
    ) -> Result<()> {
        let sig = header
            .and_then(|h| h.trim().strip_prefix("sha256="))
            .and_then(|h| hex::decode(h).ok());
        let ok = match (&sig, self.secret.read()) {
            (Some(sig), Ok(s)) => {
                let now = self.clock.now_ms();
                (!s.current.is_empty() && hmac_ok(s.current.as_bytes(), body, sig))
                    || s.previous.as_ref().is_some_and(|p| {
                        s.previous_valid_until.is_some_and(|t| now < t)
                            && hmac_ok(p.as_bytes(), body, sig)
                    })
            }
            _ => false,
        };
        if ok {
            return Ok(());
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
        self.note_rejected(id, event, "rejected", "invalid_signature");
        Err(Error::Rejected("Invalid signature".into()))
    }

    /// Claims the delivery id and, for a subscribed event, stores the delivery for the
    /// worker; answers once durable (the intake's batch ends with its flush). A repeated id
    /// is 401 `Duplicate delivery`.
    pub async fn accept(
        &self,
        delivery_id: Option<&str>,
        event: Option<&str>,
        body: Bytes,
    ) -> Result<Accepted> {
        // One spelling per UUID (braced, urn: and simple forms parse too).
        let delivery_id = delivery_id
            .and_then(|d| uuid::Uuid::try_parse(d.trim()).ok())
            .map(|u| u.hyphenated().to_string())
            .ok_or_else(|| Error::BadRequest("X-Host-Delivery must be a UUID".into()))?;

        let event = event
            .map(str::trim)
            .filter(|e| !e.is_empty() && e.len() <= 64)
            .ok_or_else(|| Error::BadRequest("X-Host-Event is required".into()))?;
        let subscribed = payload::SUBSCRIBED.contains(&event);
        let (id, ev) = (delivery_id, event.to_string());
        let r = self
            .intake
            .call(|reply| IntakeMsg::Accept {
                delivery_id: id.clone(),
                event: ev.clone(),
                subscribed,
                body: body.clone(),
                reply,
            })
            .await;
        let seq = match r {
            Ok(seq) => seq,
            Err(e @ Error::Rejected(_)) => {
                self.note_rejected(Some(&id), Some(event), "duplicate", "duplicate_delivery");
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        Ok(match seq {
            Some(_) => Accepted {
                status: "queued",
                delivery_id: Some(id),
            },
            None => Accepted {
                status: "ignored",
                delivery_id: None,
            },
        })
    }

    /// Works one queued delivery. Errors of an unavailable actor are retried (the delivery
    /// stays queued); anything else records the delivery as skipped so the queue moves on.
    pub(crate) async fn process(&self, seq: u64) {
        let mut delay = std::time::Duration::from_millis(50);
        let mut attempts = 0u32;
        loop {
            match self.process_once(seq).await {
                Ok(()) => return,
                Err(Error::Unavailable { .. }) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                Err(e) if attempts < 5 => {
                    attempts += 1;
                    tracing::warn!(seq, error = %e, attempts, "a delivery failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                Err(e) => {
                    tracing::error!(seq, error = %e, "a delivery could not be processed");
                    // The outcome is written by the dispatcher, the single writer of outcomes
                    // (only while the delivery is still queued).
                    if let Ok(Some(d)) = self.store.delivery(seq) {
                        let d = Box::new(d);
                        let r = self
                            .dispatcher
                            .call(|reply| DispatcherMsg::Skip {
                                delivery: d.clone(),
                                reason: "processing_failed",
                                reply,
                            })
                            .await;
                        if let Err(e) = r {
                            // Left queued on disk: the next start works it.
                            tracing::error!(seq, error = %e, "could not record the failure");
                        }
                    }
                    return;
                }
            }
        }
    }

    async fn process_once(&self, seq: u64) -> Result<()> {
        let Some(mut d) = self.store.delivery(seq)? else {
            return Ok(());
        };
        if d.outcome != DeliveryOutcome::Queued {
            return Ok(());
        }
        let body = self.store.payload(&d)?.unwrap_or_default();
        let parsed: std::result::Result<Payload, _> = serde_json::from_slice(&body);
        let payload = match parsed {
            Ok(p) => p,
            Err(_) => {
                let boxed = Box::new(d);
                return self
                    .dispatcher
                    .call(|reply| DispatcherMsg::Skip {
                        delivery: boxed.clone(),
                        reason: "invalid_payload",
                        reply,
                    })
                    .await;
            }
        };
        d.action = payload.action.clone();
        d.repository = payload.repo_name().map(str::to_string);
        let key = match payload.installation_id() {
            Some(id) => id,
            None => match payload.repo_name() {
                Some(n) => self.store.repo_hold(n)?.map_or(0, |h| h.installation_id),
                None => 0,
            },
        };
        d.installation_id = (key != 0).then_some(key);
        let work = Arc::new(Work {
            delivery: d,
            payload,
        });
        self.installations
            .call(key, |reply| InstallationMsg::Deliver {
                work: work.clone(),
                reply,
            })
            .await
    }

    fn view(&self, d: &Delivery) -> Result<DeliveryView> {
        let project = match d.project_id {
            Some(p) => self.store.project(p)?.map(|p| p.slug.clone()),
            None => None,
        };
        Ok(DeliveryView {
            delivery_id: d.delivery_id.clone(),
            event: d.event.clone(),
            action: d.action.clone(),
            received_at: fmt_ms(d.received_at),
            status_code: d.status_code,
            outcome: d.outcome.to_string(),
            reason: d.reason.clone(),
            installation_id: d.installation_id,
            repository: d.repository.clone(),
            project,
            test_run_id: d.test_run_id,
            received_ms: d.received_at,
        })
    }

    /// The delivery log, newest first: every accepted delivery, or those resolved to
    /// `project`; the global one also lists recent rejected and duplicate deliveries.
    pub fn deliveries(
        &self,
        project: Option<u64>,
        f: &DeliveryFilter,
        page: PageReq,
    ) -> Result<Page<DeliveryView>> {
        let records = match project {
            Some(p) => self.store.project_deliveries(p)?,
            None => self.store.deliveries()?,
        };
        let keep = |outcome: &str, reason: Option<&str>| {
            f.outcome.as_deref().is_none_or(|o| o == outcome)
                && f.reason.as_deref().is_none_or(|r| Some(r) == reason)
        };
        // Views (which look up the project) are built for the page only.
        enum Entry<'a> {
            Stored(&'a Delivery),
            Rejected(&'a DeliveryView),
        }
        let mut all: Vec<(i64, Entry)> = records
            .iter()
            .filter(|d| keep(d.outcome.as_str(), d.reason.as_deref()))
            .map(|d| (d.received_at, Entry::Stored(d)))
            .collect();
        let rejected = match project {
            None => self.rejected.lock().ok(),
            Some(_) => None,
        };
        if let Some(r) = &rejected {
            all.extend(
                r.iter()
                    .filter(|v| keep(&v.outcome, v.reason.as_deref()))
                    .map(|v| (v.received_ms, Entry::Rejected(v))),
            );
            all.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
        }
        let p = page.slice(all);
        let items = p
            .items
            .into_iter()
            .map(|(_, e)| match e {
                Entry::Stored(d) => self.view(d),
                Entry::Rejected(v) => Ok(v.clone()),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Page {
            items,
            total: p.total,
            page: p.page,
            page_size: p.page_size,
            has_more: p.has_more,
        })
    }

    pub fn delivery(&self, project: Option<u64>, delivery_id: &str) -> Result<DeliveryDetail> {
        let d = self
            .store
            .delivery_by_id(
                &uuid::Uuid::try_parse(delivery_id)
                    .map(|u| u.hyphenated().to_string())
                    .unwrap_or_default(),
            )?
            .filter(|d| project.is_none() || d.project_id == project)
            .ok_or_else(|| Error::not_found("Delivery"))?;
        let payload = match self.store.payload(&d)? {
            None => None,
            Some(b) => Some(match serde_json::from_slice::<&RawValue>(&b) {
                Ok(r) => r.to_owned(),
                Err(_) => {
                    let s = serde_json::to_string(&String::from_utf8_lossy(&b))
                        .map_err(|e| Error::Internal(e.to_string()))?;
                    RawValue::from_string(s).map_err(|e| Error::Internal(e.to_string()))?
                }
            }),
        };
        Ok(DeliveryDetail {
            delivery: self.view(&d)?,
            payload,
        })
    }

    pub fn installations(&self) -> Result<Vec<InstallationView>> {
        Ok(self
            .store
            .installations()?
            .iter()
            .map(InstallationView::from)
            .collect())
    }

    fn repo_view(&self, r: &RepoLink) -> Result<RepoView> {
        let hold = self.store.repo_hold(&r.full_name)?;
        let state = match &hold {
            None => "pending",
            Some(h) if h.current => "connected",
            Some(_) => "disconnected",
        };
        Ok(RepoView {
            id: r.id,
            full_name: r.full_name.clone(),
            state,
            installation_id: hold.map(|h| h.installation_id),
            branch_patterns: r.branch_patterns.clone(),
            include_drafts: r.include_drafts,
            created_at: fmt_ms(r.created_at),
            updated_at: fmt_ms(r.updated_at),
        })
    }

    pub async fn create_repo(
        &self,
        project_id: u64,
        full_name: String,
        branch_patterns: Option<Vec<String>>,
        include_drafts: Option<bool>,
    ) -> Result<RepoView> {
        let patterns = branch_patterns
            .unwrap_or_else(|| vec!["main".into(), "master".into(), "release/*".into()]);
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::CreateRepo {
                project_id,
                full_name: full_name.clone(),
                branch_patterns: patterns.clone(),
                include_drafts: include_drafts.unwrap_or(false),
                reply,
            })
            .await?;
        self.store.durable().await?;
        self.repo_view(&r)
    }

    pub fn repos(&self, project_id: u64, page: PageReq) -> Result<Page<RepoView>> {
        let all = self
            .store
            .project_repos(project_id)?
            .iter()
            .map(|r| self.repo_view(r))
            .collect::<Result<Vec<_>>>()?;
        Ok(page.slice(all))
    }

    pub fn repo(&self, project_id: u64, id: u64) -> Result<RepoView> {
        let r = self
            .store
            .repo(project_id, id)?
            .ok_or_else(|| Error::not_found("Repository"))?;
        self.repo_view(&r)
    }

    pub async fn update_repo(
        &self,
        project_id: u64,
        id: u64,
        patch: RepoPatch,
    ) -> Result<RepoView> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::UpdateRepo {
                project_id,
                id,
                patch: patch.clone(),
                reply,
            })
            .await?;
        self.store.durable().await?;
        self.repo_view(&r)
    }

    pub async fn delete_repo(&self, project_id: u64, id: u64) -> Result<()> {
        self.dispatcher
            .call(|reply| DispatcherMsg::DeleteRepo {
                project_id,
                id,
                reply,
            })
            .await?;
        Ok(self.store.durable().await?)
    }

    pub fn runs(&self, project_id: u64, f: &RunFilter, page: PageReq) -> Result<Page<TestRunView>> {
        let all: Vec<TestRunView> = self
            .store
            .project_runs(project_id)?
            .iter()
            .filter(|r| f.status.as_ref().is_none_or(|s| r.status.as_str() == s))
            .filter(|r| {
                f.repository
                    .as_ref()
                    .is_none_or(|x| r.repository.eq_ignore_ascii_case(x))
            })
            .filter(|r| f.commit_sha.as_ref().is_none_or(|x| &r.commit_sha == x))
            .map(TestRunView::from)
            .collect();
        Ok(page.slice(all))
    }

    pub fn run(&self, project_id: u64, id: u64) -> Result<TestRunView> {
        self.store
            .run(project_id, id)?
            .map(|r| TestRunView::from(&r))
            .ok_or_else(|| Error::not_found("Test run"))
    }

    pub async fn claim(&self, project_id: u64) -> Result<Option<TestRunView>> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::Claim { project_id, reply })
            .await?;
        self.store.durable().await?;
        Ok(r.as_ref().map(TestRunView::from))
    }

    pub async fn heartbeat(&self, project_id: u64, id: u64) -> Result<TestRunView> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::Heartbeat {
                project_id,
                id,
                reply,
            })
            .await?;
        self.store.durable().await?;
        Ok(TestRunView::from(&r))
    }

    pub async fn complete(
        &self,
        project_id: u64,
        id: u64,
        status: String,
        summary: Option<String>,
    ) -> Result<TestRunView> {
        let r = self
            .dispatcher
            .call(|reply| DispatcherMsg::Complete {
                project_id,
                id,
                status: status.clone(),
                summary: summary.clone(),
                reply,
            })
            .await?;
        self.store.durable().await?;
        Ok(TestRunView::from(&r))
    }

    /// A new secret; the previous keeps verifying for `rotation_grace_seconds`.
    pub async fn rotate(&self) -> Result<Rotated> {
        let fresh = format!(
            "whsec_{}",
            hex::encode(
                crate::secrets::random_bytes(32).map_err(|e| Error::Internal(e.to_string()))?
            )
        );
        let now = self.clock.now_ms();
        let old = self.secret.read().map(|s| s.clone()).unwrap_or_default();
        let next = SecretState {
            current: fresh.clone(),
            created_at: now,
            previous: (!old.current.is_empty()).then(|| old.current.clone()),
            previous_valid_until: (!old.current.is_empty())
                .then_some(now + self.cfg.rotation_grace_seconds * 1000),
        };
        let boxed = Box::new(next.clone());
        self.intake
            .call(|reply| IntakeMsg::Rotate {
                state: boxed.clone(),
                reply,
            })
            .await?;
        self.store.durable().await?;
        if let Ok(mut s) = self.secret.write() {
            *s = next.clone();
        }
        Ok(Rotated {
            webhook_secret: fresh,
            previous_valid_until: next.previous_valid_until.map(fmt_ms),
        })
    }

    pub fn status(&self) -> ScmStatus {
        let now = self.clock.now_ms();
        let s = self.secret.read().map(|s| s.clone()).unwrap_or_default();
        let age = (!s.current.is_empty()).then(|| (now - s.created_at).max(0) / 86_400_000);
        let failures = self
            .failures
            .lock()
            .map(|f| f.iter().filter(|t| **t >= now - 3_600_000).count())
            .unwrap_or(0);
        ScmStatus {
            secret_age_days: age,
            rotation_due: age.is_some_and(|a| a >= self.cfg.rotation_days),
            signature_failures_last_hour: failures,
            signature_failure_alert: failures
                >= self.cfg.signature_failure_alert_threshold as usize,
        }
    }

    /// Makes the intake's next batch write this much slower (deadline tests only).
    #[doc(hidden)]
    pub fn inject_write_stall(&self, d: std::time::Duration) {
        self.intake.cast(IntakeMsg::StallNextWrite(d));
    }

    /// Holds the intake's next batch write until the returned notify is notified (deadline
    /// tests only).
    #[doc(hidden)]
    pub fn inject_write_hold(&self) -> Arc<tokio::sync::Notify> {
        let n = Arc::new(tokio::sync::Notify::new());
        self.intake.cast(IntakeMsg::HoldNextWrite(n.clone()));
        n
    }

    /// Calls waiting on the intake now, queued or being answered (deadline tests only).
    #[doc(hidden)]
    pub fn intake_waiting(&self) -> usize {
        self.intake.waiting()
    }

    /// Makes an installation's actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    pub async fn inject_panic(&self, installation_id: u64) -> Result<()> {
        let a = self.installations.actor(installation_id).await?;
        a.cast(crate::mailbox::Envelope::cast(InstallationMsg::Panic))
            .map_err(|_| Error::Unavailable {
                retry_after_secs: 1,
            })
    }

    /// Drops log entries past retention (the housekeeper calls this); ids leave the dedup
    /// window by their receipt time alone.
    pub async fn expire(&self) -> Result<()> {
        let before = self.clock.now_ms() - self.cfg.delivery_retention_days * 86_400_000;
        self.intake
            .call(|reply| IntakeMsg::Expire { before, reply })
            .await
    }
}
