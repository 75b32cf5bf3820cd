//! Calling an actor: a deadline on every call, a bound on the calls in its mailbox (ractor
//! mailboxes are unbounded), and one retry against the replacement when the actor died with
//! our message still queued.
//!
//! The bound is a permit carried by each call's envelope and given back when the actor takes
//! the envelope out of its mailbox (or, for the intake, when it answers the call): a caller
//! that timed out leaves its message, and its payload, queued until the actor reaches it, so
//! the permit stays with the message, not with the caller. A stalled actor thus holds at most
//! its limit of messages whatever its callers do.
//!
//! Every call travels in an [`Envelope`] that shares its state with the waiting caller: the
//! actor takes the request on (`Envelope::open`) only while the caller still waits (its
//! deadline has not passed and it has not gone away), and once
//! taken on, the caller waits for the answer however long it takes. So a caller that timed
//! out (503) left nothing behind that could be applied later, and a caller whose request was
//! being applied is told what became of it, never a 503 for a write that then happens.
//!
//! When an actor panics, ractor drops its mailbox: the message being handled and every one
//! queued behind it lose their reply port. The queued ones were never taken on, so they are
//! sent once more to the restarted actor, and "no other request notices". The one being
//! handled is not sent again: its caller gets a 500. Handlers answer as soon as their one
//! atomic write is applied, before any follow-up work, so a request whose answer was lost to
//! a panic wrote nothing, and the 500 is safe to retry (a re-send could crash the replacement
//! the same way).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// The caller is waiting and the request has not been taken on.
const WAITING: u8 = 0;
/// The actor took the request on: the caller waits for its answer.
const STARTED: u8 = 1;
/// The caller's deadline passed first: the request must never be applied.
const ABANDONED: u8 = 2;

/// What the caller and the actor agree on about one call (one transition out of `WAITING`).
#[derive(Default)]
pub(crate) struct CallState(AtomicU8);

impl CallState {
    /// The actor side: takes the request on, unless its caller gave up.
    pub(crate) fn start(&self) -> bool {
        match self
            .0
            .compare_exchange(WAITING, STARTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == STARTED,
        }
    }

    /// The caller side: gives up, unless the actor already took the request on.
    fn abandon(&self) -> bool {
        match self
            .0
            .compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == ABANDONED,
        }
    }

    fn started(&self) -> bool {
        self.0.load(Ordering::Acquire) == STARTED
    }

    /// The caller gave up (deadline passed, or it went away) before the request was taken on.
    pub(crate) fn abandoned(&self) -> bool {
        self.0.load(Ordering::Acquire) == ABANDONED
    }
}

