use super::super::search::{query, query_scan};
use crate::views::LogPage;

use super::*;
use fleetops_storage::{LogChunk, SessionCounters};

#[test]
fn csv_cells_that_a_spreadsheet_would_run_are_quoted() {
    for (cell, out) in [
        ("=1+1", "'=1+1"),
        ("+cmd", "'+cmd"),
        ("-2", "'-2"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("motor =hot", "motor =hot"),
        ("", ""),
    ] {
        assert_eq!(&*csv_cell(cell.as_bytes()), out.as_bytes(), "{cell:?}");
    }
    assert!(matches!(csv_cell(b"plain"), std::borrow::Cow::Borrowed(_)));
}

/// The merge emits exactly what a full sort of every match would, in the same order,
/// with chunks in and out of time order, overlapping, and tied timestamps.
#[test]
fn the_merge_matches_a_full_sort() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut x: u64 = 9;
    let mut rand = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut all = Vec::new();
    for seq in 1..=60u64 {
        let mut c = LogChunk::default();
        // Mostly advancing time, some chunks reaching far back or spanning widely.
        let base = seq as i64 * 100 - if seq % 7 == 0 { 3000 } else { 0 };
        for i in 0..(1 + rand(40)) {
            let ts = base + rand(if seq % 11 == 0 { 5000 } else { 150 }) as i64;
            let level = rand(4) as u8;
            c.push(ts, level, 0, &format!("m{seq}-{i}"), b"{}").unwrap();
            all.push((ts, seq, i as u32, level));
        }
        c.modules.push("core".into());
        store
            .append_chunk(7, &c, &SessionCounters::default(), seq)
            .unwrap();
    }
    // A tie where a chunk opened early (62, from 5) meets one not yet open (61, from
    // 1,000,000) at the latter's first timestamp: the lower chunk number goes first.
    for (seq, stamps) in [(61u64, vec![1_000_000i64]), (62, vec![5, 1_000_000])] {
        let mut c = LogChunk::default();
        for (i, ts) in stamps.into_iter().enumerate() {
            c.push(ts, 1, 0, &format!("m{seq}-{i}"), b"{}").unwrap();
            all.push((ts, seq, i as u32, 1));
        }
        c.modules.push("core".into());
        store
            .append_chunk(7, &c, &SessionCounters::default(), seq)
            .unwrap();
    }
    for f in [
        LogFilter::default(),
        LogFilter {
            levels: 1 << 2 | 1 << 3,
            since: Some(1500),
            until: Some(4000),
            ..LogFilter::default()
        },
    ] {
        let mut want: Vec<(i64, u64, u32)> = all
            .iter()
            .filter(|(ts, _, _, lv)| {
                (f.levels == 0 || f.levels & (1 << lv) != 0)
                    && f.since.is_none_or(|s| *ts >= s)
                    && f.until.is_none_or(|u| *ts < u)
            })
            .map(|&(ts, seq, i, _)| (ts, seq, i))
            .collect();
        want.sort_unstable();
        let mut got = Vec::new();
        merged(&store, 7, &f, |chunk, i| {
            let msg = chunk.message(i).unwrap();
            let (seq, idx) = msg[1..].split_once('-').unwrap();
            got.push((
                chunk.ts_at(i).unwrap(),
                seq.parse().unwrap(),
                idx.parse().unwrap(),
            ));
            Ok(true)
        })
        .unwrap();
        assert_eq!(got, want, "{f:?}");
    }
}

const MODULES: [&str; 3] = ["drive", "nav", "arm"];

/// A session of 6 to 45 random chunks (levels, modules, words, some clocks jumping back);
/// its entry count and every timestamp stored.
fn random_session(
    store: &Store,
    sid: u64,
    narrow: bool,
    rand: &mut impl FnMut(u64) -> u64,
) -> (u64, Vec<i64>) {
    let modules = MODULES;
    let mut count = 0u64;
    let mut stamps = Vec::new();
    for seq in 1..=(5 + rand(40)) {
        let mut c = LogChunk::default();
        let base = seq as i64 * 100 - if rand(5) == 0 { 2_000 } else { 0 };
        let used = 1 + rand(3) as usize;
        c.modules = modules[..used].iter().map(|m| m.to_string()).collect();
        for i in 0..(1 + rand(60)) {
            let span = if rand(9) == 0 { 4_000 } else { 150 };
            let ts = if narrow {
                rand(12) as i64
            } else {
                base + rand(span) as i64
            };
            stamps.push(ts);
            let word = ["motor", "tick", "Battery low", "stall", "Ställ ΟΔΟΣ"][rand(5) as usize];
            c.push(
                ts,
                rand(4) as u8,
                rand(used as u64) as u32,
                &format!("{word} {seq}-{i}"),
                b"{}",
            )
            .unwrap();
        }
        count += c.len() as u64;
        let counters = SessionCounters {
            log_count: count,
            next_chunk: seq + 1,
            ..SessionCounters::default()
        };
        store.append_chunk(sid, &c, &counters, seq).unwrap();
    }
    (count, stamps)
}

