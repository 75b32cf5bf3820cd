use std::collections::BTreeMap;

use crate::testing::on_each_engine;

use crate::devices::DeviceQuery;
use crate::sessions::SessionQuery;
use crate::{Device, Session, SessionStatus, Store, keys};

fn device(id: u64, name: &str, seen: Option<i64>) -> Device {
    Device {
        id,
        project_id: 7,
        name: name.into(),
        labels: BTreeMap::new(),
        token_hash: [id as u8; 32],
        created_at: id as i64,
        last_seen_at: seen,
        metrics: BTreeMap::new(),
    }
}

/// A small deterministic generator, so a failure replays.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn device_pages_and_counts_match_a_scan_after_random_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    let mut rng = Lcg(42);
    let mut live: BTreeMap<u64, Device> = BTreeMap::new();
    for step in 0..3000u64 {
        match rng.next(10) {
            0..=3 => {
                let d = device(step + 1, ["a", "b", "c"][rng.next(3) as usize], None);
                store.insert_device(&d).unwrap();
                live.insert(d.id, d);
            }
            4..=7 => {
                if let Some(id) = live
                    .keys()
                    .nth(rng.next(live.len().max(1) as u64) as usize)
                    .copied()
                    && let Some(d) = live.get_mut(&id)
                {
                    // Heartbeats at times spread over 20 s, some in the same second.
                    d.last_seen_at = Some(1_000_000 + rng.next(20_000) as i64);
                    store.heartbeat_device(d, false).unwrap();
                }
            }
            8 => {
                if let Some(id) = live
                    .keys()
                    .nth(rng.next(live.len().max(1) as u64) as usize)
                    .copied()
                    && let Some(d) = live.get_mut(&id)
                {
                    d.name = "b".into();
                    store.update_device(d).unwrap();
                }
            }
            _ => {
                if let Some(id) = live
                    .keys()
                    .nth(rng.next(live.len().max(1) as u64) as usize)
                    .copied()
                    && let Some(d) = live.remove(&id)
                {
                    store.delete_device(&d, &[]).unwrap();
                }
            }
        }
    }
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    for since in [1_000_000, 1_004_500, 1_010_999, 1_019_000, 1_030_000] {
        for online in [true, false] {
            for name in [None, Some("b")] {
                let want: Vec<u64> = live
                    .values()
                    .rev()
                    .filter(|d| name.is_none_or(|n| d.name == n))
                    .filter(|d| d.last_seen_at.is_some_and(|t| t >= since) == online)
                    .map(|d| d.id)
                    .collect();
                let q = DeviceQuery {
                    name,
                    presence: Some((online, since)),
                };
                let (ids, total) = store.device_ids(7, q, 25).unwrap();
                assert_eq!(total as usize, want.len(), "{q:?}");
                assert_eq!(
                    ids,
                    want.iter().take(25).copied().collect::<Vec<_>>(),
                    "{q:?}"
                );
                let (page, _) = store.devices_page(7, q, 10, 5).unwrap();
                let ids: Vec<u64> = page.iter().map(|d| d.id).collect();
                assert_eq!(
                    ids,
                    want.iter().skip(10).take(5).copied().collect::<Vec<_>>()
                );
            }
        }
    }
    assert_eq!(store.device_count(7).unwrap() as usize, live.len());
}
on_each_engine!(device_pages_and_counts_match_a_scan_after_random_changes);

fn session_pages_follow_start_time_and_ranges_count_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    let mut rng = Lcg(7);
    let mut all = Vec::new();
    for id in 1..=500u64 {
        let mut s = Session {
            id,
            project_id: 3,
            device_id: 1 + rng.next(4),
            device_name: "d".into(),
            status: SessionStatus::Active,
            // Some before 1970 (they sort as 1970): such keys once broke reverse scans.
            started_at: (rng.next(1000) as i64 - 200).max(0) + i64::from(id % 50 == 0) * -5,
            ended_at: None,
            tags: Vec::new(),
            package_id: None,
        };
        store.put_session(&s).unwrap();
        if rng.next(2) == 0 {
            s.status = SessionStatus::Completed;
            store.put_session(&s).unwrap();
        }
        all.push(s);
    }
    for s in all.iter().filter(|s| s.id % 7 == 0) {
        store.delete_session(s).unwrap();
    }
    all.retain(|s| s.id % 7 != 0);
    let start = |s: &Session| s.started_at.max(0);
    all.sort_by(|a, b| start(b).cmp(&start(a)).then(b.id.cmp(&a.id)));
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    let qs = [
        SessionQuery::default(),
        SessionQuery {
            device: Some(2),
            ..Default::default()
        },
        SessionQuery {
            status: Some(SessionStatus::Completed),
            ..Default::default()
        },
        SessionQuery {
            device: Some(3),
            status: Some(SessionStatus::Active),
            since: Some(-50),
            until: Some(600),
        },
        SessionQuery {
            since: Some(0),
            ..Default::default()
        },
    ];
    for q in qs {
        let want: Vec<u64> = all
            .iter()
            .filter(|s| q.device.is_none_or(|d| s.device_id == d))
            .filter(|s| q.status.is_none_or(|st| s.status == st))
            .filter(|s| q.since.is_none_or(|t| start(s) >= t.max(0)))
            .filter(|s| q.until.is_none_or(|t| start(s) < t.max(0)))
            .map(|s| s.id)
            .collect();
        let (page, total) = store.sessions_page(3, q, 5, 20).unwrap();
        assert_eq!(total as usize, want.len(), "{q:?}");
        let ids: Vec<u64> = page.iter().map(|s| s.id).collect();
        assert_eq!(
            ids,
            want.iter().skip(5).take(20).copied().collect::<Vec<_>>(),
            "{q:?}"
        );
    }
}
on_each_engine!(session_pages_follow_start_time_and_ranges_count_exactly);

/// A record changed twice in one batch ends in the lists as the last change says.
fn two_changes_of_a_record_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    store.insert_device(&device(1, "a", None)).unwrap();
    let mut w = crate::Writes::new();
    w.put_listed(keys::device(7, 1), &device(1, "b", Some(5_000)))
        .unwrap();
    w.put_listed(keys::device(7, 1), &device(1, "c", None))
        .unwrap();
    store.apply(w).unwrap();
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    let q = |name| DeviceQuery {
        name: Some(name),
        presence: None,
    };
    assert_eq!(store.device_ids(7, q("b"), 10).unwrap(), (vec![], 0));
    assert_eq!(store.device_ids(7, q("c"), 10).unwrap(), (vec![1], 1));
}
on_each_engine!(two_changes_of_a_record_in_one_batch);

fn a_store_without_lists_is_indexed_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = crate::testing::open(dir.path());
        for id in 1..=50 {
            store.insert_device(&device(id, "x", Some(5_000))).unwrap();
        }
        // As a store written before lists existed.
        let mut b = crate::engine::Batch::default();
        for root in [
            crate::lists::list_entries_root(),
            crate::lists::list_counters_root(),
        ] {
            for k in store.inner.records.scan_prefix(root).keys() {
                b.remove(k.unwrap());
            }
        }
        store.inner.records.apply_batch(b).unwrap();
        store.inner.meta.remove("lists-format").unwrap();
        assert_eq!(store.device_count(7).unwrap(), 0);
        store.flush_blocking().unwrap();
    }
    let store = Store::reopen(dir.path());
    assert_eq!(store.device_count(7).unwrap(), 50);
    assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    assert!(
        store
            .inner
            .records
            .get(keys::device(7, 50))
            .unwrap()
            .is_some()
    );
}
on_each_engine!(a_store_without_lists_is_indexed_when_opened);
