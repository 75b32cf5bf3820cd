//! RootSupervisor: the top of the tree. It starts its twelve children in order (the
//! directory; the supervisors of projects and sessions; the webhook intake and the job
//! dispatcher; the supervisors of installations, quotas, notifiers, evaluators and rollouts;
//! then the webhook worker and the housekeeper, which drive the others) and restarts any of
//! them that fails, in place, within the `[supervision]` budget: at once the first time, then
//! after a doubling backoff, and past the budget once its window has passed.
//!
//! While a child is down its slot is empty, so calls to it answer 503, and it is named in
//! [`crate::health::Health`] (`/healthz` answers 503 naming it); the rest of the tree keeps
//! serving. A restart that itself fails (its `pre_start` fails, for example on a storage
//! error) is logged and tried again a second later; it never stops the root.
//!
//! Tested with panics injected into its singleton children (directory, intake, dispatcher,
//! worker, housekeeper) and a child's start made to fail (`tests/api/supervision/`).

use crate::health::Health;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use fleetops_storage::Store;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::alerts::evaluator::{EvaluatorMsg, RuleEvaluator};
use crate::alerts::notifier::{Notifier, NotifierMsg};
use crate::config::SupervisionConfig;
use crate::directory::{DirectoryActor, DirectoryMsg};
use crate::housekeeper::{Housekeeper, HousekeeperArgs, HousekeeperMsg};
use crate::keyed::{KeyedArgs, KeyedChild, KeyedMsg, KeyedSupervisor};
use crate::mailbox::Slot;
use crate::pipeline::controller::{RolloutController, RolloutMsg};
use crate::project::{ProjectActor, ProjectMsg};
use crate::quota::{QuotaActor, QuotaMsg};
use crate::session::{SessionActor, SessionMsg};
use crate::supervision::{RestartBudget, Verdict};
use crate::webhooks::dispatcher::{DispatcherMsg, JobDispatcher};
use crate::webhooks::installation::{InstallationActor, InstallationMsg};
use crate::webhooks::intake::{IntakeActor, IntakeMsg};
use crate::webhooks::worker::{WebhookWorker, WorkerArgs, WorkerMsg};

/// The children of the root, each restarted in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Child {
    Directory,
    Projects,
    Sessions,
    Intake,
    Dispatcher,
    Installations,
    Worker,
    Housekeeper,
    Quotas,
    Evaluators,
    Notifiers,
    Rollouts,
}

impl Child {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Child::Directory => "directory",
            Child::Projects => "projects",
            Child::Sessions => "sessions",
            Child::Intake => "webhook-intake",
            Child::Dispatcher => "job-dispatcher",
            Child::Installations => "installations",
            Child::Worker => "webhook-worker",
            Child::Housekeeper => "housekeeper",
            Child::Quotas => "quotas",
            Child::Evaluators => "alert-evaluators",
            Child::Notifiers => "notifiers",
            Child::Rollouts => "rollouts",
        }
    }
}

pub(crate) enum RootMsg {
    Restart(Child),
}

pub(crate) struct RootSupervisor;

