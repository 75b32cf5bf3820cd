//! Inbound webhooks: the delivery log with its dedup window and intake queue (`deliveries`),
//! installations (`installations`), repository links and holds (`repositories`) and test runs
//! (`runs`). Each change is one atomic batch ([`WebhookBatch`], `batch`), so a delivery's
//! outcome is written together with its effect and a crash replays it whole or not at all.
//! The payloads themselves are in the payload log (`payload_log`).

pub mod records;

use crate::accounts::Seq;
use crate::states::DeliveryOutcome;
use crate::states::RunStatus;
use crate::{
    Delivery, Installation, InstallationBinding, RepoHold, RepoLink, Result, Store, TestRun,
    Writes, codec, keys,
};

use crate::lists::{Entry, ListId, Listed, Query};

mod batch;
mod deliveries;
mod installations;
pub(crate) mod payload_log;
mod repositories;
mod runs;

pub use batch::WebhookBatch;
pub use repositories::REPO_NAME_TAKEN;
pub use runs::{NewRun, RUN_ID_BLOCK, RunQuery};

use repositories::*;

/// Two big-endian ids (a repository link's, a device token's index entry).
pub(crate) fn pair(v: &[u8]) -> Option<(u64, u64)> {
    let a = v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok())?;
    let b = v.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok())?;
    Some((u64::from_be_bytes(a), u64::from_be_bytes(b)))
}
