//! Seals on a temporary store: merged chunks keep every entry in arrival order with rebuilt
//! summaries and filters, a pinned session is not touched, a deleted one leaves no seal keys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::testing::on_each_engine;
use crate::{Session, SessionStatus};

const PLAN: SealPlan = SealPlan {
    chunk_lines: 100,
    chunk_bytes: 1 << 20,
    max_source_bytes: 1 << 30,
    commit_wait: Duration::from_millis(50),
};

fn session(store: &Store, id: u64) -> Session {
    let s = Session {
        id,
        project_id: 7,
        device_id: 1,
        device_name: "d".into(),
        status: SessionStatus::Active,
        started_at: 1,
        ended_at: None,
        tags: vec![],
        package_id: None,
    };
    store.put_session(&s).unwrap();
    s
}

/// Appends `batches` batches of `n` lines, numbered in arrival order across batches.
fn append(store: &Store, sid: u64, batches: u64, n: u64) {
    let mut counters = store.session_counters(sid).unwrap();
    for _ in 0..batches {
        let mut c = LogChunk::default();
        let mods = ["nav".to_string(), format!("m{}", counters.next_chunk % 3)];
        c.modules = mods.to_vec();
        for i in 0..n {
            let k = counters.log_count + i;
            c.push(
                1000 - k as i64,
                (k % 4) as u8,
                (k % 2) as u32,
                &format!("line {k:05}"),
                b"{}",
            )
            .unwrap();
        }
        let seq = counters.next_chunk;
        counters.log_count += n;
        counters.next_chunk += 1;
        store.append_chunk(sid, &c, &counters, seq).unwrap();
    }
}

/// Every (message, module, level, ts) in storage order.
fn lines(store: &Store, sid: u64) -> Vec<(String, String, u8, i64)> {
    let mut out = Vec::new();
    for item in store.log_chunks(sid) {
        let (_, c) = item.unwrap();
        for i in 0..c.len() {
            let m = c.module_name(c.module_at(i).unwrap()).unwrap().to_string();
            out.push((
                c.message(i).unwrap().into(),
                m,
                c.level_at(i).unwrap(),
                c.ts_at(i).unwrap(),
            ));
        }
    }
    out
}

fn sealing_merges_small_chunks_keeping_every_entry_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    session(&store, 3);
    append(&store, 3, 35, 10);
    let before = lines(&store, 3);
    assert_eq!(store.sessions_owed_seal(i64::MAX, 10).unwrap(), vec![3]);
    let done = store.seal_logs(3, PLAN).unwrap().unwrap();
    assert_eq!(
        done,
        Sealed {
            sources: 35,
            chunks: 4,
            lines: 350,
            more: false,
            offloaded: false,
        }
    );
    assert_eq!(lines(&store, 3), before);
    let summaries = store.log_summaries(3).unwrap();
    assert_eq!(
        summaries
            .iter()
            .map(|(seq, s)| (*seq, s.len()))
            .collect::<Vec<_>>(),
        vec![(0, 100), (10, 100), (20, 100), (30, 50)]
    );
    // The rebuilt filter rules out what the merged chunk lacks, and keeps what it holds.
    assert_eq!(
        store.log_chunks_without(3, "line 00349").unwrap(),
        vec![0, 10, 20]
    );
    assert!(store.log_chunk_may_hold(3, 10, "line 00150").unwrap());
    assert_eq!(store.log_seal_cursor(3).unwrap(), 35);
    assert!(store.sessions_owed_seal(i64::MAX, 10).unwrap().is_empty());
    // Later batches are sealed from the cursor on, never merged into sealed chunks.
    append(&store, 3, 3, 10);
    assert_eq!(store.sessions_owed_seal(i64::MAX, 10).unwrap(), vec![3]);
    let done = store.seal_logs(3, PLAN).unwrap().unwrap();
    assert_eq!((done.sources, done.chunks), (3, 1));
    assert_eq!(store.log_summaries(3).unwrap().len(), 5);
    assert_eq!(lines(&store, 3).len(), 380);
}
on_each_engine!(sealing_merges_small_chunks_keeping_every_entry_in_order);

