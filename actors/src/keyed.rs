//! The supervisor of per-entity actors (one per project, active session, host installation,
//! organization's quota, project's rule evaluator and notifier, and phased rollout): it starts
//! the entity's actor on first use, restarts it from storage when it fails, and keeps the typed
//! map from entity id to the live actor. Typed maps, not global names, so two servers in one
//! process never collide.
//!
//! Restarts follow the `[supervision]` budget (`supervision`): at once the first time, then
//! after a doubling backoff; past `max_restarts` within `restart_window_seconds` the entity is
//! left down until the window has passed, its calls answer 503 with `Retry-After`, and
//! `/healthz` names it as contained while every other entity goes on. A normal stop (a
//! completed or idle session, a controller with nothing to do) only leaves the map.
//!
//! [`Keyed`] is the calling side: it finds or starts the actor, bounds its mailbox
//! (`mailbox_limit` calls per entity, kept across restarts), and sends a request lost in a
//! crash before the actor took it on once more to the replacement; the request the actor died
//! handling is not sent again (see `mailbox`).
//!
//! Tested through the real server with panics injected into project, session, installation,
//! evaluator, notifier and rollout actors, some past their budget (`tests/api/supervision/`,
//! `tests/api/rollouts/`).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::Semaphore;

use crate::config::SupervisionConfig;
use crate::error::{Error, Result};
use crate::mailbox::{self, Envelope, Slot};
use crate::supervision::{RestartBudget, Verdict};

/// An actor that serves one entity, rebuilt from storage in `pre_start`.
pub(crate) trait KeyedChild:
    Actor<Arguments = (<Self as KeyedChild>::Ctx, u64), Msg = Envelope<<Self as KeyedChild>::Req>>
    + Default
{
    /// The requests it serves (its message enum).
    type Req: Send + 'static;
    /// What every instance needs besides its key (store, configuration).
    type Ctx: Clone + Send + Sync + 'static;
    /// For logs: "project", "session".
    const KIND: &'static str;
}

pub(crate) type Registry<M> = Arc<DashMap<u64, ActorRef<Envelope<M>>>>;

pub(crate) enum KeyedMsg<M> {
    /// The live actor of an entity, started if needed.
    Get(u64, RpcReplyPort<Result<ActorRef<Envelope<M>>>>),
    /// A delayed restart is due.
    Respawn(u64),
}

pub(crate) struct KeyedArgs<C: KeyedChild> {
    pub ctx: C::Ctx,
    pub cfg: SupervisionConfig,
    pub registry: Registry<C::Req>,
    pub restarts: Arc<AtomicU64>,
    /// Where an entity past its restart budget is named, for `/healthz`.
    pub health: crate::health::Health,
}

impl<C: KeyedChild> Clone for KeyedArgs<C> {
    fn clone(&self) -> Self {
        Self {
            ctx: self.ctx.clone(),
            cfg: self.cfg.clone(),
            registry: self.registry.clone(),
            restarts: self.restarts.clone(),
            health: self.health.clone(),
        }
    }
}

pub(crate) struct KeyedSupervisor<C>(PhantomData<fn() -> C>);

impl<C> Default for KeyedSupervisor<C> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub(crate) struct KeyedState<C: KeyedChild> {
    args: KeyedArgs<C>,
    /// Which entity each live child serves (the key of a supervision event).
    children: HashMap<ActorId, u64>,
    budgets: HashMap<u64, RestartBudget>,
    /// Entities whose actor is down until the instant (backoff or spent budget).
    down_until: HashMap<u64, Instant>,
}

impl<C: KeyedChild> KeyedState<C> {
    async fn spawn(
        &mut self,
        myself: &ActorRef<Envelope<KeyedMsg<C::Req>>>,
        key: u64,
    ) -> Result<ActorRef<Envelope<C::Req>>> {
        if let Some(a) = self.args.registry.get(&key) {
            return Ok(a.clone());
        }
        if let Some(until) = self.down_until.get(&key) {
            let now = Instant::now();
            if *until > now {
                return Err(Error::Unavailable {
                    retry_after_secs: until.duration_since(now).as_secs().max(1),
                });
            }
            self.down_until.remove(&key);
        }
        let (actor, _) = Actor::spawn_linked(
            None,
            C::default(),
            (self.args.ctx.clone(), key),
            myself.get_cell(),
        )
        .await
        .map_err(|e| Error::Internal(format!("{} actor {key} failed to start: {e}", C::KIND)))?;
        self.children.insert(actor.get_id(), key);
        self.args.health.release(C::KIND, key);
        self.args.registry.insert(key, actor.clone());
        Ok(actor)
    }
}

