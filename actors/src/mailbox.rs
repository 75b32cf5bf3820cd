//! Calling an actor: a deadline on every call and a bound on waiting calls, since ractor
//! mailboxes are unbounded.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// The message never reached the actor (stopped or restarting), so it had no effect and may
/// be sent again to the actor's replacement.
pub(crate) struct Undelivered;

/// Sends one request and waits for its reply.
pub(crate) async fn call<M, T>(
    actor: &ActorRef<M>,
    gate: &Arc<Semaphore>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
) -> Result<T>
where
    M: ractor::Message,
    T: Send + 'static,
{
    deliver(actor, gate, timeout, build)
        .await
        .unwrap_or(Err(Error::Unavailable {
            retry_after_secs: 1,
        }))
}

/// Like [`call`], but tells apart a message that was never delivered.
pub(crate) async fn deliver<M, T>(
    actor: &ActorRef<M>,
    gate: &Arc<Semaphore>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
) -> std::result::Result<Result<T>, Undelivered>
where
    M: ractor::Message,
    T: Send + 'static,
{
    // A full mailbox answers at once instead of queueing without bound.
    let Ok(_permit) = gate.try_acquire() else {
        return Ok(Err(Error::Unavailable {
            retry_after_secs: 1,
        }));
    };
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(r)) => Ok(r),
        Ok(CallResult::Timeout) => Ok(Err(Error::Unavailable {
            retry_after_secs: 1,
        })),
        // The actor dropped the reply port: it failed while handling this very request.
        // Its supervisor restarts it; this request alone sees the failure.
        Ok(CallResult::SenderError) => Ok(Err(Error::Internal(
            "actor failed while handling the request".into(),
        ))),
        Err(_) => Err(Undelivered),
    }
}

/// The current incarnation of a singleton actor; its supervisor swaps in the restarted one.
pub(crate) struct Slot<M: ractor::Message> {
    current: std::sync::RwLock<Option<ActorRef<M>>>,
    gate: Arc<Semaphore>,
    timeout: Duration,
}

impl<M: ractor::Message> Slot<M> {
    pub(crate) fn new(limit: usize, timeout: Duration) -> Self {
        Self {
            current: std::sync::RwLock::new(None),
            gate: Arc::new(Semaphore::new(limit)),
            timeout,
        }
    }

    pub(crate) fn set(&self, actor: Option<ActorRef<M>>) {
        if let Ok(mut g) = self.current.write() {
            *g = actor;
        }
    }

    pub(crate) fn get(&self) -> Option<ActorRef<M>> {
        self.current.read().ok().and_then(|g| g.clone())
    }

    pub(crate) async fn call<T: Send + 'static>(
        &self,
        build: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
    ) -> Result<T> {
        let actor = self.get().ok_or(Error::Unavailable {
            retry_after_secs: 1,
        })?;
        call(&actor, &self.gate, self.timeout, build).await
    }

    pub(crate) fn cast(&self, msg: M) {
        if let Some(a) = self.get() {
            let _ = a.cast(msg);
        }
    }
}
