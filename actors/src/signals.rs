//! What the handles of devices and logs tell the alert evaluators, as a trait, so that the
//! project family (whose handle the alerting family's handles call to write rules and
//! integrations) holds its evaluators' feed without importing the alerting family: the two
//! families import each other in one direction only. The alerting family implements it
//! (`alerts::evaluator::AlertFeed`); a signal never fails its caller.
//!
//! A handle signals only once its write is durable (a heartbeat, a log batch, a device
//! deleted, a group changed), so an evaluator never judges what a crash could still take back.
//! `tests/layering.rs` holds the one direction between the two families.

use std::collections::BTreeMap;
use std::sync::Arc;

use fleetops_storage::LogChunk;
use futures::future::BoxFuture;

pub(crate) trait AlertSignals: Send + Sync {
    /// A device was deleted or a group changed: the project's rules reread its devices.
    fn devices_changed(&self, pid: u64) -> BoxFuture<'_, ()>;

    /// A durable heartbeat of a device, with its metrics.
    fn heartbeat(
        &self,
        pid: u64,
        device_id: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
    ) -> BoxFuture<'_, ()>;

    /// A durable log batch of a device (within the feed's byte budget).
    fn logs(&self, pid: u64, device_id: u64, chunk: Arc<LogChunk>) -> BoxFuture<'_, ()>;
}