impl<C: KeyedChild> Actor for KeyedSupervisor<C> {
    type Msg = Envelope<KeyedMsg<C::Req>>;
    type State = KeyedState<C>;
    type Arguments = KeyedArgs<C>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Children of an earlier incarnation are gone with it; start from an empty map.
        for a in args.registry.iter() {
            a.value().stop(None);
        }
        args.registry.clear();
        // Budgets start afresh with this incarnation, and so does what /healthz names.
        args.health.release_kind(C::KIND);
        Ok(KeyedState {
            args,
            children: HashMap::new(),
            budgets: HashMap::new(),
            down_until: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            return Ok(());
        };
        match msg {
            KeyedMsg::Get(key, reply) => {
                let r = st.spawn(&myself, key).await;
                let _ = reply.send(r);
            }
            KeyedMsg::Respawn(key) => {
                st.down_until.remove(&key);
                if !st.args.registry.contains_key(&key)
                    && let Err(e) = st.spawn(&myself, key).await
                {
                    tracing::warn!(kind = C::KIND, key, error = %e, "restart failed");
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) => {
                let Some(key) = st.children.remove(&cell.get_id()) else {
                    return Ok(());
                };
                st.args
                    .registry
                    .remove_if(&key, |_, a| a.get_id() == cell.get_id());
                st.args.restarts.fetch_add(1, Ordering::Relaxed);
                if st.args.registry.contains_key(&key) {
                    // A caller already had it started again on demand.
                    tracing::error!(kind = C::KIND, key, error = %err, "actor failed; already replaced");
                    return Ok(());
                }
                let verdict = st
                    .budgets
                    .entry(key)
                    .or_default()
                    .on_failure(&st.args.cfg, Instant::now());
                tracing::error!(kind = C::KIND, key, error = %err, ?verdict, "actor failed");
                match verdict {
                    Verdict::Restart(d) if d.is_zero() => {
                        if let Err(e) = st.spawn(&myself, key).await {
                            tracing::warn!(kind = C::KIND, key, error = %e, "restart failed");
                        }
                    }
                    Verdict::Restart(d) => {
                        st.down_until.insert(key, Instant::now() + d);
                        myself.send_after(d, move || Envelope::cast(KeyedMsg::Respawn(key)));
                    }
                    Verdict::GiveUpUntil(t) => {
                        st.down_until.insert(key, t);
                        st.args.health.contain(C::KIND, key, t);
                    }
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                // A normal stop (a completed session): forget it.
                if let Some(key) = st.children.remove(&cell.get_id()) {
                    st.args
                        .registry
                        .remove_if(&key, |_, a| a.get_id() == cell.get_id());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The calling side of a keyed supervisor.
pub(crate) struct Keyed<C: KeyedChild> {
    pub sup: Arc<Slot<KeyedMsg<C::Req>>>,
    pub registry: Registry<C::Req>,
    /// One mailbox bound per entity, kept across restarts of its actor.
    gates: Arc<DashMap<u64, Arc<Semaphore>>>,
    cfg: SupervisionConfig,
}

impl<C: KeyedChild> Clone for Keyed<C> {
    fn clone(&self) -> Self {
        Self {
            sup: self.sup.clone(),
            registry: self.registry.clone(),
            gates: self.gates.clone(),
            cfg: self.cfg.clone(),
        }
    }
}

impl<C: KeyedChild> Keyed<C> {
    pub(crate) fn new(
        sup: Arc<Slot<KeyedMsg<C::Req>>>,
        registry: Registry<C::Req>,
        cfg: SupervisionConfig,
    ) -> Self {
        Self {
            sup,
            registry,
            gates: Arc::new(DashMap::new()),
            cfg,
        }
    }

    /// The live actor, started if needed.
    pub(crate) async fn actor(&self, key: u64) -> Result<ActorRef<Envelope<C::Req>>> {
        if let Some(a) = self.registry.get(&key) {
            return Ok(a.clone());
        }
        self.sup.call(|r| KeyedMsg::Get(key, r)).await
    }

    /// How many of these actors run now.
    pub(crate) fn running_count(&self) -> usize {
        self.registry.len()
    }

    /// The live actor if one runs now (never starts one).
    pub(crate) fn running(&self, key: u64) -> Option<ActorRef<Envelope<C::Req>>> {
        self.registry.get(&key).map(|a| a.clone())
    }

    /// One request to the entity's actor. A request lost in a crash before the actor took it
    /// on (queued behind the panic, or sent to an actor that had just died) is sent once more
    /// to the replacement.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        key: u64,
        build: impl Fn(RpcReplyPort<Result<T>>) -> C::Req,
    ) -> Result<T> {
        let gate = self
            .gates
            .entry(key)
            .or_insert_with(|| Arc::new(Semaphore::new(self.cfg.mailbox_limit.max(1))))
            .clone();
        let timeout = Duration::from_millis(self.cfg.call_timeout_ms);
        let actor = self.actor(key).await?;
        match mailbox::deliver(&actor, &gate, timeout, &build).await {
            mailbox::Outcome::Replied(r) => r,
            mailbox::Outcome::Lost => {
                self.registry
                    .remove_if(&key, |_, a| a.get_id() == actor.get_id());
                let next = self.actor(key).await?;
                match mailbox::deliver(&next, &gate, timeout, &build).await {
                    mailbox::Outcome::Replied(r) => r,
                    mailbox::Outcome::Lost => Err(mailbox::lost_twice()),
                }
            }
        }
    }

    /// Calls in the entity's actor's mailbox now (including ones whose callers gave up).
    pub(crate) fn waiting(&self, key: u64) -> usize {
        self.gates.get(&key).map_or(0, |g| {
            self.cfg
                .mailbox_limit
                .max(1)
                .saturating_sub(g.available_permits())
        })
    }

    /// Calls in every entity's actor's mailbox, and in the fullest one (for `/metrics`: one
    /// pass over the mailbox bounds of the entities that have them).
    pub(crate) fn depths(&self) -> (usize, usize) {
        let limit = self.cfg.mailbox_limit.max(1);
        self.gates.iter().fold((0, 0), |(sum, max), g| {
            let w = limit.saturating_sub(g.available_permits());
            (sum + w, max.max(w))
        })
    }

    /// Drops the mailbox bound of an entity that is gone.
    pub(crate) fn forget(&self, key: u64) {
        self.gates.remove(&key);
    }
}
