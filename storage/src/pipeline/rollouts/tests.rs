#![allow(clippy::unwrap_used)]

use super::*;
use crate::testing::on_each_engine;
use crate::{Deployment, DeploymentStatus};

fn package(store: &Store, project: u64, id: u64) -> Deployment {
    let d = Deployment {
        id,
        project_id: project,
        name: format!("p{id}"),
        description: None,
        composition_tag: "t".into(),
        capsule_id: 1,
        configuration_id: None,
        status: DeploymentStatus::Active,
        deployed_at: None,
        deprecated_at: None,
        target_devices_json: b"[]".to_vec(),
        created_at: 0,
        updated_at: 0,
    };
    store.put_deployment(&d).unwrap();
    d
}

fn report(store: &Store, project: u64, deployment: u64, device: u64, at: i64, ok: bool) {
    let state = if ok {
        UpdateState::Succeeded
    } else {
        UpdateState::Failed
    };
    let p = DeviceProgress {
        deployment_id: deployment,
        device_id: device,
        state,
        message: None,
        at,
    };
    let r = DeviceResult {
        deployment_id: deployment,
        device_id: device,
        status: state.result().unwrap(),
        message: None,
        reported_at: at,
    };
    let replaced = store.device_result(deployment, device).unwrap();
    store
        .record_update(project, &p, Some(&r), replaced.as_ref(), None)
        .unwrap();
}

fn recent(store: &Store, project: u64, since: i64) -> Vec<(u64, u64, i64, RolloutStatus)> {
    store
        .recent_results(project, since)
        .unwrap()
        .into_iter()
        .map(|r| (r.deployment_id, r.device_id, r.reported_at, r.status))
        .collect()
}

/// The time index holds each result's latest report once, only its own project's, only
/// while its package exists, and is built at the first open after an upgrade for
/// results stored before it.
fn recent_results_come_from_the_time_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    // What every start does (on an empty store: nothing to index, the marker set).
    store.backfill_results_by_time().unwrap();
    let (a, b) = (package(&store, 1, 10), package(&store, 1, 11));
    package(&store, 2, 20);
    report(&store, 1, a.id, 100, 1_000, false);
    report(&store, 1, a.id, 101, 5_000, true);
    report(&store, 1, b.id, 100, 6_000, true);
    report(&store, 2, 20, 200, 7_000, false);
    // A later report replaces the device's result: its old time entry goes.
    report(&store, 1, a.id, 100, 8_000, true);
    use RolloutStatus::*;
    assert_eq!(
        recent(&store, 1, 0),
        [
            (a.id, 101, 5_000, Succeeded),
            (b.id, 100, 6_000, Succeeded),
            (a.id, 100, 8_000, Succeeded)
        ]
    );
    assert_eq!(
        recent(&store, 1, 6_000),
        [(b.id, 100, 6_000, Succeeded), (a.id, 100, 8_000, Succeeded)]
    );
    assert_eq!(recent(&store, 1, 8_001), []);
    assert_eq!(recent(&store, 2, 0), [(20, 200, 7_000, Failed)]);
    // Deleting a package takes its results' entries (counted as keys: a read skips an
    // entry whose result is gone).
    store.delete_deployment(&a).unwrap();
    let entries = |p| {
        store
            .inner
            .records
            .scan_prefix(keys::result_by_time_prefix(p))
            .count()
    };
    assert_eq!((entries(1), entries(2)), (1, 1));
    assert_eq!(recent(&store, 1, 0), [(b.id, 100, 6_000, Succeeded)]);

    // A store written before the index: the entries are built once, at the backfill.
    let mut gone = crate::engine::Batch::default();
    for k in store
        .inner
        .records
        .scan_prefix(keys::result_by_time_prefix(1))
        .keys()
    {
        gone.remove(k.unwrap());
    }
    store.inner.records.apply_batch(gone).unwrap();
    assert_eq!(recent(&store, 1, 0), []);
    store.backfill_results_by_time().unwrap();
    assert_eq!(recent(&store, 1, 0), [], "once per data directory");
    store.meta_remove("ix_results_by_time_v1").unwrap();
    store.backfill_results_by_time().unwrap();
    assert_eq!(recent(&store, 1, 0), [(b.id, 100, 6_000, Succeeded)]);
    assert_eq!(recent(&store, 2, 0), [(20, 200, 7_000, Failed)]);
}
on_each_engine!(recent_results_come_from_the_time_index);

/// A rollout stored in the layout before `accepted_before` and `late_owed` is read (the
/// failures before its last resume accepted), and written over under its guard.
fn a_rollout_of_the_earlier_layout_is_read_and_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    let d = |at, action: &str| Decision {
        at,
        phase: 0,
        action: action.into(),
        reason: String::new(),
    };
    let old = RolloutV1 {
        deployment_id: 7,
        project_id: 1,
        plan_json: b"{}".to_vec(),
        state: RolloutState::Running,
        phase: 0,
        started_at: Some(1_000),
        phase_started_at: 5_000,
        rolled_back_to: None,
        decisions: vec![d(1_000, "started"), d(3_000, "paused"), d(5_000, "resumed")],
        notice_owed: None,
    };
    let mut w = crate::engine::Batch::default();
    w.insert(keys::rollout(7), crate::codec::encode(&old).unwrap());
    store.inner.records.apply_batch(w).unwrap();
    let read = store.rollout(7).unwrap().unwrap();
    assert_eq!((read.accepted_before, read.late_owed), (5_000, false));
    assert_eq!(read.decisions.len(), 3);
    assert_eq!(store.open_rollouts().unwrap().len(), 1);
    let mut next = read.clone();
    next.late_owed = true;
    store.put_rollout(&next, &read, None).unwrap();
    assert_eq!(store.rollout(7).unwrap().unwrap(), next);
    // A write guarded on what is no longer stored is refused.
    assert!(matches!(
        store.put_rollout(&next, &read, None),
        Err(crate::StorageError::Conflict(_))
    ));
}
on_each_engine!(a_rollout_of_the_earlier_layout_is_read_and_written_over);
