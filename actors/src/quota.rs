//! QuotaActor: one per organization, the single place its storage quota is checked. Projects
//! have their own writers, so two uploads to two projects of one organization would each see
//! the other's bytes as not yet there and could together pass the limit. Instead every
//! reservation of storage (a new capsule or configuration) asks this actor for a turn: it
//! counts what the organization holds and has reserved, and, when the new bytes fit, hands
//! the caller a [`Turn`] and waits until the caller has written its record (or failed) before
//! it counts for the next one. The record is the reservation, so nothing is left to release
//! after a crash.
//!
//! The turn travels with the create message to the project's actor, so it ends when the record
//! is written or the message is dropped unapplied, never merely because the caller hung up.
//! The actor keeps no state of its own (it counts from the store at each turn), so a restart
//! loses nothing. Past the limit the answer is 413, before any byte moves.
//!
//! The turn orders reservations within this process; across processes on one database the
//! store decides: each turn carries the organization's [`QuotaMark`], read before the count,
//! and the record's write fails with `QUOTA_RACED` when another reservation was written since.
//! The caller then asks for a turn again, counting what that one wrote (`pipeline`).
//!
//! Tested by the unit test below (a turn is exclusive, and what is written counts) and through
//! the API (`tests/api/capsules/`: concurrent uploads across projects, and a reservation
//! whose caller hung up, never pass the quota).

use fleetops_storage::Store;
use fleetops_storage::pipeline::QuotaMark;
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
    /// What the count was made under; the record's write reserves under it.
    pub(crate) mark: Option<QuotaMark>,
}

#[cfg(test)]
impl Turn {
    /// A turn no quota actor waits on, for writer tests that bypass the quota.
    pub(crate) fn detached() -> std::sync::Arc<Turn> {
        std::sync::Arc::new(Turn {
            _release: oneshot::channel().0,
            mark: None,
        })
    }
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
            // As stored (past this process's cache where another process may write).
            for c in self.store.stored_capsules(p.id)?.iter() {
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
        // Read before the count: a reservation written after it moves the mark.
        let mark = match st.store.quota_mark(st.org_id) {
            Ok(m) => m,
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                return Ok(());
            }
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
        let _ = reply.send(Ok(Turn {
            _release: tx,
            mark: Some(mark),
        }));
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

/// The QuotaActor driven through its mailbox on a temporary store, with no HTTP: a turn is
/// exclusive (the next reservation is counted only once the holder's record is written and
/// its turn released), and what is written counts.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use fleetops_storage::{Capsule, Project, UploadState};

    use super::*;

    const ORG: u64 = 1;
    const PID: u64 = 10;

    fn capsule(id: u64, bytes: u64) -> Capsule {
        Capsule {
            id,
            project_id: PID,
            name: format!("c{id}"),
            version: "1.0.0".into(),
            version_major: 1,
            version_minor: 0,
            version_patch: 0,
            description: None,
            capsule_type: "SW".into(),
            file_size_bytes: bytes,
            metadata_json: b"{}".to_vec(),
            dependencies: Vec::new(),
            is_latest: false,
            upload: UploadState::pending(".tar".into(), 0),
            created_at: 0,
            updated_at: 0,
        }
    }

    async fn admit(
        a: &ActorRef<Envelope<QuotaMsg>>,
        limit: u64,
        add: u64,
    ) -> tokio::sync::oneshot::Receiver<Result<Turn>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        a.cast(Envelope::cast(QuotaMsg::Admit {
            limit,
            add,
            reply: tx.into(),
        }))
        .unwrap();
        rx
    }

    #[tokio::test]
    async fn a_turn_is_exclusive_and_what_is_written_counts() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .insert_project(&Project {
                id: PID,
                org_id: ORG,
                slug: "p".into(),
                name: "p".into(),
                secret_hash: [0; 32],
                created_at: 0,
            })
            .unwrap();
        store.put_capsules(&[&capsule(1, 1_000)]).unwrap();
        let (a, _) = Actor::spawn(None, QuotaActor, (store.clone(), ORG))
            .await
            .unwrap();

        // 1,000 held + 1,500 fits under 3,000: a turn.
        let first = admit(&a, 3_000, 1_500).await.await.unwrap().unwrap();
        // The next waits while the turn is held...
        let mut second = admit(&a, 3_000, 1_500).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut second)
                .await
                .is_err(),
            "a second reservation was counted while the first held its turn"
        );
        // ...and is counted once the first's record is written and its turn released.
        store.put_capsules(&[&capsule(2, 1_500)]).unwrap();
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the turn passed on")
            .unwrap();
        assert!(
            matches!(second, Err(Error::TooLarge(_))),
            "2,500 + 1,500 > 3,000"
        );
        // A reservation that fits the rest still gets its turn.
        assert!(admit(&a, 3_000, 500).await.await.unwrap().is_ok());
        a.stop(None);
    }
}
