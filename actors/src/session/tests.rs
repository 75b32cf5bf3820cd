#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleetops_storage::Session;

use super::*;
use crate::logs::{RawEntry, build_chunk};
use crate::mailbox::ask;

const SID: u64 = 5;

fn batch(tag: &str, n: usize) -> Arc<LogChunk> {
    let entries = (0..n)
        .map(|i| RawEntry {
            timestamp: None,
            level: "info".into(),
            module: Some("nav".into()),
            message: format!("{tag}-{i}"),
            metadata: None,
        })
        .collect();
    Arc::new(build_chunk(entries).unwrap())
}

fn index(tag: &str, n: usize) -> Arc<ChunkIndex> {
    Arc::new(ChunkIndex::of(&batch(tag, n)).unwrap())
}

async fn spawn(store: &Store) -> ActorRef<Envelope<SessionMsg>> {
    let sealer = sealer::LogSealer::new(store.clone(), Default::default(), Arc::default());
    let ctx = (
        store.clone(),
        SessionsConfig::default(),
        Arc::default(),
        sealer,
        crate::bus::Bus::local(),
    );
    Actor::spawn(None, SessionActor, (ctx, SID))
        .await
        .unwrap()
        .0
}

/// A store holding session `SID`, active (keep the directory while the store is used).
fn active_session() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store
        .put_session(&Session {
            id: SID,
            project_id: 1,
            device_id: 2,
            device_name: "r1".into(),
            status: SessionStatus::Active,
            started_at: 0,
            ended_at: None,
            tags: Vec::new(),
            package_id: None,
        })
        .unwrap();
    (dir, store)
}

/// The replay buffer is bounded in bytes as well as entries: a few large entries do not
/// stay, live or rebuilt from storage, past `buffer_bytes` (the newest batch always does).
#[tokio::test]
async fn the_replay_buffer_keeps_at_most_buffer_bytes() {
    let (_dir, store) = active_session();
    let cfg = SessionsConfig {
        buffer_bytes: 10_000,
        ..SessionsConfig::default()
    };
    let big = |tag: &str| {
        let entries = (0..2)
            .map(|i| RawEntry {
                timestamp: None,
                level: "info".into(),
                module: None,
                message: format!("{tag}-{i}-{}", "x".repeat(4_000)),
                metadata: None,
            })
            .collect();
        Arc::new(build_chunk(entries).unwrap())
    };
    let replayed = |a: ActorRef<Envelope<SessionMsg>>| async move {
        let sub = ask(&a, |reply| SessionMsg::Subscribe {
            replay: Replay::Last(100),
            filter: LogFilter::default(),
            reply,
        })
        .await
        .unwrap();
        a.stop(None);
        sub.replay
            .iter()
            .map(|f| String::from_utf8(f.to_vec()).unwrap())
            .map(|f| f.split("-x").next().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let start = |cfg: SessionsConfig| {
        let store = store.clone();
        async move {
            let sealer = sealer::LogSealer::new(store.clone(), Default::default(), Arc::default());
            Actor::spawn(
                None,
                SessionActor,
                (
                    (store, cfg, Arc::default(), sealer, crate::bus::Bus::local()),
                    SID,
                ),
            )
            .await
            .unwrap()
            .0
        }
    };
    let a = start(cfg.clone()).await;
    for tag in ["a", "b", "c"] {
        let chunk = big(tag);
        let idx = Arc::new(ChunkIndex::of(&chunk).unwrap());
        ask(&a, |r| {
            SessionMsg::Append(chunk.clone(), idx.clone(), None, r)
        })
        .await
        .unwrap();
    }
    // Each batch holds about 8 KB: only the newest fits in 10,000 bytes.
    let live = replayed(a).await;
    assert_eq!(live.len(), 2, "{live:?}");
    assert!(
        live[0].ends_with("c-0") && live[1].ends_with("c-1"),
        "{live:?}"
    );
    // Rebuilt from storage: the same bound.
    assert_eq!(replayed(start(cfg).await).await, live);
    // With the default bound, all three batches.
    assert_eq!(
        replayed(start(SessionsConfig::default()).await).await.len(),
        6
    );
}

#[tokio::test]
async fn appends_count_seal_refuses_and_a_replacement_rebuilds_from_storage() {
    let (_dir, store) = active_session();
    let a = spawn(&store).await;
    assert_eq!(
        ask(&a, |r| SessionMsg::Append(
            batch("a", 3),
            index("a", 3),
            None,
            r
        ))
        .await
        .unwrap(),
        Some(3)
    );
    assert_eq!(
        ask(&a, |r| SessionMsg::Append(
            batch("b", 2),
            index("b", 2),
            None,
            r
        ))
        .await
        .unwrap(),
        Some(2)
    );
    assert_eq!(store.session_counters(SID).unwrap().log_count, 5);

    // A replacement rebuilds its counters and replay buffer from storage.
    a.stop(None);
    let a = spawn(&store).await;
    let sub = ask(&a, |reply| SessionMsg::Subscribe {
        replay: Replay::Last(2),
        filter: LogFilter::default(),
        reply,
    })
    .await
    .unwrap();
    assert_eq!(sub.next_seq, 5);
    assert_eq!(sub.replay.len(), 2);
    let last = String::from_utf8(sub.replay[1].to_vec()).unwrap();
    assert!(last.contains("b-1"), "{last}");
    assert!(sub.feed.is_some() && sub.ended.is_none());

    // Sealed (completion under way): appends are refused, nothing more is counted.
    ask(&a, SessionMsg::Seal).await.unwrap();
    let r = ask(&a, |r| {
        SessionMsg::Append(batch("c", 1), index("c", 1), None, r)
    })
    .await;
    assert!(matches!(r, Err(Error::Conflict(_))));
    assert_eq!(store.session_counters(SID).unwrap().log_count, 5);
    // Two completions under way; one fails: still sealed, the other may yet write.
    ask(&a, SessionMsg::Seal).await.unwrap();
    a.cast(Envelope::cast(SessionMsg::Unseal)).unwrap();
    let r = ask(&a, |r| {
        SessionMsg::Append(batch("c", 1), index("c", 1), None, r)
    })
    .await;
    assert!(matches!(r, Err(Error::Conflict(_))));
    // The other fails too (the session is still active as stored): appends again.
    a.cast(Envelope::cast(SessionMsg::Unseal)).unwrap();
    let r = ask(&a, |r| {
        SessionMsg::Append(batch("c", 1), index("c", 1), None, r)
    })
    .await;
    assert_eq!(r.unwrap(), Some(1));
    assert_eq!(store.session_counters(SID).unwrap().log_count, 6);
    // A numbered batch is stored once: sent again, it is answered as a duplicate.
    let r = ask(&a, |r| {
        SessionMsg::Append(batch("d", 2), index("d", 2), Some(7), r)
    })
    .await;
    assert_eq!(r.unwrap(), Some(2));
    let r = ask(&a, |r| {
        SessionMsg::Append(batch("d", 2), index("d", 2), Some(7), r)
    })
    .await;
    assert_eq!(r.unwrap(), None);
    assert_eq!(store.session_counters(SID).unwrap().log_count, 8);
    a.stop(None);
}
