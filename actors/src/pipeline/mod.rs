//! [`PipelineHandle`]: the deployment pipeline, from an uploaded capsule to what a robot runs.
//! The handle type in `handle`; capsules (`capsules`, `validation`), configurations,
//! deployment packages, phased rollouts and their controllers, the device update API and the
//! upload machinery capsules and configurations share, each in its own module
//! (`configurations`, `deployments`, `rollouts`, `controller`, `updates`, `uploads`).
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
//! Tested through the real server (`tests/api/capsules/`, `configurations.rs`,
//! `deployments/`, `rollouts/`, `updates.rs`), against moto for S3 (`tests/api/s3/`),
//! and by the crash harness, which kills the server with a validation owed.

mod capsules;
pub mod configurations;
pub(crate) mod controller;
pub mod deployments;
mod handle;
pub mod rollouts;
pub mod updates;
mod uploads;
mod validation;

pub use capsules::*;
pub use handle::PipelineHandle;
pub(crate) use handle::reservation_written;
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