fn an_append_decided_on_stale_counters_or_after_completion_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    session(&store, 3);
    let stale = store.session_counters(3).unwrap();
    // Another server appends first.
    append(&store, 3, 1, 10);
    let mut c = LogChunk {
        modules: vec!["nav".into()],
        ..LogChunk::default()
    };
    c.push(1, 1, 0, "late", b"{}").unwrap();
    let next = SessionCounters {
        log_count: stale.log_count + 1,
        next_chunk: stale.next_chunk + 1,
        ..stale
    };
    let index = crate::sessions::ChunkIndex::of(&c).unwrap();
    let r = store.append_indexed_chunk(7, 3, &c, &index, (&stale, &next), stale.next_chunk);
    assert!(matches!(r, Err(StorageError::Conflict(_))), "{r:?}");
    assert_eq!(lines(&store, 3).len(), 10);
    assert_eq!(store.session_counters(3).unwrap().log_count, 10);
    // Decided on what is stored now, it goes in after the other's batch.
    let now = store.session_counters(3).unwrap();
    let next = SessionCounters {
        log_count: now.log_count + 1,
        next_chunk: now.next_chunk + 1,
        ..now
    };
    store
        .append_indexed_chunk(7, 3, &c, &index, (&now, &next), now.next_chunk)
        .unwrap();
    assert_eq!(lines(&store, 3).last().unwrap().0, "late");
    // Completed by another server: refused, nothing written.
    let mut done = session(&store, 3);
    done.status = SessionStatus::Completed;
    store.put_session(&done).unwrap();
    let now = store.session_counters(3).unwrap();
    let next = SessionCounters {
        log_count: now.log_count + 1,
        next_chunk: now.next_chunk + 1,
        ..now
    };
    let r = store.append_indexed_chunk(7, 3, &c, &index, (&now, &next), now.next_chunk);
    assert!(
        matches!(&r, Err(StorageError::Conflict(w)) if w == crate::sessions::SESSION_NOT_ACTIVE),
        "{r:?}"
    );
    assert_eq!(lines(&store, 3).len(), 11);
}
on_each_engine!(
    an_append_decided_on_stale_counters_or_after_completion_is_refused_and_writes_nothing
);

fn a_seal_reads_at_most_its_source_budget_and_says_more_remain() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    session(&store, 3);
    append(&store, 3, 20, 10);
    let one = store.log_chunks(3).next().unwrap().unwrap().1;
    let size = codec::encode(&one).unwrap().len();
    let plan = SealPlan {
        max_source_bytes: size * 5,
        ..PLAN
    };
    let first = store.seal_logs(3, plan).unwrap().unwrap();
    assert_eq!((first.sources, first.more), (5, true));
    assert_eq!(store.sessions_owed_seal(i64::MAX, 10).unwrap(), vec![3]);
    let mut seals = 1;
    loop {
        seals += 1;
        if !store.seal_logs(3, plan).unwrap().unwrap().more {
            break;
        }
    }
    assert_eq!(seals, 4);
    assert_eq!(lines(&store, 3).len(), 200);
    assert!(store.sessions_owed_seal(i64::MAX, 10).unwrap().is_empty());
}
on_each_engine!(a_seal_reads_at_most_its_source_budget_and_says_more_remain);

fn a_pinned_session_is_not_sealed_until_its_reader_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    session(&store, 3);
    append(&store, 3, 4, 10);
    let pin = store.log_pin(3);
    assert_eq!(store.seal_logs(3, PLAN).unwrap(), Err(SealSkipped::Busy));
    assert_eq!(store.log_summaries(3).unwrap().len(), 4);
    drop(pin);
    assert_eq!(store.seal_logs(3, PLAN).unwrap().unwrap().chunks, 1);
}
on_each_engine!(a_pinned_session_is_not_sealed_until_its_reader_lets_go);

/// Servers sharing a database: a reader on one holds off the seals of the others.
#[test]
fn a_session_read_on_one_server_is_not_sealed_by_another_until_the_reader_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = crate::testing::two_servers(dir.path());
    let wait = Duration::from_millis(200);
    let pin = a.log_pin(7);
    assert!(b.seal_across(7, wait).unwrap().is_none());
    // Another session is not held.
    assert!(b.seal_across(8, wait).unwrap().is_some());
    drop(pin);
    let t = Instant::now();
    let sealing = loop {
        if let Some(s) = b.seal_across(7, wait).unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the pin was never let go"
        );
    };
    // A reader waits for the seal's commit to end.
    let reading = std::thread::spawn(move || {
        let _pin = a.log_pin(7);
        Instant::now()
    });
    std::thread::sleep(Duration::from_millis(300));
    let committed = Instant::now();
    drop(sealing);
    assert!(reading.join().unwrap() >= committed);
}

