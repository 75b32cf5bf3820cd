//! InstallationActor: one per host installation (key 0 takes deliveries that name none and
//! resolve to none). It is the single writer of its installation record and of which
//! repositories it holds: it applies the lifecycle (created, deleted, suspend, unsuspend) and
//! repository sync (added, removed), skips deliveries of a suspended or deleted installation,
//! and hands the rest to the JobDispatcher. Deliveries of one installation are handled in
//! arrival order.

use std::sync::Arc;

use fleetops_storage::{
    Installation, InstallationBinding, RepoHold, Store, webhooks::WebhookBatch,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::dispatcher::DispatcherMsg;
use super::payload::{Payload, names};
use super::work::limits::DISPATCH_BATCH;
use super::work::{Work, ends_batch, skip, still_queued};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::mailbox::{Envelope, Slot};
use fleetops_storage::{DeliveryOutcome, InstallationState};

type Reply<T> = RpcReplyPort<Result<T>>;

pub(crate) enum InstallationMsg {
    Deliver {
        work: Arc<Work>,
        reply: Reply<()>,
    },
    /// Deliveries in arrival order, worked as `Deliver` would work each in turn; the ones
    /// for the dispatcher go to it in batches. One result per delivery.
    DeliverBatch {
        works: Vec<Arc<Work>>,
        reply: Reply<Vec<Result<()>>>,
    },
    /// Binds the installation to an organization (a superuser's decision); makes a record
    /// for an installation not seen yet, so its first delivery resolves there.
    Bind {
        org_id: u64,
        reply: Reply<Installation>,
    },
    /// Fault injection for supervision tests.
    #[cfg(feature = "fault-injection")]
    Panic,
}

#[derive(Default)]
pub(crate) struct InstallationActor;

impl crate::keyed::KeyedChild for InstallationActor {
    type Req = InstallationMsg;
    type Ctx = (Store, Arc<Slot<DispatcherMsg>>);
    const KIND: &'static str = "installation";
}

pub(crate) struct InstallationActorState {
    id: u64,
    store: Store,
    dispatcher: Arc<Slot<DispatcherMsg>>,
}

impl Actor for InstallationActor {
    type Msg = Envelope<InstallationMsg>;
    type State = InstallationActorState;
    type Arguments = ((Store, Arc<Slot<DispatcherMsg>>), u64);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        ((store, dispatcher), id): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(InstallationActorState {
            id,
            store,
            dispatcher,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        match msg {
            InstallationMsg::Deliver { work, reply } => {
                let r = match st.route(&work) {
                    Ok(Route::Done) => Ok(()),
                    Ok(Route::Dispatch) => st.dispatch(work).await,
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            InstallationMsg::DeliverBatch { works, reply } => {
                let r = st.deliver_batch(works).await;
                let _ = reply.send(Ok(r));
            }
            InstallationMsg::Bind { org_id, reply } => {
                let _ = reply.send(st.bind(org_id));
            }
            #[cfg(feature = "fault-injection")]
            InstallationMsg::Panic => panic!("injected fault in InstallationActor {}", st.id),
        }
        Ok(())
    }
}

/// What the installation decided for a delivery.
enum Route {
    /// Worked here (a lifecycle or repository change, or a skip), outcome written.
    Done,
    /// For the dispatcher.
    Dispatch,
}

impl InstallationActorState {
    /// Applies a lifecycle or repository change, or skips the delivery, or passes it on.
    fn route(&self, work: &Work) -> Result<Route> {
        // A call that timed out is retried by the worker while the first is still in this
        // mailbox: only a delivery still queued is worked.
        if !still_queued(&self.store, work.delivery.seq)? {
            return Ok(Route::Done);
        }
        let org = self.first_sight(work)?;
        let p = &work.payload;
        let action = p.action.as_deref().unwrap_or("");
        match work.delivery.event.as_str() {
            "installation" => match action {
                "created" | "deleted" | "suspend" | "unsuspend" => self.lifecycle(work, action),
                _ => skip(
                    &self.store,
                    &work.delivery,
                    "action_ignored",
                    work.fence.as_ref(),
                ),
            }?,
            "installation_repositories" => match action {
                "added" | "removed" => self.sync(work, action == "added"),
                _ => skip(
                    &self.store,
                    &work.delivery,
                    "action_ignored",
                    work.fence.as_ref(),
                ),
            }?,
            _ => {
                if self.id != 0
                    && let Some(i) = self.store.installation(self.id)?
                {
                    let reason = match i.state {
                        InstallationState::Deleted => Some("installation_deleted"),
                        InstallationState::Suspended => Some("installation_suspended"),
                        InstallationState::Active => None,
                    };
                    if let Some(reason) = reason {
                        // Resolved far enough to appear in the project's log.
                        let mut d = work.delivery.clone();
                        d.project_id = self.linked_project(org, work.payload.repo_name())?;
                        skip(&self.store, &d, reason, work.fence.as_ref())?;
                        return Ok(Route::Done);
                    }
                }
                if self.id != 0 && org.is_none() {
                    skip(
                        &self.store,
                        &work.delivery,
                        "installation_unbound",
                        work.fence.as_ref(),
                    )?;
                    return Ok(Route::Done);
                }
                self.hold_if_unheld(work)?;
                return Ok(Route::Dispatch);
            }
        }
        Ok(Route::Done)
    }

    async fn dispatch(&self, work: Arc<Work>) -> Result<()> {
        self.dispatcher
            .call(|reply| DispatcherMsg::Dispatch {
                work: work.clone(),
                reply,
            })
            .await
    }

    /// Works `works` in order. Consecutive deliveries for the dispatcher go to it in
    /// batches, sent before anything this installation works itself, so every delivery sees
    /// what the ones before it did, as when they come one at a time. At the first failure it
    /// stops: what it did not work is left to the worker, which works it again on its own, in
    /// order, so nothing after a failed delivery takes effect before it.
    async fn deliver_batch(&self, works: Vec<Arc<Work>>) -> Vec<Result<()>> {
        let mut out: Vec<Option<Result<()>>> = works.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = Vec::new();
        for (i, w) in works.iter().enumerate() {
            if ends_batch(&w.delivery.event)
                && !self.dispatch_batch(&works, &mut pending, &mut out).await
            {
                return finished(out);
            }
            match self.route(w) {
                Ok(Route::Dispatch) => pending.push(i),
                r => {
                    let failed = r.is_err();
                    if let Some(slot) = out.get_mut(i) {
                        *slot = Some(r.map(|_| ()));
                    }
                    if failed {
                        return finished(out);
                    }
                }
            }
        }
        self.dispatch_batch(&works, &mut pending, &mut out).await;
        finished(out)
    }

    /// Sends the pending deliveries to the dispatcher, a few at a time (each message holds
    /// the dispatcher from its other callers, runners among them); false once one failed.
    async fn dispatch_batch(
        &self,
        works: &[Arc<Work>],
        pending: &mut Vec<usize>,
        out: &mut [Option<Result<()>>],
    ) -> bool {
        for part in std::mem::take(pending).chunks(DISPATCH_BATCH) {
            let batch: Vec<Arc<Work>> =
                part.iter().filter_map(|&i| works.get(i).cloned()).collect();
            let r = self
                .dispatcher
                .call(|reply| DispatcherMsg::DispatchBatch {
                    works: batch.clone(),
                    reply,
                })
                .await;
            let results = match r {
                Ok(v) => v,
                Err(e) => {
                    // The worker works each of these again on its own (they stay queued).
                    tracing::warn!(error = %e, n = part.len(), "a dispatch batch failed");
                    return false;
                }
            };
            let all = results.len() == part.len() && results.iter().all(Result::is_ok);
            for (&i, r) in part.iter().zip(results) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(r);
                }
            }
            if !all {
                return false;
            }
        }
        true
    }

    /// An installation not seen yet: active, holding nothing.
    fn blank(&self, now: i64) -> Installation {
        Installation {
            id: self.id,
            account_login: String::new(),
            account_type: String::new(),
            repository_selection: String::new(),
            state: InstallationState::Active,
            repositories: Vec::new(),
            removed: Vec::new(),
            created_at: now,
            updated_at: now,
        }
    }

    /// The stored installation, or a new one from the payload.
    fn record(&self, p: &Payload) -> Result<Installation> {
        let now = now_ms();
        let mut i = self
            .store
            .installation(self.id)?
            .unwrap_or_else(|| self.blank(now));
        if let Some(r) = &p.installation {
            if let Some(a) = &r.account {
                if let Some(l) = &a.login {
                    i.account_login = l.clone();
                }
                if let Some(k) = &a.kind {
                    i.account_type = k.clone();
                }
            }
            if let Some(sel) = r
                .repository_selection
                .as_ref()
                .or(p.repository_selection.as_ref())
            {
                i.repository_selection = sel.clone();
            }
        }
        i.updated_at = now;
        Ok(i)
    }

    fn lifecycle(&self, work: &Work, action: &str) -> Result<()> {
        if self.id == 0 {
            return skip(
                &self.store,
                &work.delivery,
                "invalid_payload",
                work.fence.as_ref(),
            );
        }
        let mut i = self.record(&work.payload)?;
        let mut b = work.batch();
        match action {
            "created" => {
                i.state = InstallationState::Active;
                let repos = names(&work.payload.repositories);
                for r in &repos {
                    b.put_hold(r, &self.hold(true))?;
                }
                i.removed.retain(|x| !contains(&repos, x));
                i.repositories = repos;
            }
            "deleted" => {
                // Disabled, history kept: its repositories are disconnected.
                i.state = InstallationState::Deleted;
                for r in &i.repositories {
                    b.put_hold(r, &self.hold(false))?;
                }
            }
            "suspend" => i.state = InstallationState::Suspended,
            _ => i.state = InstallationState::Active,
        }
        b.put_installation(&i)?;
        let mut d = work.delivery.clone();
        d.outcome = DeliveryOutcome::Processed;
        d.installation_id = Some(self.id);
        b.finish_delivery(&d)?;
        Ok(b.commit(&self.store)?)
    }

    fn sync(&self, work: &Work, added: bool) -> Result<()> {
        if self.id == 0 {
            return skip(
                &self.store,
                &work.delivery,
                "invalid_payload",
                work.fence.as_ref(),
            );
        }
        let mut i = self.record(&work.payload)?;
        let mut b = work.batch();
        let list = if added {
            names(&work.payload.repositories_added)
        } else {
            names(&work.payload.repositories_removed)
        };
        for r in &list {
            if added {
                if !contains(&i.repositories, r) {
                    i.repositories.push(r.clone());
                }
                i.removed.retain(|x| !x.eq_ignore_ascii_case(r));
            } else {
                i.repositories.retain(|x| !x.eq_ignore_ascii_case(r));
                if !contains(&i.removed, r) {
                    i.removed.push(r.clone());
                }
            }
            b.put_hold(r, &self.hold(added))?;
        }
        b.put_installation(&i)?;
        let mut d = work.delivery.clone();
        d.outcome = DeliveryOutcome::Processed;
        d.installation_id = Some(self.id);
        // A single-repository change names its project in the log when it is linked.
        if let [only] = list.as_slice() {
            d.repository = Some(only.clone());
            let org = self.store.installation_binding(self.id)?.organization_id;
            d.project_id = self.linked_project(org, Some(only))?;
        }
        b.finish_delivery(&d)?;
        Ok(b.commit(&self.store)?)
    }

    /// The organization this installation is bound to. While the service has exactly one
    /// organization, an installation is bound to it when first seen, so a single-tenant
    /// service needs no step; first seen with several, it is recorded unbound, and stays so
    /// (however many organizations there are later) until a superuser binds it, as does one
    /// whose organization was deleted. Seen while there is none, it is not recorded.
    fn first_sight(&self, work: &Work) -> Result<Option<u64>> {
        if self.id == 0 {
            return Ok(None);
        }
        if let Some(b) = self.store.installation_binding_if_seen(self.id)? {
            // Seen before: bound, or left unbound (by several organizations at its first
            // sight, or by its organization's deletion) until a superuser binds it.
            return Ok(b.organization_id);
        }
        let mut b = InstallationBinding::default();
        let org = match self.store.first_org_ids(2)?[..] {
            // No organization yet: not recorded, so the first one made will take it.
            [] => return Ok(None),
            [only] => Some(only),
            _ => None,
        };
        if let Some(org) = org {
            b.bind(org);
        }
        let mut batch = work.batch();
        batch.put_binding(self.id, &b)?;
        batch.commit(&self.store)?;
        Ok(org)
    }

    /// The project that links `name` in `org`, for the delivery log.
    fn linked_project(&self, org: Option<u64>, name: Option<&str>) -> Result<Option<u64>> {
        Ok(match (org, name) {
            (Some(org), Some(name)) => self.store.repo_by_name(org, name)?.map(|l| l.project_id),
            _ => None,
        })
    }

    /// Binds this installation to `org_id`; links of the organization it leaves turn
    /// `disconnected` (the binding remembers it).
    fn bind(&self, org_id: u64) -> Result<Installation> {
        let i = self
            .store
            .installation(self.id)?
            .unwrap_or_else(|| self.blank(now_ms()));
        let mut b = self.store.installation_binding(self.id)?;
        b.bind(org_id);
        let mut batch = WebhookBatch::default();
        batch.put_installation(&i)?;
        batch.put_binding(self.id, &b)?;
        batch.commit(&self.store)?;
        Ok(i)
    }

    /// A repository no installation is known to hold, named by a delivery of this one (the
    /// host sends an installation only what it can see; its `installation` events may have
    /// come before the service did), is held by it from now on: a link of it then shows
    /// `connected`, as the delivery it takes says it is.
    fn hold_if_unheld(&self, work: &Work) -> Result<()> {
        let Some(name) = work.payload.repo_name() else {
            return Ok(());
        };
        if self.id == 0 || self.store.repo_hold(name)?.is_some() {
            return Ok(());
        }
        let mut i = self.record(&work.payload)?;
        if !contains(&i.repositories, name) {
            i.repositories.push(name.to_string());
        }
        let mut b = work.batch();
        b.put_hold(name, &self.hold(true))?;
        b.put_installation(&i)?;
        Ok(b.commit(&self.store)?)
    }

    fn hold(&self, current: bool) -> RepoHold {
        RepoHold {
            installation_id: self.id,
            current,
        }
    }
}

/// One result per delivery; one never worked (after a failure) is an error, so the worker
/// works it again on its own.
fn finished(out: Vec<Option<Result<()>>>) -> Vec<Result<()>> {
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Error::Internal("not worked".into()))))
        .collect()
}

fn contains(list: &[String], name: &str) -> bool {
    list.iter().any(|x| x.eq_ignore_ascii_case(name))
}
