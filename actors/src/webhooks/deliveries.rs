//! Deliveries: accepting one (verified, then claimed and stored by the intake), working it
//! (the worker routes it to its installation and the dispatcher), and the delivery log.

use super::WebhooksHandle;
use super::dispatcher::DispatcherMsg;
use super::installation::InstallationMsg;
use super::intake::IntakeMsg;
use super::payload;
use super::payload::Payload;
use super::views::Accepted;
use super::views::DeliveryDetail;
use super::views::DeliveryFilter;
use super::views::DeliveryView;
use super::views::InstallationView;
use super::views::LogOutcome;
use super::work::limits::{BATCH, BATCH_BYTES};
use super::work::{Loaded, LoadedBatch, ReadAhead, Work, ends_batch};
use crate::clock::fmt_ms;
use crate::error::Error;
use crate::error::Result;
use crate::views::Page;
use crate::views::PageReq;
use bytes::Bytes;
use fleetops_storage::Delivery;
use fleetops_storage::DeliveryOutcome;
use serde_json::value::RawValue;
use std::sync::Arc;

impl WebhooksHandle {
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
            .filter(|e| !e.is_empty())
            .ok_or_else(|| Error::BadRequest("X-Host-Event is required".into()))?;
        let subscribed = payload::SUBSCRIBED.contains(&event);
        // A name past 64 characters is no event the service subscribes to: ignored like any
        // other, and logged cut short as a rejected delivery's is (a log entry stays small).
        let (id, ev) = (delivery_id, crate::text::clip(event, 64));
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
                self.note_rejected(
                    Some(&id),
                    Some(event),
                    LogOutcome::Duplicate,
                    "duplicate_delivery",
                );
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
    /// stays queued), and so is a write the store refused because another writer changed
    /// what it read (it is read and decided again; each such loss is another's progress);
    /// anything else records the delivery as skipped so the queue moves on.
    pub(crate) async fn process(&self, seq: u64) {
        let mut delay = std::time::Duration::from_millis(50);
        let mut attempts = 0u32;
        let mut raced = 0u32;
        loop {
            match self.process_once(seq).await {
                Ok(()) => return,
                Err(Error::Unavailable { .. }) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
                // The worker's lease moved to another node (this one stalled past it): the
                // delivery is that node's to work now.
                Err(Error::Conflict(w)) if w == "lease" => return,
                Err(Error::Conflict(_)) if raced < 50 => {
                    raced += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(5 * u64::from(raced)))
                        .await;
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
                                fence: self.worker_fence(),
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
        match self.load(seq)? {
            Loaded::Done => Ok(()),
            Loaded::Invalid(delivery) => {
                self.dispatcher
                    .call(|reply| DispatcherMsg::Skip {
                        delivery: delivery.clone(),
                        reason: "invalid_payload",
                        fence: self.worker_fence(),
                        reply,
                    })
                    .await
            }
            Loaded::Work(key, work) => {
                self.installations
                    .call(key, |reply| InstallationMsg::Deliver {
                        work: work.clone(),
                        reply,
                    })
                    .await
            }
        }
    }

    /// Reads a queued delivery and its payload, parses it, and finds its installation.
    fn load(&self, seq: u64) -> Result<Loaded> {
        let Some(mut d) = self.store.delivery(seq)? else {
            return Ok(Loaded::Done);
        };
        if d.outcome != DeliveryOutcome::Queued {
            return Ok(Loaded::Done);
        }
        let body = self.store.payload(&d)?.unwrap_or_default();
        let Ok(payload) = serde_json::from_slice::<Payload>(&body) else {
            return Ok(Loaded::Invalid(Box::new(d)));
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
        Ok(Loaded::Work(
            key,
            Arc::new(Work {
                delivery: d,
                payload,
                fence: self.worker_fence(),
            }),
        ))
    }

    /// Reads and parses up to `BATCH` deliveries from the front of `seqs` on a blocking
    /// thread, stopping after one that ends a batch and at `BATCH_BYTES` of payload; with
    /// whether the batch ended cleanly (nothing in it changes how a later delivery is read).
    /// `None` when the reading thread panicked.
    async fn load_batch(&self, seqs: &[u64]) -> LoadedBatch {
        let (this, wanted) = (
            self.clone(),
            seqs.iter().take(BATCH).copied().collect::<Vec<_>>(),
        );
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::with_capacity(wanted.len());
            let mut bytes = 0u64;
            for seq in wanted {
                // A batch holds its parsed payloads until it is worked: bounded in bytes as
                // sent, not only in number (deliveries may be up to the body limit each).
                if bytes >= BATCH_BYTES {
                    break;
                }
                let l = this.load(seq);
                if let Ok(Loaded::Work(_, w)) = &l {
                    bytes = bytes.saturating_add(w.delivery.payload_len);
                }
                // Only a delivery read whole and not changing any installation lets the
                // batch go on: after anything else, later deliveries are read again once it
                // is worked.
                let ends = match &l {
                    Ok(Loaded::Work(_, w)) => ends_batch(&w.delivery.event),
                    Ok(Loaded::Done) => false,
                    Ok(Loaded::Invalid(_)) | Err(_) => true,
                };
                out.push((seq, l));
                if ends {
                    return (out, false);
                }
            }
            (out, true)
        })
        .await
        .ok()
    }

    /// Works queued deliveries from the front of `seqs` in arrival order, as one batch:
    /// read and parsed on a blocking thread, then each run of consecutive deliveries of one
    /// installation sent to it as one message. Returns how many it took. A lifecycle or
    /// repository change ends the batch, because which installation a later delivery goes to
    /// may depend on it. A delivery the batch could not work is worked again on its own
    /// (`process`, with its retries).
    ///
    /// While a batch that ended cleanly is worked, the next one (from the rest of `seqs`) is
    /// read ahead into `ahead`, so reading and parsing overlap the dispatcher's writes: what a
    /// read finds (the delivery still queued, its payload, the installation holding its
    /// repository) changes only by working that delivery or by an installation or repository
    /// event, which ends a batch and is never read past. At most two batches are in memory.
    pub(crate) async fn process_batch(&self, seqs: &[u64], ahead: &mut Option<ReadAhead>) -> usize {
        let first = seqs.first().copied();
        let loaded = match ahead.take() {
            Some(r) if Some(r.first) == first => r.batch.await.ok().flatten(),
            other => {
                if let Some(r) = other {
                    r.discard().await;
                }
                self.load_batch(seqs).await
            }
        };
        let Some((loaded, clean)) = loaded else {
            // The reading thread panicked: the first is worked on its own, and the rest
            // stay for the next batch.
            if let Some(seq) = first {
                self.process(seq).await;
            }
            return 1;
        };
        let taken = loaded.len();
        if clean && let Some(rest) = seqs.get(taken..).filter(|r| !r.is_empty()) {
            let (this, rest) = (self.clone(), rest.to_vec());
            *ahead = Some(ReadAhead {
                first: rest[0],
                batch: tokio::spawn(async move { this.load_batch(&rest).await }),
            });
        }
        let mut run: Vec<Arc<Work>> = Vec::new();
        let mut run_key = 0;
        for (seq, l) in loaded {
            match l {
                Ok(Loaded::Work(key, work)) => {
                    if key != run_key && !run.is_empty() {
                        self.deliver_run(run_key, std::mem::take(&mut run)).await;
                    }
                    run_key = key;
                    run.push(work);
                }
                Ok(Loaded::Done) => {}
                Ok(Loaded::Invalid(_)) | Err(_) => {
                    self.deliver_run(run_key, std::mem::take(&mut run)).await;
                    self.process(seq).await;
                }
            }
        }
        self.deliver_run(run_key, run).await;
        taken
    }

    async fn deliver_run(&self, key: u64, works: Vec<Arc<Work>>) {
        if works.is_empty() {
            return;
        }
        let r = self
            .installations
            .call(key, |reply| InstallationMsg::DeliverBatch {
                works: works.clone(),
                reply,
            })
            .await;
        let results = r.unwrap_or_default();
        for (i, w) in works.iter().enumerate() {
            if !matches!(results.get(i), Some(Ok(()))) {
                self.process(w.delivery.seq).await;
            }
        }
    }

    fn view(&self, d: &Delivery) -> Result<DeliveryView> {
        self.view_with(d, &mut std::collections::HashMap::new())
    }

    /// The view of `d`, its project's slug read once per page (`slugs`).
    fn view_with(
        &self,
        d: &Delivery,
        slugs: &mut std::collections::HashMap<u64, Option<String>>,
    ) -> Result<DeliveryView> {
        let project = match d.project_id {
            Some(p) => match slugs.get(&p) {
                Some(s) => s.clone(),
                None => {
                    let s = self.store.project(p)?.map(|p| p.slug.clone());
                    slugs.insert(p, s.clone());
                    s
                }
            },
            None => None,
        };
        Ok(DeliveryView {
            delivery_id: d.delivery_id.clone(),
            event: d.event.clone(),
            action: d.action.clone(),
            received_at: fmt_ms(d.received_at),
            status_code: d.status_code,
            outcome: LogOutcome::Stored(d.outcome),
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
    pub async fn deliveries(
        &self,
        project: Option<u64>,
        f: &DeliveryFilter,
        page: PageReq,
    ) -> Result<Page<DeliveryView>> {
        let me = self.clone();
        let f = f.clone();
        crate::off_thread(move || me.deliveries_now(project, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn deliveries_now(
        &self,
        project: Option<u64>,
        f: &DeliveryFilter,
        page: PageReq,
    ) -> Result<Page<DeliveryView>> {
        // The stored log pages from its lists; rejected and duplicate deliveries are a
        // bounded recent list in memory (the global log only), merged in by time.
        let rejected: Vec<DeliveryView> = match (project, self.rejected.lock()) {
            (None, Ok(r)) => r
                .iter()
                .filter(|v| {
                    f.outcome.is_none_or(|o| o == v.outcome)
                        && f.reason
                            .as_deref()
                            .is_none_or(|x| Some(x) == v.reason.as_deref())
                })
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        // The stored log is read one window deep, not from its start: at most `r` rejected
        // entries come before any stored one, so the page's stored entries lie between
        // stored index `skip - r` and `skip + take`. The merged order is newest first, a stored
        // entry before a rejected one of the same time.
        let r = rejected.len();
        let (skip, take) = (page.skip(), page.page_size);
        let from = skip.saturating_sub(r);
        let window = if r == 0 { take } else { take.saturating_add(r) };
        let (stored, stored_total) = match f.outcome {
            None => self
                .store
                .deliveries_page(project, None, f.reason.as_deref(), from, window)?,
            Some(LogOutcome::Stored(o)) => {
                self.store
                    .deliveries_page(project, Some(o), f.reason.as_deref(), from, window)?
            }
            Some(_) => (Vec::new(), 0),
        };
        let total = stored_total.saturating_add(r as u64);
        enum Entry {
            Stored(Delivery),
            Rejected(DeliveryView),
        }
        // Where the merged list below starts in the whole one: from its start, or (read from
        // further in) at the window's first stored entry, after every rejected one newer than
        // it; a window past the stored log's end leaves nothing from there on.
        let newest_read = stored.first().map(|d| d.received_at);
        let (start, rejected) = match (from, newest_read) {
            (0, _) => (0, rejected),
            (_, None) => (skip, Vec::new()),
            (_, Some(t)) => {
                let (newer, rest): (Vec<_>, Vec<_>) =
                    rejected.into_iter().partition(|v| v.received_ms > t);
                (from.saturating_add(newer.len()), rest)
            }
        };
        let mut all: Vec<(i64, Entry)> = stored
            .into_iter()
            .map(|d| (d.received_at, Entry::Stored(d)))
            .collect();
        if !rejected.is_empty() {
            all.extend(
                rejected
                    .into_iter()
                    .map(|v| (v.received_ms, Entry::Rejected(v))),
            );
            all.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
        }
        // Views (which look up the project, once per project of the page) are built for
        // the page only.
        let mut slugs = std::collections::HashMap::new();
        let items = all
            .into_iter()
            .skip(skip.saturating_sub(start))
            .take(take)
            .map(|(_, e)| match e {
                Entry::Stored(d) => self.view_with(&d, &mut slugs),
                Entry::Rejected(v) => Ok(v),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(page.of(items, total))
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
        self.store
            .installations()?
            .iter()
            .map(|i| self.installation_view(i))
            .collect()
    }

    fn installation_view(&self, i: &fleetops_storage::Installation) -> Result<InstallationView> {
        let org = match self.store.installation_binding(i.id)?.organization_id {
            Some(o) => self.store.org(o)?.map(|o| o.slug),
            None => None,
        };
        Ok(InstallationView::new(i, org))
    }

    /// Binds installation `id` to the organization `slug` (a rebind moves it: the links of
    /// the organization it leaves turn `disconnected`). An installation not seen yet is
    /// recorded, so its first delivery resolves there.
    pub async fn bind_installation(&self, id: u64, slug: &str) -> Result<InstallationView> {
        if id == 0 {
            return Err(Error::not_found("Installation"));
        }
        crate::rules::slug("organization", slug)?;
        let org = self
            .store
            .org_by_slug(slug)?
            .ok_or_else(|| Error::not_found("Organization"))?;
        let i = self
            .installations
            .call(id, |reply| InstallationMsg::Bind {
                org_id: org.id,
                reply,
            })
            .await?;
        self.store.durable().await?;
        self.installation_view(&i)
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
