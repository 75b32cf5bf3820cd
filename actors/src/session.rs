//! SessionActor: one per active session, started on its first append after creation or a
//! restart. It is the single writer of the session's log chunks and counters: each appended
//! batch is one chunk, written with its counters in one transaction and acknowledged once
//! durable (the handle waits for the group commit, so concurrent batches share fsyncs).
//!
//! Its state is rebuilt from storage in `pre_start` (counters, whether the session is still
//! active), so a restart after a panic loses nothing that was acknowledged.

use std::sync::Arc;

use fleetops_storage::{Artifact, LogChunk, SessionCounters, SessionStatus, Store};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::error::{Error, Result};

type Reply<T> = RpcReplyPort<Result<T>>;

pub(crate) enum SessionMsg {
    /// Store a validated batch; replies with the number of entries accepted.
    Append(Arc<LogChunk>, Reply<usize>),
    /// Record an uploaded artifact; replies with the blob key it replaced, if any.
    PutArtifact(Artifact, Reply<Option<String>>),
    /// Refuse every later append (completion or deletion is under way).
    Seal(Reply<()>),
    /// The session ended or is gone: stop.
    Stop,
    /// Fault injection for supervision tests.
    Panic,
}

#[derive(Default)]
pub(crate) struct SessionActor;

impl crate::keyed::KeyedChild for SessionActor {
    type Ctx = Store;
    const KIND: &'static str = "session";
}

pub(crate) struct SessionState {
    id: u64,
    store: Store,
    /// Counters as stored after the last acknowledged append.
    counters: SessionCounters,
    /// False once the session is not active (or gone): appends are refused.
    open: bool,
    /// The session no longer exists (deleted): appends are 404, not 409.
    gone: bool,
}

impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = (Store, u64);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (store, id): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let session = store.session_by_id(id)?;
        let counters = store.session_counters(id)?;
        Ok(SessionState {
            id,
            counters,
            open: session
                .as_ref()
                .is_some_and(|s| s.status == SessionStatus::Active),
            gone: session.is_none(),
            store,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Append(chunk, reply) => {
                let _ = reply.send(st.append(chunk));
            }
            SessionMsg::PutArtifact(a, reply) => {
                let _ = reply.send(st.put_artifact(a));
            }
            SessionMsg::Seal(reply) => {
                st.open = false;
                let _ = reply.send(Ok(()));
            }
            SessionMsg::Stop => myself.stop(None),
            SessionMsg::Panic => panic!("injected fault in SessionActor {}", st.id),
        }
        Ok(())
    }
}

impl SessionState {
    fn check_open(&self) -> Result<()> {
        if self.gone {
            return Err(Error::not_found("Session"));
        }
        if !self.open {
            return Err(Error::Conflict("Session is not active".into()));
        }
        Ok(())
    }

    fn put_artifact(&mut self, a: Artifact) -> Result<Option<String>> {
        self.check_open()?;
        let old = self.store.artifact(self.id, &a.path)?;
        let mut next = self.counters;
        match &old {
            Some(o) => {
                next.artifact_size_bytes = next.artifact_size_bytes
                    - o.size_bytes.min(next.artifact_size_bytes)
                    + a.size_bytes
            }
            None => {
                next.artifact_count += 1;
                next.artifact_size_bytes += a.size_bytes;
            }
        }
        self.store.put_artifact(&a, &next)?;
        self.counters = next;
        Ok(old.map(|o| o.blob_key))
    }

    fn append(&mut self, chunk: Arc<LogChunk>) -> Result<usize> {
        self.check_open()?;
        let n = chunk.len();
        let seq = self.counters.next_chunk;
        let next = SessionCounters {
            log_count: self.counters.log_count + n as u64,
            next_chunk: seq + 1,
            ..self.counters
        };
        self.store.append_chunk(self.id, &chunk, &next, seq)?;
        self.counters = next;
        Ok(n)
    }
}