/// A store whose seals write segments to a local blob store under `dir/blobs`.
fn offloading(dir: &std::path::Path) -> (Store, tokio::runtime::Runtime) {
    let store = crate::testing::open(&dir.join("data"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let blobs = crate::BlobStore::local(&dir.join("blobs")).unwrap();
    store.attach_segments(blobs, rt.handle().clone(), 1 << 20);
    (store, rt)
}

fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn families(store: &Store) -> Vec<String> {
    store
        .key_snapshot()
        .unwrap()
        .iter()
        .map(|k| crate::purge::key_family(k))
        .collect()
}

#[test]
fn sealed_chunks_move_into_one_segment_and_read_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rt) = offloading(dir.path());
    session(&store, 3);
    append(&store, 3, 35, 10);
    let before = lines(&store, 3);
    let done = store.seal_logs(3, PLAN).unwrap().unwrap();
    assert!(done.offloaded);
    assert_eq!((done.sources, done.chunks), (35, 4));
    // Local disk holds the summaries, filters and locations; the chunks are in one segment.
    let fams = families(&store);
    assert_eq!(fams.iter().filter(|f| *f == "logs:l").count(), 0);
    assert_eq!(fams.iter().filter(|f| *f == "logs:lo").count(), 4);
    assert_eq!(fams.iter().filter(|f| *f == "logs:ls").count(), 4);
    let segs = files(&dir.path().join("blobs/logs"));
    assert_eq!(segs.len(), 1, "{segs:?}");
    let footer = crate::sessions::segments::footer(&std::fs::read(&segs[0]).unwrap()).unwrap();
    assert_eq!(
        footer.iter().map(|e| e.0).collect::<Vec<_>>(),
        vec![0, 10, 20, 30]
    );
    assert_eq!(store.segment_stats().segments_written, 1);
    // Read back cold: one ranged GET per chunk, then from the cache.
    store.clear_segment_cache();
    assert_eq!(lines(&store, 3), before);
    assert_eq!(store.segment_stats().fetches, 4);
    assert_eq!(lines(&store, 3), before);
    assert_eq!(store.segment_stats().fetches, 4);
    // Heads come from the locations, without a fetch.
    store.clear_segment_cache();
    assert_eq!(store.log_chunk_heads(3).unwrap().len(), 4);
    assert_eq!(store.segment_stats().fetches, 4);
    // Later batches append locally and are sealed into a segment of their own.
    append(&store, 3, 2, 10);
    assert_eq!(lines(&store, 3).len(), 370);
    assert!(store.seal_logs(3, PLAN).unwrap().unwrap().offloaded);
    assert_eq!(files(&dir.path().join("blobs/logs")).len(), 2);
    assert_eq!(lines(&store, 3).len(), 370);
}

#[test]
fn a_segment_whose_bytes_changed_is_an_error_not_a_wrong_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rt) = offloading(dir.path());
    session(&store, 3);
    append(&store, 3, 4, 10);
    store.seal_logs(3, PLAN).unwrap().unwrap();
    let seg = files(&dir.path().join("blobs/logs")).remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[20] ^= 0xff;
    std::fs::write(&seg, bytes).unwrap();
    store.clear_segment_cache();
    let err = store.log_chunks(3).next().unwrap().unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
}

#[test]
fn deleting_a_sealed_session_lists_its_segments_for_deletion_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _rt) = offloading(dir.path());
    let before = store.key_snapshot().unwrap();
    let s = session(&store, 3);
    append(&store, 3, 4, 10);
    store.seal_logs(3, PLAN).unwrap().unwrap();
    append(&store, 3, 4, 10);
    store.seal_logs(3, PLAN).unwrap().unwrap();
    append(&store, 3, 1, 10);
    let blobs = store.delete_session(&s).unwrap();
    assert_eq!(blobs.len(), 2);
    let doomed = store.doomed_segments(10).unwrap();
    assert_eq!(doomed.len(), 2);
    assert!(store.segments_referenced(3).unwrap().is_empty());
    assert!(store.segment_doomed(&doomed[0]).unwrap());
    assert!(!store.segment_doomed("logs/7/3/other.seg").unwrap());
    for k in &doomed {
        store.delete_doomed_segment(k).unwrap();
    }
    assert!(files(&dir.path().join("blobs/logs")).is_empty());
    let after = store.key_snapshot().unwrap();
    let left: Vec<_> = after
        .difference(&before)
        .map(|k| crate::purge::key_family(k))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

fn a_deleted_session_leaves_no_seal_keys_and_is_not_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    let before = store.key_snapshot().unwrap();
    let s = session(&store, 3);
    append(&store, 3, 4, 10);
    store.seal_logs(3, PLAN).unwrap().unwrap();
    append(&store, 3, 2, 10);
    store.delete_session(&s).unwrap();
    let after = store.key_snapshot().unwrap();
    let left: Vec<_> = after
        .difference(&before)
        .map(|k| crate::purge::key_family(k))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(store.seal_logs(3, PLAN).unwrap(), Err(SealSkipped::Gone));
}
on_each_engine!(a_deleted_session_leaves_no_seal_keys_and_is_not_sealed);