/// Gives the call up when its caller goes away without waiting for the answer (a client that
/// hangs up drops the request's future): like a passed deadline, a request not yet taken on
/// is then never applied.
struct AbandonOnDrop(Arc<CallState>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// A message and, for a call, the state its caller waits on and its place in the mailbox.
pub(crate) struct Envelope<M> {
    call: Option<Arc<CallState>>,
    msg: M,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A call's place in its actor's bounded mailbox, held until the call is answered.
pub(crate) type MailboxSlot = Option<tokio::sync::OwnedSemaphorePermit>;

impl<M> Envelope<M> {
    /// A message nobody waits on (timers, casts, tests).
    pub(crate) fn cast(msg: M) -> Self {
        Self {
            call: None,
            msg,
            slot: None,
        }
    }

    /// The message, taken on; `None` when its caller gave up before it got here, in which
    /// case it is dropped unapplied.
    pub(crate) fn open(self) -> Option<M> {
        match &self.call {
            Some(c) if !c.start() => None,
            _ => Some(self.msg),
        }
    }

    /// The message, its call and its mailbox place, for an actor that takes requests on later
    /// than on receipt (the webhook intake takes a batch on just before writing it, and keeps
    /// the place until it answers, so its pending batch counts against the bound).
    pub(crate) fn defer(self) -> (M, Option<Arc<CallState>>, MailboxSlot) {
        (self.msg, self.call, self.slot)
    }
}

/// What became of one request.
pub(crate) enum Outcome<T> {
    Replied(Result<T>),
    /// The actor was stopped or failed before our message reached it, or it died with our
    /// message queued and not taken on: ask its replacement.
    Lost,
}

fn unavailable() -> Error {
    Error::Unavailable {
        retry_after_secs: 1,
    }
}

/// The answer to a request the actor took on and then died with.
fn failed_while_applying() -> Error {
    Error::Internal("actor failed while applying the request".into())
}

/// Sends one request and waits for its reply: up to `timeout` while it waits in the
/// mailbox, then, once the actor has taken it on, until it is answered.
pub(crate) async fn deliver<M, T>(
    actor: &ActorRef<Envelope<M>>,
    gate: &Arc<Semaphore>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
) -> Outcome<T>
where
    M: Send + 'static,
    T: Send + 'static,
{
    // A full mailbox answers at once instead of queueing without bound.
    let Ok(slot) = gate.clone().try_acquire_owned() else {
        return Outcome::Replied(Err(unavailable()));
    };
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let call = Arc::new(CallState::default());
    let _gone = AbandonOnDrop(call.clone());
    let env = Envelope {
        call: Some(call.clone()),
        msg: build(RpcReplyPort::from(tx)),
        slot: Some(slot),
    };
    if actor.cast(env).is_err() {
        return Outcome::Lost;
    }
    let lost = |call: &CallState| {
        if call.started() {
            Outcome::Replied(Err(failed_while_applying()))
        } else {
            Outcome::Lost
        }
    };
    match tokio::time::timeout(timeout, &mut rx).await {
        Ok(Ok(r)) => Outcome::Replied(r),
        Ok(Err(_)) => lost(&call),
        Err(_) if call.abandon() => Outcome::Replied(Err(unavailable())),
        // Taken on before the deadline: its effect is under way, so wait for the truth.
        Err(_) => match rx.await {
            Ok(r) => Outcome::Replied(r),
            Err(_) => lost(&call),
        },
    }
}

/// The error of a request lost twice.
pub(crate) fn lost_twice() -> Error {
    Error::Internal("actor failed twice while handling the request".into())
}

/// The current incarnation of a singleton actor; its supervisor swaps in the restarted one.
pub(crate) struct Slot<M: Send + 'static> {
    current: std::sync::RwLock<Option<ActorRef<Envelope<M>>>>,
    gate: Arc<Semaphore>,
    limit: usize,
    timeout: Duration,
}

impl<M: Send + 'static> Slot<M> {
    pub(crate) fn new(limit: usize, timeout: Duration) -> Self {
        Self {
            current: std::sync::RwLock::new(None),
            gate: Arc::new(Semaphore::new(limit)),
            limit,
            timeout,
        }
    }

    pub(crate) fn set(&self, actor: Option<ActorRef<Envelope<M>>>) {
        if let Ok(mut g) = self.current.write() {
            *g = actor;
        }
    }

    pub(crate) fn get(&self) -> Option<ActorRef<Envelope<M>>> {
        self.current.read().ok().and_then(|g| g.clone())
    }

    /// The live actor other than `old`, waiting briefly for its supervisor to restart it.
    async fn replacement(&self, old: &ActorRef<Envelope<M>>) -> Option<ActorRef<Envelope<M>>> {
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

    /// Calls in this actor's mailbox now (for the intake, also those in its pending batch),
    /// including ones whose callers already gave up.
    pub(crate) fn waiting(&self) -> usize {
        self.limit.saturating_sub(self.gate.available_permits())
    }

    pub(crate) fn cast(&self, msg: M) {
        if let Some(a) = self.get() {
            let _ = a.cast(Envelope::cast(msg));
        }
    }
}

/// Test support: one request straight into an actor's mailbox (no deadline, no gate), and its
/// answer; for tests that drive one actor without HTTP.
#[cfg(test)]
#[allow(clippy::expect_used)]
pub(crate) async fn ask<M: Send + 'static, T: Send + 'static>(
    a: &ActorRef<Envelope<M>>,
    msg: impl FnOnce(RpcReplyPort<Result<T>>) -> M,
) -> Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    a.cast(Envelope::cast(msg(tx.into())))
        .expect("the actor is running");
    rx.await.expect("the actor answered")
}