pub(crate) struct RootArgs {
    pub store: Store,
    pub cfg: SupervisionConfig,
    pub tiers: Vec<String>,
    pub max_api_keys_per_user: usize,
    pub directory: Arc<Slot<DirectoryMsg>>,
    pub projects: Arc<Slot<KeyedMsg<ProjectMsg>>>,
    pub project_args: KeyedArgs<ProjectActor>,
    pub sessions: Arc<Slot<KeyedMsg<SessionMsg>>>,
    pub session_args: KeyedArgs<SessionActor>,
    pub intake: Arc<Slot<IntakeMsg>>,
    /// Wakes the webhook worker (the intake stores the deliveries it queues).
    pub queue: crate::webhooks::worker::WorkerFeed,
    pub dedup_window_seconds: i64,
    pub dispatcher: Arc<Slot<DispatcherMsg>>,
    pub lease_seconds: i64,
    pub installations: Arc<Slot<KeyedMsg<InstallationMsg>>>,
    pub installation_args: KeyedArgs<InstallationActor>,
    pub worker: Arc<Slot<WorkerMsg>>,
    pub worker_args: WorkerArgs,
    pub housekeeper: Arc<Slot<HousekeeperMsg>>,
    pub housekeeper_args: HousekeeperArgs,
    pub quotas: Arc<Slot<KeyedMsg<QuotaMsg>>>,
    pub quota_args: KeyedArgs<QuotaActor>,
    pub evaluators: Arc<Slot<KeyedMsg<EvaluatorMsg>>>,
    pub evaluator_args: KeyedArgs<RuleEvaluator>,
    pub notifiers: Arc<Slot<KeyedMsg<NotifierMsg>>>,
    pub notifier_args: KeyedArgs<Notifier>,
    pub rollouts: Arc<Slot<KeyedMsg<RolloutMsg>>>,
    pub rollout_args: KeyedArgs<RolloutController>,
    pub restarts: Arc<AtomicU64>,
    pub health: Health,
    pub clock: crate::clock::Clock,
}

pub(crate) struct RootState {
    args: RootArgs,
    children: HashMap<ractor::ActorId, Child>,
    budgets: HashMap<Child, RestartBudget>,
}

async fn spawn_keyed<C: KeyedChild>(
    myself: &ActorRef<RootMsg>,
    slot: &Slot<KeyedMsg<C::Req>>,
    args: KeyedArgs<C>,
) -> Result<ActorCell, ActorProcessingErr> {
    let (a, _) = Actor::spawn_linked(
        None,
        KeyedSupervisor::<C>::default(),
        args,
        myself.get_cell(),
    )
    .await?;
    slot.set(Some(a.clone()));
    Ok(a.get_cell())
}

impl RootState {
    async fn start(
        &mut self,
        myself: &ActorRef<RootMsg>,
        child: Child,
    ) -> Result<(), ActorProcessingErr> {
        #[cfg(feature = "fault-injection")]
        if self.args.health.take_start_failure(child.name()) {
            return Err(format!("injected start failure of {}", child.name()).into());
        }
        let cell: ActorCell = match child {
            Child::Directory => {
                let (a, _) = Actor::spawn_linked(
                    None,
                    DirectoryActor,
                    (
                        self.args.store.clone(),
                        self.args.tiers.clone(),
                        self.args.max_api_keys_per_user,
                    ),
                    myself.get_cell(),
                )
                .await?;
                self.args.directory.set(Some(a.clone()));
                a.get_cell()
            }
            Child::Projects => {
                spawn_keyed(myself, &self.args.projects, self.args.project_args.clone()).await?
            }
            Child::Sessions => {
                spawn_keyed(myself, &self.args.sessions, self.args.session_args.clone()).await?
            }
            Child::Intake => {
                let (a, _) = Actor::spawn_linked(
                    None,
                    IntakeActor,
                    (
                        self.args.store.clone(),
                        self.args.queue.clone(),
                        self.args.dedup_window_seconds,
                        self.args.clock.clone(),
                    ),
                    myself.get_cell(),
                )
                .await?;
                self.args.intake.set(Some(a.clone()));
                a.get_cell()
            }
            Child::Dispatcher => {
                let (a, _) = Actor::spawn_linked(
                    None,
                    JobDispatcher,
                    (
                        self.args.store.clone(),
                        self.args.lease_seconds,
                        self.args.clock.clone(),
                    ),
                    myself.get_cell(),
                )
                .await?;
                self.args.dispatcher.set(Some(a.clone()));
                a.get_cell()
            }
            Child::Installations => {
                spawn_keyed(
                    myself,
                    &self.args.installations,
                    self.args.installation_args.clone(),
                )
                .await?
            }
            Child::Worker => {
                let (a, _) = Actor::spawn_linked(
                    None,
                    WebhookWorker,
                    self.args.worker_args.clone(),
                    myself.get_cell(),
                )
                .await?;
                self.args.worker.set(Some(a.clone()));
                a.get_cell()
            }
            Child::Housekeeper => {
                let (a, _) = Actor::spawn_linked(
                    None,
                    Housekeeper,
                    self.args.housekeeper_args.clone(),
                    myself.get_cell(),
                )
                .await?;
                self.args.housekeeper.set(Some(a.clone()));
                a.get_cell()
            }
            Child::Quotas => {
                spawn_keyed(myself, &self.args.quotas, self.args.quota_args.clone()).await?
            }
            Child::Evaluators => {
                spawn_keyed(
                    myself,
                    &self.args.evaluators,
                    self.args.evaluator_args.clone(),
                )
                .await?
            }
            Child::Notifiers => {
                spawn_keyed(
                    myself,
                    &self.args.notifiers,
                    self.args.notifier_args.clone(),
                )
                .await?
            }
            Child::Rollouts => {
                spawn_keyed(myself, &self.args.rollouts, self.args.rollout_args.clone()).await?
            }
        };
        self.children.insert(cell.get_id(), child);
        self.args.health.set(child.name(), false);
        Ok(())
    }

