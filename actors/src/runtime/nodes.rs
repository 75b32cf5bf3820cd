//! What a node tells the other nodes sharing its database, and what it does with what they
//! tell it: rollout leases to stand by for, devices' packages to compute again, caches to drop.

use crate::pipeline::controller;
use crate::{assignments, bus, keyed};
use std::sync::Arc;
use std::time::Duration;

use fleetops_storage::Store;

/// The bus subject on which a node announces a change that may change which package a
/// device of a project should run (the project's id, 8 bytes big-endian).
pub(super) const ASSIGNMENTS_SUBJECT: &str = "fleetops.assignments";

/// How often a node computes every device's package again, when the bus may have lost a
/// change announcement.
pub(super) const ASSIGNMENTS_REFRESH: Duration = Duration::from_secs(2);

/// Several nodes: starts the controllers the other nodes start (so one stands by to take over
/// each rollout's lease), and computes the packages of a project's devices again when another
/// node changed the project; tells the others of this node's changes.
pub(super) async fn listen_to_other_nodes(
    store: &Store,
    bus: &bus::Bus,
    controllers: &keyed::Keyed<controller::RolloutController>,
    assignments: &Arc<assignments::Assignments>,
) -> anyhow::Result<()> {
    fn id_of(m: &bus::Message) -> Option<u64> {
        Some(u64::from_be_bytes(m.payload.get(..8)?.try_into().ok()?))
    }
    let b = bus.clone();
    assignments.on_change(Box::new(move |project| {
        b.publish(ASSIGNMENTS_SUBJECT.into(), &project.to_be_bytes());
    }));
    let mut changes = bus.subscribe(ASSIGNMENTS_SUBJECT).await?;
    let a = Arc::downgrade(assignments);
    tokio::spawn(async move {
        while let Some(m) = changes.next().await {
            let (Some(a), Some(p)) = (a.upgrade(), id_of(&m)) else {
                break;
            };
            a.changed_elsewhere(p);
        }
    });
    let a = Arc::downgrade(assignments);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(ASSIGNMENTS_REFRESH);
        loop {
            every.tick().await;
            let Some(a) = a.upgrade() else { break };
            a.refresh_all();
        }
    });
    // An organization deleted on another node: its projects refused here within a second
    // even if the announcement was lost.
    let s = store.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            every.tick().await;
            let s = s.clone();
            let _ = tokio::task::spawn_blocking(move || s.refresh_retired()).await;
        }
    });
    let mut starts = bus.subscribe(controller::SUBJECT).await?;
    let controllers = controllers.clone();
    tokio::spawn(async move {
        while let Some(m) = starts.next().await {
            if let Some(id) = id_of(&m) {
                controller::start(&controllers, id).await;
            }
        }
    });
    Ok(())
}

/// The bus subject on which a node announces that it wrote a cached record.
pub(super) const CACHES_SUBJECT: &str = "fleetops.caches";
