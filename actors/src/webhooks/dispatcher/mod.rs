//! JobDispatcher: the single writer of repository links, test runs and their idempotency
//! keys. It resolves a delivery's repository and project, applies the project's policy
//! (branch patterns, drafts), and dispatches, cancels, records or skips with a reason, writing
//! the delivery's outcome in the same batch as the effect. Runners claim, renew and complete
//! runs here too; an expired lease puts a run back in the queue with `attempt` + 1.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fleetops_storage::{
    Delivery, RepoLink, StorageError, Store, TestRun, accounts::Seq, webhooks,
    webhooks::WebhookBatch,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::RepoPatch;
use super::payload::{Payload, matches};
use super::work::{Work, delivery_org, skip, skip_into, still_queued};

use crate::error::{Error, Result};
use crate::mailbox::Envelope;
use fleetops_storage::{DeliveryOutcome, RunStatus};

type Reply<T> = RpcReplyPort<Result<T>>;

pub(crate) enum DispatcherMsg {
    Dispatch {
        work: Arc<Work>,
        reply: Reply<()>,
    },
    /// Several deliveries of one installation, dispatched in order up to the first failure
    /// (one message and one reply for the lot; each still writes its own outcome), answered
    /// one result each for those it dispatched.
    DispatchBatch {
        works: Vec<Arc<Work>>,
        reply: Reply<Vec<Result<()>>>,
    },
    /// Records a skip decided before a delivery reached an installation (unparsable payload).
    Skip {
        delivery: Box<Delivery>,
        reason: &'static str,
        /// The worker's lease (several nodes).
        fence: Option<fleetops_storage::leases::Fence>,
        reply: Reply<()>,
    },
    CreateRepo {
        project_id: u64,
        full_name: String,
        branch_patterns: Vec<String>,
        include_drafts: bool,
        reply: Reply<RepoLink>,
    },
    UpdateRepo {
        project_id: u64,
        id: u64,
        patch: RepoPatch,
        reply: Reply<RepoLink>,
    },
    DeleteRepo {
        project_id: u64,
        id: u64,
        reply: Reply<()>,
    },
    Claim {
        project_id: u64,
        reply: Reply<Option<TestRun>>,
    },
    Heartbeat {
        project_id: u64,
        id: u64,
        reply: Reply<TestRun>,
    },
    Complete {
        project_id: u64,
        id: u64,
        status: String,
        summary: Option<String>,
        reply: Reply<TestRun>,
    },
    /// Timer: requeue runs whose lease has expired.
    ExpireLeases,
    /// Fault injection: the dispatcher panics in its handler (supervision tests).
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Fault injection: the `n`th delivery dispatched from now on (counting from 1) fails
    /// once, as on a failing write, leaving it queued.
    #[cfg(feature = "fault-injection")]
    FailDispatch(u32, Arc<std::sync::atomic::AtomicBool>),
    /// Fault injection: the next shared batch of outcomes fails to commit, as on a failing
    /// disk, leaving its deliveries queued.
    #[cfg(feature = "fault-injection")]
    FailCommit(Arc<std::sync::atomic::AtomicBool>),
}

pub(crate) struct JobDispatcher;

