//! WorkerActor: works accepted webhook deliveries one at a time, in arrival order, under the
//! root supervisor. The intake actor hands it the seq of each delivery it stored; the queue
//! outlives the actor, so a restart loses nothing that was sent, and on every (re)start the
//! worker first takes the deliveries the store still holds as queued (a crash's leftovers, or
//! the one it was working when it panicked). Working a delivery twice is harmless: the
//! installation actor and the dispatcher act on a delivery only while it is still queued.

use std::collections::VecDeque;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::Mutex;
use tokio::sync::mpsc::UnboundedReceiver;

use super::ScmHandle;
use crate::mailbox::Envelope;

/// A seq no delivery can have: the worker panics on it (fault injection for tests).
pub(crate) const INJECTED_PANIC: u64 = u64::MAX;

pub(crate) enum WorkerMsg {
    /// Work the next delivery (the actor sends this to itself after each one).
    Next,
}

pub(crate) struct WorkerActor;

#[derive(Clone)]
pub(crate) struct WorkerArgs {
    pub scm: ScmHandle,
    /// The intake's queue of stored delivery seqs; shared so that it outlives a restart.
    pub queue: Arc<Mutex<UnboundedReceiver<u64>>>,
}

pub(crate) struct WorkerState {
    scm: ScmHandle,
    queue: Arc<Mutex<UnboundedReceiver<u64>>>,
    /// Deliveries stored as queued when this incarnation started, worked first.
    backlog: VecDeque<u64>,
}

impl Actor for WorkerActor {
    type Msg = Envelope<WorkerMsg>;
    type State = WorkerState;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WorkerArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let store = args.scm.store.clone();
        let backlog = tokio::task::spawn_blocking(move || store.queued_deliveries()).await??;
        let _ = myself.cast(Envelope::cast(WorkerMsg::Next));
        Ok(WorkerState {
            scm: args.scm,
            queue: args.queue,
            backlog: backlog.into(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(WorkerMsg::Next) = msg.open() else {
            return Ok(());
        };
        let next = match st.backlog.pop_front() {
            Some(seq) => Some(seq),
            None => st.queue.lock().await.recv().await,
        };
        match next {
            Some(INJECTED_PANIC) => panic!("injected fault in the webhook worker"),
            Some(seq) => {
                st.scm.process(seq).await;
                let _ = myself.cast(Envelope::cast(WorkerMsg::Next));
            }
            // The intake is gone for good (shutdown): nothing more will come.
            None => myself.stop(None),
        }
        Ok(())
    }
}
