//! [`PipelineHandle`]: the way into the deployment pipeline (what it holds; its operations
//! are in the family's files by concern), and how a quota reservation's write is answered.

use super::*;

#[derive(Clone)]
pub struct PipelineHandle {
    pub(crate) projects: ProjectsHandle,
    pub(crate) store: Store,
    pub(crate) blobs: BlobStore,
    pub(crate) signer: Arc<Signer>,
    pub(crate) public_url: Arc<std::sync::RwLock<String>>,
    /// Storage limit per tier name.
    pub(crate) quotas: Arc<std::collections::HashMap<String, u64>>,
    /// One writer per organization checks and reserves storage.
    pub(crate) quota: crate::quota::QuotaHandle,
    pub(crate) cfg: PipelineConfig,
    pub(crate) tmp_dir: Option<std::path::PathBuf>,
    /// Streamed uploads running now, shared with the sessions' artifacts (one pool, each
    /// organization's share).
    pub(crate) uploads: crate::shares::Shares,
    /// Per-object locks of upload and confirm.
    pub(crate) locks: Arc<dashmap::DashMap<(UploadKind, u64), ObjectLock>>,
    /// Rollout results as the project actors publish them, for the alert evaluator.
    pub(crate) rollouts: crate::events::Outbox<deployments::RolloutEvent>,
    /// Which package each device should run, cached (shared with the project actors).
    pub(crate) assignments: Arc<crate::assignments::Assignments>,
    /// One controller per phased rollout under way.
    pub(crate) controllers: crate::keyed::Keyed<crate::pipeline::controller::RolloutController>,
    /// Tells the other nodes to start a rollout's controller too (the one holding its lease
    /// decides; the others stand by to take over).
    pub(crate) bus: crate::bus::Bus,
    #[cfg(feature = "fault-injection")]
    pub(crate) rollout_stop_holds: crate::pipeline::controller::StopHolds,
    /// Serialized lists: (project, name, type, latest_only) -> (list identity, JSON, list).
    #[allow(clippy::type_complexity)]
    pub(crate) list_cache: Arc<
        dashmap::DashMap<
            (u64, String, String, bool),
            (usize, bytes::Bytes, Arc<Vec<Arc<Capsule>>>),
        >,
    >,
}

/// A reservation's write as the caller answers it; `None` when it lost to another process's
/// reservation of the same organization, so its count must be made again. Each loss is the
/// other's progress; past 32 in a row the caller is answered 503 to try again.
pub(crate) fn reservation_written<T>(r: Result<T>, raced: &mut u32) -> Option<Result<T>> {
    match r {
        Err(Error::Conflict(m)) if m == fleetops_storage::pipeline::QUOTA_RACED => {
            *raced += 1;
            (*raced >= 32).then_some(Err(Error::Unavailable {
                retry_after_secs: 1,
            }))
        }
        r => Some(r),
    }
}