/// A random query: levels, a module, a search (frequent, absent, one line's own text),
/// time bounds on and off stored timestamps.
fn random_filter(stamps: &[i64], rand: &mut impl FnMut(u64) -> u64) -> LogFilter {
    let modules = MODULES;
    let bound = |r: &mut dyn FnMut(u64) -> u64| match r(3) {
        0 => None,
        1 => Some(r(5_000) as i64),
        _ => Some(stamps[r(stamps.len() as u64) as usize]),
    };
    let since = bound(&mut *rand);
    let until = bound(&mut *rand);
    LogFilter {
        levels: if rand(2) == 0 { 0 } else { rand(16) as u8 },
        module: (rand(2) == 0).then(|| modules[rand(4).min(2) as usize].to_string()),
        // Frequent words, absent ones, and one stored line's own text (found in one
        // chunk: what the text filters rule the others out for).
        search: (rand(3) == 0).then(|| {
            let seq = 1 + rand(45);
            let line = format!("{seq}-{} ", rand(30));
            [
                "motor".to_string(),
                "battery".into(),
                "nothing".into(),
                "ΟΔΟΣ".into(),
                "äll".into(),
                line.trim_end().into(),
                format!("y low {line}"),
            ][rand(7) as usize]
                .to_lowercase()
        }),
        since,
        until,
    }
}

/// Every answer to `f`: the page's (timestamp, message) and total, and the merge's order.
fn answer(
    store: &Store,
    sid: u64,
    f: &LogFilter,
    limit: usize,
    offset: usize,
) -> (usize, Vec<(String, String)>, Vec<String>) {
    let page = query(store, sid, f, limit, offset).unwrap();
    let mut all = Vec::new();
    merged(store, sid, f, |c, i| {
        all.push(c.message(i).unwrap().to_string());
        Ok(true)
    })
    .unwrap();
    (
        page.total,
        page.items
            .iter()
            .map(|e| (e.timestamp.clone(), e.message.clone()))
            .collect(),
        all,
    )
}

#[test]
fn sealed_chunks_answer_as_the_batches_did() {
    let mut x: u64 = 4242;
    let mut rand = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let (mut merges, mut offloaded) = (0, 0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for round in 0..12u64 {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("data")).unwrap();
        // Every other round seals into segments of a blob store, read back with a cache
        // that holds two chunks at most (most reads are fetches).
        if round % 2 == 1 {
            let blobs = BlobStore::local(&dir.path().join("blobs")).unwrap();
            store.attach_segments(blobs, rt.handle().clone(), 2_000);
        }
        let sid = 7;
        store
            .put_session(&fleetops_storage::Session {
                id: sid,
                project_id: 1,
                device_id: 1,
                device_name: "d".into(),
                status: fleetops_storage::SessionStatus::Active,
                started_at: 0,
                ended_at: None,
                tags: vec![],
                package_id: None,
            })
            .unwrap();
        let (_, stamps) = random_session(&store, sid, round % 3 == 0, &mut rand);
        let asks: Vec<(LogFilter, usize, usize)> = (0..40)
            .map(|_| {
                let f = random_filter(&stamps, &mut rand);
                (
                    f,
                    1 + rand(120) as usize,
                    rand(3) as usize * rand(50) as usize,
                )
            })
            .collect();
        let before: Vec<_> = asks
            .iter()
            .map(|(f, l, o)| answer(&store, sid, f, *l, *o))
            .collect();
        // Sealed in a few rounds of a random size, into chunks of a random size.
        let plan = fleetops_storage::sessions::seal::SealPlan {
            chunk_lines: 50 + rand(450) as usize,
            chunk_bytes: 1 << 20,
            max_source_bytes: 500 + rand(20_000) as usize,
            commit_wait: std::time::Duration::from_secs(1),
        };
        loop {
            let done = store.seal_logs(sid, plan).unwrap().unwrap();
            merges += done.sources - done.chunks;
            offloaded += usize::from(done.offloaded);
            if !done.more {
                break;
            }
        }
        for ((f, l, o), want) in asks.iter().zip(&before) {
            assert_eq!(
                &answer(&store, sid, f, *l, *o),
                want,
                "round {round}: {f:?} {plan:?}"
            );
        }
    }
    assert!(merges > 50, "{merges} batches merged");
    assert!(offloaded >= 6, "{offloaded} seals wrote segments");
}

