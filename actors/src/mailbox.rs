//! Calling an actor: a deadline on every call, a bound on waiting calls (ractor mailboxes are
//! unbounded), and one retry against the replacement when the actor died with our message
//! still queued.
//!
//! When an actor panics, ractor drops its mailbox: the message being handled and every one
//! queued behind it lose their reply port. The queued ones never ran, so they are sent once
//! more to the restarted actor, and "no other request notices". The one that caused the panic
//! is retried too and, if the fault is deterministic, fails again and gets a 500. Writes are
//! single atomic batches applied at the end of a handler, so a panic leaves nothing half-done.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// What became of one request.
pub(crate) enum Outcome<T> {
    Replied(Result<T>),
    /// The actor was stopped or failed before our message reached it, or it died with our
    /// message queued or in hand: ask its replacement.
    Lost,
}

fn unavailable() -> Error {
    Error::Unavailable {
        retry_after_secs: 1,
    }
}

/// Sends one request and waits for its reply.
pub(crate) async fn deliver<M, T>(
    actor: &ActorRef<M>,
    gate: &Arc<Semaphore>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
) -> Outcome<T>
where
    M: ractor::Message,
    T: Send + 'static,
{
    // A full mailbox answers at once instead of queueing without bound.
    let Ok(_permit) = gate.try_acquire() else {
        return Outcome::Replied(Err(unavailable()));
    };
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(r)) => Outcome::Replied(r),
        Ok(CallResult::Timeout) => Outcome::Replied(Err(unavailable())),
        Ok(CallResult::SenderError) | Err(_) => Outcome::Lost,
    }
}

/// The error of a request lost twice.
pub(crate) fn lost_twice() -> Error {
    Error::Internal("actor failed twice while handling the request".into())
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

    /// The live actor other than `old`, waiting briefly for its supervisor to restart it.
    async fn replacement(&self, old: &ActorRef<M>) -> Option<ActorRef<M>> {
        for _ in 0..100 {
            if let Some(a) = self.get()
                && a.get_id() != old.get_id()
            {
                return Some(a);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    pub(crate) async fn call<T: Send + 'static>(
        &self,
        build: impl Fn(RpcReplyPort<Result<T>>) -> M,
    ) -> Result<T> {
        let actor = self.get().ok_or_else(unavailable)?;
        match deliver(&actor, &self.gate, self.timeout, &build).await {
            Outcome::Replied(r) => r,
            Outcome::Lost => {
                let next = self.replacement(&actor).await.ok_or_else(unavailable)?;
                match deliver(&next, &self.gate, self.timeout, &build).await {
                    Outcome::Replied(r) => r,
                    Outcome::Lost => Err(lost_twice()),
                }
            }
        }
    }

    pub(crate) fn cast(&self, msg: M) {
        if let Some(a) = self.get() {
            let _ = a.cast(msg);
        }
    }
}
