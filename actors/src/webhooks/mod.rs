//! Inbound webhooks from the source-code host, as mailbox flows:
//!
//! ```text
//! POST /scm/webhooks ─ verify (HMAC, constant time) ─▶ IntakeActor (claim id + store, atomic)
//!        ◀── 202 once in the journal (fdatasync) ─────┘         │ seq
//!                                                               ▼
//!                       WebhookWorker (arrival order) ─▶ InstallationActor (one per installation)
//!                                                               │
//!                                                               ▼
//!                                                         JobDispatcher ─▶ test runs
//! ```
//!
//! A delivery answered 202 is on disk with its payload and a place in the queue: the intake
//! appends a batch's payloads and a journal record of its deliveries to the payload log with
//! one `fdatasync`, then claims the ids and stores the deliveries in one sled write without
//! waiting for sled's flush, and the store replays the journal at open for whatever sled lost.
//! The worker's effect and the delivery's outcome are written in one batch, and the
//! installation actor and the dispatcher act on a delivery only while it is still `queued`, so
//! after a crash, or a call retried while the first is still queued, every queued delivery is
//! processed exactly once. Reads (lists, status) go to the store.
//!
//! The store is the worker's queue (the list of `queued` deliveries), read a page at a time,
//! so a backlog costs a page of memory. A delivery that keeps failing (other than on an actor
//! that is down) is recorded `processing_failed` after five retries, so one poison delivery
//! cannot stall the queue. Each installation is bound to one organization, and its deliveries
//! resolve only to repository links of that organization's projects.
//!
//! Tested through the real server (`tests/api/webhooks/`: signatures, dedup, policy, batches
//! that fail part-way, panics), by unit tests of the intake, the dispatcher and the payloads,
//! and by the crash harness, whose kills land between a batch's 202 and sled's flush.

mod deliveries;
pub(crate) mod dispatcher;
pub(crate) mod installation;
pub(crate) mod intake;
pub mod payload;
mod repositories;
mod runs;
mod secret;
pub(crate) use secret::signature_matches;
mod handle;
mod views;
pub(crate) mod work;
pub(crate) mod worker;

pub use handle::WebhooksHandle;
#[cfg(feature = "fault-injection")]
pub use handle::WriteHold;
pub use intake::SecretState;
pub use repositories::RepoPatch;
pub(crate) use secret::{SECRET_SUBJECT, load_secret};
pub use views::*;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};

use fleetops_storage::Store;

#[cfg(feature = "fault-injection")]
use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::mailbox::Slot;
use dispatcher::DispatcherMsg;
use installation::InstallationActor;
#[cfg(feature = "fault-injection")]
use installation::InstallationMsg;
use intake::IntakeMsg;

pub use crate::config::{RunsConfig, ScmConfig};

/// Rejected and duplicate deliveries kept in memory (never their bodies).
const RECENT_REJECTED: usize = 1000;
