//! QuotaActor: one per organization, the single place its storage quota is checked. Projects
//! have their own writers, so two uploads to two projects of one organization would each see
//! the other's bytes as not yet there and could together pass the limit. Instead every
//! reservation of storage (a new capsule or configuration) asks this actor for a turn: it
//! counts what the organization holds and has reserved, and, when the new bytes fit, hands
//! the caller a [`Turn`] and waits until the caller has written its record (or failed) before
//! it counts for the next one. The record is the reservation, so nothing is left to release
//! after a crash.

use fleetops_storage::Store;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::mailbox::Envelope;
use crate::rules::configurations;

pub(crate) enum QuotaMsg {
    /// A turn to reserve `add` bytes under `limit`, or 413.
    Admit {
        limit: u64,
        add: u64,
        reply: RpcReplyPort<Result<Turn>>,
    },
}

/// The organization's turn: while it is held, no other reservation of the organization is
/// counted. The caller and its create message share it, so it ends only when the record is
/// written or the message is dropped unapplied, whatever became of the caller.
pub(crate) struct Turn {
    _release: oneshot::Sender<()>,
}

#[derive(Default)]
pub(crate) struct QuotaActor;

impl crate::keyed::KeyedChild for QuotaActor {
    type Req = QuotaMsg;
    type Ctx = Store;
    const KIND: &'static str = "quota";
}

pub(crate) struct QuotaState {
    org_id: u64,
    store: Store,
}

impl QuotaState {
    /// Bytes the organization's capsules and configurations hold or have reserved.
    fn usage(&self) -> Result<u64> {
        let mut total = 0u64;
        for p in self.store.org_projects(self.org_id)? {
            for c in self.store.project_capsules(p.id)?.iter() {
                total = total.saturating_add(c.file_size_bytes);
            }
            for c in self.store.project_configurations(p.id)? {
                total = total.saturating_add(configurations::reserved(&c));
            }
        }
        Ok(total)
    }
}

impl Actor for QuotaActor {
    type Msg = Envelope<QuotaMsg>;
    type State = QuotaState;
    type Arguments = (Store, u64);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (store, org_id): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(QuotaState { org_id, store })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(QuotaMsg::Admit { limit, add, reply }) = msg.open() else {
            return Ok(());
        };
        let used = match st.usage() {
            Ok(u) => u,
            Err(e) => {
                let _ = reply.send(Err(e));
                return Ok(());
            }
        };
        if used.saturating_add(add) > limit {
            let _ = reply.send(Err(Error::TooLarge(format!(
                "Upload would exceed the organization's storage limit ({used} of {limit} bytes used)"
            ))));
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        // A caller that is gone drops the turn with the unsent reply, which ends the wait.
        let _ = reply.send(Ok(Turn { _release: tx }));
        let _ = rx.await;
        Ok(())
    }
}

/// The calling side: one organization's turn to reserve storage.
#[derive(Clone)]
pub(crate) struct QuotaHandle {
    pub(crate) actors: Keyed<QuotaActor>,
}

impl QuotaHandle {
    /// A turn to add `add` bytes to the organization's usage under `limit` (413 when they do
    /// not fit). Hold it until the record that reserves the bytes is written.
    pub(crate) async fn admit(&self, org_id: u64, limit: u64, add: u64) -> Result<Turn> {
        self.actors
            .call(org_id, |reply| QuotaMsg::Admit { limit, add, reply })
            .await
    }
}
