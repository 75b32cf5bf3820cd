//! IntakeActor: the single writer of delivery ids. It claims an id and stores the delivery
//! (and, for subscribed events, its payload and a place in the worker's queue) in one atomic
//! write, so concurrent deliveries of one id are accepted exactly once; the caller waits for
//! the group commit before answering 202. It also owns the webhook secret's rotation.

use bytes::Bytes;
use fleetops_storage::{Delivery, Store, accounts::Seq};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::SecretState;
use crate::clock::now_ms;
use crate::error::{Error, Result};

type Reply<T> = RpcReplyPort<Result<T>>;

/// The meta key of the webhook secret state.
pub(crate) const SECRET_META: &str = "scm_webhook_secret";

pub(crate) enum IntakeMsg {
    /// Replies with the delivery's seq when it was queued, `None` when it was ignored (an
    /// unsubscribed event), `Rejected` when its id was already claimed.
    Accept {
        delivery_id: String,
        event: String,
        subscribed: bool,
        body: Bytes,
        reply: Reply<Option<u64>>,
    },
    /// Stores a new secret state (rotation).
    Rotate {
        state: Box<SecretState>,
        reply: Reply<()>,
    },
}

pub(crate) struct IntakeActor;

/// The store, and the worker's queue: the actor itself queues what it stored, so a caller
/// that goes away (a host that hangs up before its 202) cannot leave a delivery stored but
/// never worked.
pub(crate) type IntakeArgs = (Store, tokio::sync::mpsc::UnboundedSender<u64>);

impl Actor for IntakeActor {
    type Msg = IntakeMsg;
    type State = IntakeArgs;
    type Arguments = IntakeArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: IntakeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        (store, queue): &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            IntakeMsg::Accept {
                delivery_id,
                event,
                subscribed,
                body,
                reply,
            } => {
                let r = accept(store, delivery_id, event, subscribed, &body);
                if let Ok(Some(seq)) = r {
                    let _ = queue.send(seq);
                }
                let _ = reply.send(r);
            }
            IntakeMsg::Rotate { state, reply } => {
                let r = serde_json::to_vec(&*state)
                    .map_err(|e| Error::Internal(e.to_string()))
                    .and_then(|v| Ok(store.meta_put(SECRET_META, &v)?));
                let _ = reply.send(r);
            }
        }
        Ok(())
    }
}

fn accept(
    store: &Store,
    delivery_id: String,
    event: String,
    subscribed: bool,
    body: &[u8],
) -> Result<Option<u64>> {
    if store.is_claimed(&delivery_id)? {
        return Err(Error::Rejected("Duplicate delivery".into()));
    }
    let seq = store.new_id(Seq::Delivery)?;
    let d = Delivery {
        seq,
        delivery_id,
        event,
        action: None,
        received_at: now_ms(),
        status_code: 202,
        outcome: if subscribed { "queued" } else { "ignored" }.into(),
        reason: (!subscribed).then(|| "event_ignored".into()),
        installation_id: None,
        repository: None,
        project_id: None,
        test_run_id: None,
        payload_len: body.len() as u64,
    };
    if !store.claim_delivery(&d, subscribed.then_some(body), subscribed)? {
        return Err(Error::Rejected("Duplicate delivery".into()));
    }
    Ok(subscribed.then_some(seq))
}