/// The answer from summaries equals the answer from reading every chunk (the page, in
/// order, and `total`), over random sessions and random filters; a session whose
/// summaries do not account for every entry is answered by the full read, and an empty
/// one by neither.
#[test]
fn summaries_answer_as_a_full_scan_would() {
    let mut x: u64 = 77;
    let mut rand = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut ruled_out = 0;
    for round in 0..12u64 {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let sid = 7;
        // Some rounds on a narrow clock, so that equal timestamps across chunks are common.
        let (count, stamps) = random_session(&store, sid, round % 3 == 0, &mut rand);
        // The summary path is the one under test: the summaries account for every entry.
        let summarized: u64 = store
            .log_summaries(sid)
            .unwrap()
            .iter()
            .map(|(_, s)| s.len())
            .sum();
        assert_eq!(summarized, count);
        for _ in 0..60 {
            let f = random_filter(&stamps, &mut rand);
            let (limit, offset) = (1 + rand(120) as usize, rand(3) as usize * rand(50) as usize);
            if let Some(needle) = f.search.as_deref() {
                ruled_out += store.log_chunks_without(sid, needle).unwrap().len();
            }
            let got = query(&store, sid, &f, limit, offset).unwrap();
            let want = query_scan(&store, sid, &f, limit, offset).unwrap();
            let key = |p: &LogPage| {
                p.items
                    .iter()
                    .map(|e| (e.timestamp.clone(), e.message.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(got.total, want.total, "round {round}: {f:?}");
            // The exports' merge (which the text filters prune too) yields every match
            // in the same order.
            let mut merged_all = Vec::new();
            merged(&store, sid, &f, |c, i| {
                merged_all.push((c.ts_at(i).unwrap(), c.message(i).unwrap().to_string()));
                Ok(true)
            })
            .unwrap();
            let every = query_scan(&store, sid, &f, 1 << 20, 0).unwrap();
            assert_eq!(merged_all.len(), every.total, "round {round}: {f:?}");
            let msgs: Vec<&str> = merged_all.iter().map(|m| m.1.as_str()).collect();
            let want_msgs: Vec<&str> = every.items.iter().map(|e| e.message.as_str()).collect();
            assert_eq!(msgs, want_msgs, "round {round}: {f:?}");
            assert_eq!(
                key(&got),
                key(&want),
                "round {round}: {f:?} {limit} {offset}"
            );
        }
    }
    // The text filters took part: they ruled chunks out, and no answer changed.
    assert!(ruled_out > 100, "{ruled_out} chunks ruled out");
}

#[test]
fn an_empty_session_and_one_without_whole_summaries() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let f = LogFilter::default();
    let p = query(&store, 9, &f, 10, 0).unwrap();
    assert_eq!((p.total, p.items.len()), (0, 0));
    // Counters that claim more than the summaries hold (as for chunks stored before
    // summaries existed): the full read answers, and answers the same.
    let mut c = LogChunk::default();
    c.modules.push("core".into());
    for i in 0..5 {
        c.push(100 - i, 1, 0, &format!("m{i}"), b"{}").unwrap();
    }
    let counters = SessionCounters {
        log_count: 6,
        ..SessionCounters::default()
    };
    store.append_chunk(9, &c, &counters, 1).unwrap();
    let p = query(&store, 9, &f, 2, 1).unwrap();
    let want = query_scan(&store, 9, &f, 2, 1).unwrap();
    assert_eq!(p.total, 5);
    let msgs: Vec<&str> = p.items.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(msgs, ["m3", "m2"]);
    assert_eq!(want.total, 5);
}