pub(crate) struct DispatcherState {
    store: Store,
    lease_ms: i64,
    clock: crate::clock::Clock,
    /// Dispatches left before the injected failure, and the flag it sets (tests).
    #[cfg(feature = "fault-injection")]
    fail_in: Option<(u32, Arc<std::sync::atomic::AtomicBool>)>,
    /// The flag the next shared commit sets as it fails (tests).
    #[cfg(feature = "fault-injection")]
    fail_commit: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Actor for JobDispatcher {
    type Msg = Envelope<DispatcherMsg>;
    type State = DispatcherState;
    type Arguments = (Store, i64, crate::clock::Clock);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (store, lease_seconds, clock): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || {
            Envelope::cast(DispatcherMsg::ExpireLeases)
        });
        Ok(DispatcherState {
            store,
            lease_ms: lease_seconds.max(1) * 1000,
            clock,
            #[cfg(feature = "fault-injection")]
            fail_in: None,
            #[cfg(feature = "fault-injection")]
            fail_commit: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        match msg {
            #[cfg(feature = "fault-injection")]
            DispatcherMsg::Panic => panic!("injected fault in the dispatcher"),
            #[cfg(feature = "fault-injection")]
            DispatcherMsg::FailDispatch(n, fired) => st.fail_in = Some((n.max(1), fired)),
            #[cfg(feature = "fault-injection")]
            DispatcherMsg::FailCommit(fired) => st.fail_commit = Some(fired),
            DispatcherMsg::Dispatch { work, reply } => {
                let _ = reply.send(st.dispatch_one(&work));
            }
            DispatcherMsg::DispatchBatch { works, reply } => {
                let _ = reply.send(Ok(st.dispatch_batch(&works)));
            }
            DispatcherMsg::Skip {
                delivery,
                reason,
                fence,
                reply,
            } => {
                let r = match still_queued(&st.store, delivery.seq) {
                    Ok(true) => skip(&st.store, &delivery, reason, fence.as_ref()),
                    other => other.map(|_| ()),
                };
                let _ = reply.send(r);
            }
            DispatcherMsg::CreateRepo {
                project_id,
                full_name,
                branch_patterns,
                include_drafts,
                reply,
            } => {
                let _ = reply.send(st.live(project_id).and_then(|()| {
                    st.create_repo(project_id, full_name, branch_patterns, include_drafts)
                }));
            }
            DispatcherMsg::UpdateRepo {
                project_id,
                id,
                patch,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.update_repo(project_id, id, patch)),
                );
            }
            DispatcherMsg::DeleteRepo {
                project_id,
                id,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.delete_repo(project_id, id)),
                );
            }
            DispatcherMsg::Claim { project_id, reply } => {
                let _ = reply.send(st.live(project_id).and_then(|()| st.claim(project_id)));
            }
            DispatcherMsg::Heartbeat {
                project_id,
                id,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.heartbeat(project_id, id)),
                );
            }
            DispatcherMsg::Complete {
                project_id,
                id,
                status,
                summary,
                reply,
            } => {
                let _ = reply.send(
                    st.live(project_id)
                        .and_then(|()| st.complete(project_id, id, status, summary)),
                );
            }
            DispatcherMsg::ExpireLeases => {
                if let Err(e) = st.expire_leases() {
                    tracing::warn!(error = %e, "lease expiry failed");
                }
            }
        }
        Ok(())
    }
}

/// How long a run's read-decide-write is tried again against other processes' writes.
const RACE_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether working a delivery wrote a run (made, cancelled): later deliveries of the same
/// commit or pull request must then read it committed.
type Wrote = bool;

/// What a delivery's run may be found by: its repository with its head commit, and with its
/// pull request number (both lower-cased, as the commit index is). Two deliveries with no tag
/// in common read and write disjoint runs: every run key and index names the commit or the
/// pull request. The commit is taken from the field its event's dispatch reads.
fn conflict_tags(w: &Work) -> Vec<String> {
    let p = &w.payload;
    let repo = p.repo_name().unwrap_or_default().to_ascii_lowercase();
    let pr = p.pull_request.as_ref();
    let sha = match w.delivery.event.as_str() {
        "pull_request" => pr
            .and_then(|x| x.head.as_ref())
            .and_then(|h| h.sha.as_deref()),
        "push" => p.after.as_deref(),
        "check_suite" => p.check_suite.as_ref().and_then(|c| c.head_sha.as_deref()),
        "workflow_run" => p.workflow_run.as_ref().and_then(|c| c.head_sha.as_deref()),
        _ => None,
    };
    let mut tags = Vec::with_capacity(2);
    if let Some(sha) = sha {
        tags.push(format!("{repo}@{}", sha.to_ascii_lowercase()));
    }
    if let Some(n) = p.number.or(pr.and_then(|x| x.number)) {
        tags.push(format!("{repo}#{n}"));
    }
    // With neither, its dispatch reads no run (it is skipped before any such read).
    tags
}

/// Branch patterns: 1-32 of them, each 1-255 bytes without whitespace.
pub(crate) fn check_patterns(p: &[String]) -> Result<()> {
    if p.is_empty() || p.len() > 32 {
        return Err(Error::unprocessable("branch_patterns", "1 to 32 patterns"));
    }
    for x in p {
        if x.is_empty() || x.chars().count() > 255 || x.chars().any(char::is_whitespace) {
            return Err(Error::unprocessable(
                "branch_patterns",
                "each pattern is 1-255 characters without whitespace",
            ));
        }
    }
    Ok(())
}

/// `owner/name` as the host spells repositories.
pub(crate) fn check_full_name(s: &str) -> Result<()> {
    let ok = s.len() <= 200
        && s.split_once('/').is_some_and(|(o, n)| {
            let part = |x: &str| {
                !x.is_empty()
                    && x.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            };
            part(o) && part(n)
        });
    if ok {
        Ok(())
    } else {
        Err(Error::unprocessable("full_name", "must be owner/name"))
    }
}

mod dispatch;
mod repos;
mod runs;

#[cfg(test)]
mod tests;
