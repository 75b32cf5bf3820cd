//! [`PipelineHandle`]: the deployment pipeline, from an uploaded capsule to what a robot runs.
//! Capsules (`capsules`), configurations, deployment packages, phased rollouts, the device update API
//! and the upload machinery capsules and configurations share in their own modules
//! (`configurations`, `deployments`, `rollouts`, `updates`, `uploads`).
//!
//! The upload flow: `upload-url` checks the request, takes the organization's quota turn with
//! the declared size reserved (`quota`), creates the record and answers a signed upload link;
//! the bytes are PUT to that link (at most the declared size); `confirm` computes SHA-256 over
//! the stored bytes, checks the archive and the dependencies, and settles `passed`/`failed`
//! and `is_latest`. Above `sync_validation_max_bytes` confirm answers 202 and validates in the
//! background; the owed validation is written durably before the 202 and resumed at start-up
//! and by the housekeeper (`resume_validations`) until its verdict is written.
//!
//! Invariants a change must keep:
//! - Writes go through the project's actor (single writer of `is_latest`, uniqueness,
//!   references and transitions); this handle writes no record itself.
//! - Hashing and archive checks run on a blocking thread over a temporary copy, memory flat;
//!   an archive's check reads a bounded amount of decompressed bytes and entries
//!   (`archives`).
//! - Confirmed bytes never change. On the local backend the upload and download links are
//!   fleetops' own signed tokens (`/api/v1/uploads/{token}`, `/api/v1/downloads/{token}`); a
//!   `PUT` there shares the object's lock with confirm and is refused once confirmed. On S3
//!   they are the store's own presigned URLs, which cannot be revoked, so a capsule's confirm
//!   copies the upload to a staging key no URL targets, validates that copy and seals it under
//!   its content key (see [`keys`]); the record's `blob_key` moves in the verdict's write, and
//!   the upload key is deleted only once that write is durable.
//!
//! Tested through the real server (`tests/api/capsules.rs`, `configurations.rs`,
//! `deployments.rs`, `rollouts.rs`, `updates.rs`), against moto for S3 (`tests/api/s3.rs`),
//! and by the crash harness, which kills the server with a validation owed.

mod capsules;
pub mod configurations;
pub mod deployments;
pub mod rollouts;
pub mod updates;
mod uploads;
mod validation;

pub use capsules::*;
pub use uploads::UploadKind;

use std::io::Write;
use std::sync::Arc;

use fleetops_storage::{BlobStore, Capsule, Store};
use futures::StreamExt;
use futures::stream::BoxStream;
use semver::Version;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::archives;
use crate::clock::{fmt_ms, now_ms};
use crate::error::{Error, Result};
use crate::links::Signer;
use crate::project::PipelineMsg;
use crate::project::handle::ProjectsHandle;
use crate::versions::{Constraint, parse_version};
use fleetops_storage::ValidationStatus;

pub use crate::config::PipelineConfig;
pub(crate) use crate::rules::blob_keys as keys;

/// The upload/confirm lock of one capsule or configuration.
pub(crate) type ObjectLock = Arc<tokio::sync::Mutex<()>>;

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
    pub(crate) controllers: crate::keyed::Keyed<crate::rollout::RolloutController>,
    /// Tells the other nodes to start a rollout's controller too (the one holding its lease
    /// decides; the others stand by to take over).
    pub(crate) bus: crate::bus::Bus,
    #[cfg(feature = "fault-injection")]
    pub(crate) rollout_stop_holds: crate::rollout::StopHolds,
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
