//! The ProjectActor driven through its mailbox on a temporary store, with no HTTP: devices
//! and groups keep their invariants (members exist, a deleted device leaves its groups), a
//! heartbeat stamps the runtime's clock, and the actor restarted from storage sees it all.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::clock::{Clock, now_ms};
use crate::error::Error;
use crate::mailbox::ask;
use fleetops_storage::ValidationStatus;
use fleetops_storage::accounts::Seq;

async fn spawn(store: &Store, clock: &Clock, pid: u64) -> ActorRef<Envelope<ProjectMsg>> {
    let ctx = ProjectCtx {
        store: store.clone(),
        rollouts: Outbox::start(store.clone()),
        assignments: std::sync::Arc::new(crate::assignments::Assignments::new(16)),
        clock: clock.clone(),
        alerting: alerting::AlertingCtx {
            sealer: crate::secrets::Sealer::new(&[1; 32]).unwrap(),
            allow_private_targets: false,
            history_resolution_ms: 10_000,
            max_rules: 500,
            max_integrations_per_rule: 20,
        },
    };
    Actor::spawn(None, ProjectActor, (ctx, pid))
        .await
        .unwrap()
        .0
}

/// A store on a temporary directory holding one project; the directory lives as long as
/// the first element.
fn project_store() -> (tempfile::TempDir, Store, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let pid = store.new_id(Seq::Project).unwrap();
    store
        .insert_project(&Project {
            id: pid,
            org_id: 1,
            slug: "p".into(),
            name: "p".into(),
            secret_hash: [0; 32],
            created_at: 0,
        })
        .unwrap();
    (dir, store, pid)
}

#[tokio::test]
async fn devices_and_groups_keep_their_invariants_across_a_restart() {
    let (_dir, store, pid) = project_store();
    let clock = Clock::default();
    let a = spawn(&store, &clock, pid).await;
    let device = |name: &str| {
        let name = name.to_string();
        ask(&a, move |reply| {
            ProjectMsg::from(DevicesMsg::CreateDevice {
                name,
                labels: BTreeMap::new(),
                reply,
            })
        })
    };
    let (d1, token) = device("r1").await.unwrap();
    assert!(token.starts_with("fopsd_"));
    let (d2, _) = device("r2").await.unwrap();
    assert!(matches!(device("").await, Err(Error::Unprocessable(_))));

    // Members must exist; a deleted device leaves its groups.
    let bad = ask(&a, |reply| {
        ProjectMsg::from(DevicesMsg::CreateGroup {
            name: "g".into(),
            device_ids: vec![d1.id, 999],
            reply,
        })
    })
    .await;
    assert!(matches!(bad, Err(Error::Unprocessable(_))));
    let g = ask(&a, |reply| {
        ProjectMsg::from(DevicesMsg::CreateGroup {
            name: "g".into(),
            device_ids: vec![d2.id, d1.id, d1.id],
            reply,
        })
    })
    .await
    .unwrap();
    assert_eq!(g.device_ids, vec![d1.id, d2.id]);
    ask(&a, |reply| {
        ProjectMsg::from(DevicesMsg::DeleteDevice { id: d1.id, reply })
    })
    .await
    .unwrap();
    assert_eq!(
        store.group(pid, g.id).unwrap().unwrap().device_ids,
        vec![d2.id]
    );

    // A heartbeat stamps the runtime's clock.
    clock.advance(std::time::Duration::from_secs(3600));
    let before = clock.now_ms();
    ask(&a, |reply| {
        ProjectMsg::from(DevicesMsg::Heartbeat {
            id: d2.id,
            metrics: BTreeMap::from([("cpu".to_string(), 0.5)]),
            reply,
        })
    })
    .await
    .unwrap();
    let seen = store
        .device(pid, d2.id)
        .unwrap()
        .unwrap()
        .last_seen_at
        .unwrap();
    assert!(seen >= before && seen <= clock.now_ms());

    // A new incarnation, from storage: the same devices and group.
    a.stop(None);
    let a = spawn(&store, &clock, pid).await;
    let missing = ask(&a, |reply| {
        ProjectMsg::from(DevicesMsg::Heartbeat {
            id: d1.id,
            metrics: BTreeMap::new(),
            reply,
        })
    })
    .await;
    assert!(matches!(missing, Err(Error::NotFound(_))));
    let g = ask(&a, |reply| {
        ProjectMsg::from(DevicesMsg::UpdateGroup {
            id: g.id,
            name: Some("g2".into()),
            device_ids: None,
            reply,
        })
    })
    .await
    .unwrap();
    assert_eq!((g.name.as_str(), g.device_ids.clone()), ("g2", vec![d2.id]));
    a.stop(None);
}