    /// Starts `child`, or, when that fails, leaves it named as down and tries again later:
    /// a failing restart never takes the root (and so every other child) down.
    async fn restart(&mut self, myself: &ActorRef<RootMsg>, child: Child) {
        if let Err(e) = self.start(myself, child).await {
            self.args.health.set(child.name(), true);
            tracing::error!(child = child.name(), error = %e, "restart failed; retrying in 1 s");
            myself.send_after(std::time::Duration::from_secs(1), move || {
                RootMsg::Restart(child)
            });
        }
    }

    fn clear_slot(&self, child: Child) {
        match child {
            Child::Directory => self.args.directory.set(None),
            Child::Projects => self.args.projects.set(None),
            Child::Sessions => self.args.sessions.set(None),
            Child::Intake => self.args.intake.set(None),
            Child::Dispatcher => self.args.dispatcher.set(None),
            Child::Installations => self.args.installations.set(None),
            Child::Worker => self.args.worker.set(None),
            Child::Housekeeper => self.args.housekeeper.set(None),
            Child::Quotas => self.args.quotas.set(None),
            Child::Evaluators => self.args.evaluators.set(None),
            Child::Notifiers => self.args.notifiers.set(None),
            Child::Rollouts => self.args.rollouts.set(None),
        }
    }
}

impl Actor for RootSupervisor {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut st = RootState {
            args,
            children: HashMap::new(),
            budgets: HashMap::new(),
        };
        for child in [
            Child::Directory,
            Child::Projects,
            Child::Sessions,
            Child::Intake,
            Child::Dispatcher,
            Child::Installations,
            Child::Quotas,
            Child::Notifiers,
            Child::Evaluators,
            Child::Rollouts,
            Child::Worker,
            Child::Housekeeper,
        ] {
            st.start(&myself, child).await?;
        }
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let RootMsg::Restart(child) = msg;
        st.restart(&myself, child).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let SupervisionEvent::ActorFailed(cell, err) = evt else {
            return Ok(());
        };
        let Some(child) = st.children.remove(&cell.get_id()) else {
            return Ok(());
        };
        st.clear_slot(child);
        st.args.health.set(child.name(), true);
        st.args.restarts.fetch_add(1, Ordering::Relaxed);
        let verdict = st
            .budgets
            .entry(child)
            .or_default()
            .on_failure(&st.args.cfg, Instant::now());
        tracing::error!(?child, error = %err, ?verdict, "actor failed");
        let delay = match verdict {
            Verdict::Restart(d) => d,
            Verdict::GiveUpUntil(t) => t.saturating_duration_since(Instant::now()),
        };
        if delay.is_zero() {
            st.restart(&myself, child).await;
        } else {
            myself.send_after(delay, move || RootMsg::Restart(child));
        }
        Ok(())
    }
}