fn capsule(name: &str, version: &str, deps: &[(&str, &str)], expires_at: i64) -> Capsule {
    let v = semver::Version::parse(version).unwrap();
    Capsule {
        id: 0,
        project_id: 0,
        name: name.into(),
        version: version.into(),
        version_major: v.major,
        version_minor: v.minor,
        version_patch: v.patch,
        description: None,
        capsule_type: "SW".into(),
        file_size_bytes: 10,
        metadata_json: b"{}".to_vec(),
        dependencies: deps
            .iter()
            .map(|(n, c)| (n.to_string(), c.to_string()))
            .collect(),
        is_latest: false,
        upload: fleetops_storage::UploadState::pending("tar.gz".into(), expires_at),
        created_at: 0,
        updated_at: 0,
    }
}

/// The pipeline half of the writer: a capsule's upload, verdict and `is_latest`, the
/// immutability of confirmed bytes, and the references that keep one from being deleted.
#[tokio::test]
async fn capsules_settle_move_latest_and_refuse_deletion_while_referred_to() {
    let (_dir, store, pid) = project_store();
    let clock = Clock::default();
    let a = spawn(&store, &clock, pid).await;
    let create = |c: Capsule| {
        ask(&a, move |reply| {
            ProjectMsg::from(PipelineMsg::CreateCapsule {
                capsule: Box::new(c),
                source: None,
                turn: crate::quota::Turn::detached(),
                reply,
            })
        })
    };
    let settle = |id: u64, passed: bool| {
        ask(&a, move |reply| {
            ProjectMsg::from(PipelineMsg::SettleCapsule {
                id,
                size: 10,
                checksum: "ab".repeat(32),
                passed,
                notes: "bad archive".into(),
                blob_key: None,
                reply,
            })
        })
    };
    let far = now_ms() + 3_600_000;
    let v1 = create(capsule("arm", "1.0.0", &[], far)).await.unwrap();
    assert!(matches!(
        create(capsule("arm", "1.0.0", &[], far)).await,
        Err(Error::Conflict(_))
    ));
    let v2 = create(capsule("arm", "1.1.0", &[], far)).await.unwrap();
    for id in [v1.id, v2.id] {
        ask(&a, |reply| {
            ProjectMsg::from(PipelineMsg::Uploaded {
                kind: UploadKind::Capsule,
                id,
                size: 10,
                reply,
            })
        })
        .await
        .unwrap();
    }

    // Only a passed version can be latest; the highest passed one is.
    let failed = settle(v2.id, false).await.unwrap();
    assert_eq!(
        (failed.upload.validation_status, failed.is_latest),
        (ValidationStatus::Failed, false)
    );
    assert_eq!(failed.upload.validation_notes, "bad archive");
    let passed = settle(v1.id, true).await.unwrap();
    assert!(passed.is_latest);
    let v3 = create(capsule("arm", "2.0.0", &[], far)).await.unwrap();
    settle(v3.id, true).await.unwrap();
    assert!(!store.capsule(pid, v1.id).unwrap().unwrap().is_latest);
    assert!(store.capsule(pid, v3.id).unwrap().unwrap().is_latest);

    // Confirmed bytes are immutable, and a verdict is given once.
    let again = ask(&a, |reply| {
        ProjectMsg::from(PipelineMsg::Uploaded {
            kind: UploadKind::Capsule,
            id: v1.id,
            size: 11,
            reply,
        })
    })
    .await;
    assert!(matches!(again, Err(Error::Conflict(_))));
    assert!(matches!(settle(v1.id, true).await, Err(Error::Conflict(_))));

    // A dependency is kept while a capsule depends on it; the housekeeper's delete
    // (`only_expired`) leaves a confirmed or unexpired record alone.
    let app = create(capsule("app", "1.0.0", &[("arm", "^2")], far))
        .await
        .unwrap();
    let delete = |id: u64, only_expired: bool| {
        ask(&a, move |reply| {
            ProjectMsg::from(PipelineMsg::DeleteUpload {
                kind: UploadKind::Capsule,
                id,
                only_expired,
                reply,
            })
        })
    };
    assert!(matches!(
        delete(v3.id, false).await,
        Err(Error::Conflict(_))
    ));
    assert_eq!(delete(v3.id, true).await.unwrap(), None);
    assert_eq!(delete(app.id, true).await.unwrap(), None);
    let expired = create(capsule("old", "1.0.0", &[], now_ms() - 1))
        .await
        .unwrap();
    assert_eq!(
        delete(expired.id, true).await.unwrap(),
        Some(expired.upload.blob_key.clone())
    );
    assert!(store.capsule(pid, expired.id).unwrap().is_none());

    // Deleting the latest moves `is_latest` back, and a new incarnation sees it.
    delete(app.id, false).await.unwrap();
    delete(v3.id, false).await.unwrap();
    a.stop(None);
    let a = spawn(&store, &clock, pid).await;
    assert!(store.capsule(pid, v1.id).unwrap().unwrap().is_latest);
    let gone = ask(&a, |reply| {
        ProjectMsg::from(PipelineMsg::SettleCapsule {
            id: v3.id,
            size: 10,
            checksum: String::new(),
            passed: true,
            notes: String::new(),
            blob_key: None,
            reply,
        })
    })
    .await;
    assert!(matches!(gone, Err(Error::NotFound(_))));
    a.stop(None);
}
