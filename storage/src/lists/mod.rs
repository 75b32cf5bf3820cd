//! List indexes: every listed record keeps entries in the order its list is served, and a
//! counter per list, written in the same atomic batch as the record. A page reads only its
//! entries (skipping earlier ones by key, without decoding them) and the counter, so page 1
//! costs the same with ten records or a million.
//!
//! A record family says which lists it belongs to ([`Listed::entries`]); [`Writes`] carries
//! the record changes, and [`Store::apply`] computes, under one lock, what each change adds
//! to and removes from the lists, so the counters stay exact whoever writes.
//!
//! Layout: `v1/ls/{list}{order}{id}` → an optional small value (a device's last-seen time,
//! so a status filter walks entries without decoding records); `v1/lc/{list}` → the count.
//! A list id is self-delimiting (a tag, then fixed-width ids or length-prefixed strings), so
//! no list's entries fall inside another's range.

use std::collections::BTreeMap;

use crate::{Result, StorageError, Store, keys};

/// A list's identity: its tag and the filter values it is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ListId(Vec<u8>);

impl ListId {
    pub(crate) fn new(tag: &str) -> Self {
        let mut v = vec![tag.len() as u8];
        v.extend_from_slice(tag.as_bytes());
        Self(v)
    }
    pub(crate) fn id(mut self, x: u64) -> Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    pub(crate) fn str(mut self, s: &str) -> Self {
        self.0.extend_from_slice(&(s.len() as u32).to_be_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn entries_prefix(&self) -> Vec<u8> {
        let mut k = keys::V.to_vec();
        k.extend_from_slice(b"ls/");
        k.extend_from_slice(&self.0);
        k
    }
    fn entry_key(&self, order: u64, id: u64) -> Vec<u8> {
        let mut k = self.entries_prefix();
        k.extend_from_slice(&order.to_be_bytes());
        k.extend_from_slice(&id.to_be_bytes());
        k
    }
    fn counter_key(&self) -> Vec<u8> {
        let mut k = keys::V.to_vec();
        k.extend_from_slice(b"lc/");
        k.extend_from_slice(&self.0);
        k
    }
}

/// One membership of a record: in `list` at (`order`, `id`), carrying `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub list: ListId,
    pub order: u64,
    pub id: u64,
    pub value: Vec<u8>,
}

impl Entry {
    pub(crate) fn at(list: ListId, order: u64, id: u64) -> Self {
        Self {
            list,
            order,
            id,
            value: Vec::new(),
        }
    }
    pub(crate) fn with_value(mut self, value: Vec<u8>) -> Self {
        self.value = value;
        self
    }
}

/// A record family kept in lists.
pub(crate) trait Listed: serde::de::DeserializeOwned {
    fn entries(&self) -> Vec<Entry>;
}

/// A record change whose list entries `apply` works out: the record's key, its new entries
/// (`None`: deleted) and how to read the entries of what is stored there now.
#[derive(Clone)]
pub(crate) struct Relist {
    pub key: Vec<u8>,
    pub new: Option<Vec<Entry>>,
    pub old: fn(&[u8]) -> Result<Vec<Entry>>,
}

pub(crate) fn old_entries<T: Listed>(bytes: &[u8]) -> Result<Vec<Entry>> {
    Ok(crate::codec::decode::<T>(bytes)?.entries())
}

/// A key to set (`Some`) or remove (`None`).
pub(crate) type KeyWrite = (Vec<u8>, Option<Vec<u8>>);

/// The extra key writes (`None`: remove) that bring the lists in step with `changes`.
/// The caller holds the list lock from here until its batch is applied.
pub(crate) fn plan(store: &Store, changes: &[Relist]) -> Result<Vec<KeyWrite>> {
    plan_by(changes, |k| store.inner.records.get(k))
}

/// As [`plan`], reading the records and counters through `read` (a transaction's view).
pub(crate) fn plan_by<E: From<StorageError>>(
    changes: &[Relist],
    read: impl Fn(&[u8]) -> std::result::Result<Option<crate::engine::Bytes>, E>,
) -> std::result::Result<Vec<KeyWrite>, E> {
    let counter = |k: &[u8]| -> std::result::Result<u64, E> {
        Ok(read(k)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0))
    };
    let mut out = Vec::new();
    let mut deltas: BTreeMap<ListId, i64> = BTreeMap::new();
    // A record changed twice in one batch: the second change starts from the first.
    let mut current: BTreeMap<&[u8], Vec<Entry>> = BTreeMap::new();
    for c in changes {
        let old = match current.remove(c.key.as_slice()) {
            Some(e) => e,
            None => match read(&c.key)? {
                Some(v) => (c.old)(&v)?,
                None => Vec::new(),
            },
        };
        let new = c.new.clone().unwrap_or_default();
        for e in old.iter().filter(|e| !new.contains(e)) {
            out.push((e.list.entry_key(e.order, e.id), None));
            *deltas.entry(e.list.clone()).or_default() -= 1;
        }
        for e in new.iter().filter(|e| !old.contains(e)) {
            out.push((e.list.entry_key(e.order, e.id), Some(e.value.clone())));
            *deltas.entry(e.list.clone()).or_default() += 1;
        }
        current.insert(c.key.as_slice(), new);
    }
    for (list, d) in deltas.into_iter().filter(|(_, d)| *d != 0) {
        let k = list.counter_key();
        let n = counter(&k)?.saturating_add_signed(d);
        out.push((k, (n > 0).then(|| n.to_be_bytes().to_vec())));
    }
    // In the order made: each change's removals before its inserts, changes in batch order
    // (a sled batch keeps the last write of a key), so an entry re-added with a new value,
    // or dropped by a later change of the same record, ends as the last change says.
    Ok(out)
}

/// One entry read back: its record's id and its value.
pub(crate) struct Hit {
    pub id: u64,
    pub value: crate::engine::Bytes,
}

impl Store {
    fn counter(&self, k: &[u8]) -> Result<u64> {
        Ok(self
            .inner
            .records
            .get(k)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes)
            .unwrap_or(0))
    }

    /// How many records the list holds (one read).
    pub(crate) fn list_len(&self, list: &ListId) -> Result<u64> {
        self.counter(&list.counter_key())
    }

    /// The lists `prefix` + `be(x)` for every `x >= from` (time buckets), with their counts.
    pub(crate) fn bucket_counts(&self, prefix: &ListId, from: u64) -> Result<Vec<(u64, u64)>> {
        let base = prefix.counter_key();
        let mut start = base.clone();
        start.extend_from_slice(&from.to_be_bytes());
        let mut out = Vec::new();
        for kv in self.inner.records.range(start..) {
            let (k, v) = kv?;
            if !k.starts_with(&base) {
                break;
            }
            let x = k
                .get(base.len()..base.len() + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes);
            let n = <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            if let Some(x) = x {
                out.push((x, n));
            }
        }
        Ok(out)
    }

    /// The ids of up to `limit` entries of the list with order `lo` or above, lowest first.
    pub(crate) fn list_ids_from(&self, list: &ListId, lo: u64, limit: usize) -> Result<Vec<u64>> {
        let prefix = list.entries_prefix();
        let n = prefix.len();
        let mut out = Vec::new();
        for kv in self.inner.records.range(list.entry_key(lo, 0)..) {
            if out.len() >= limit {
                break;
            }
            let (k, _) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            if let Some(id) = k
                .get(n + 8..n + 16)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
            {
                out.push(u64::from_be_bytes(id));
            }
        }
        Ok(out)
    }

    /// The list's entries with order in `[lo, hi)`, highest first.
    pub(crate) fn list_rev(
        &self,
        list: &ListId,
        lo: u64,
        hi: Option<u64>,
    ) -> impl Iterator<Item = Result<Hit>> + use<> {
        let prefix = list.entries_prefix();
        let start = list.entry_key(lo, 0);
        let end = match hi {
            Some(h) => list.entry_key(h, 0),
            None => {
                let mut e = prefix.clone();
                e.extend_from_slice(&[0xff; 17]);
                e
            }
        };
        let n = prefix.len();
        self.inner.records.range(start..end).rev().map(move |kv| {
            let (k, value) = kv?;
            let field = |i: usize| {
                k.get(n + i * 8..n + i * 8 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
                    .unwrap_or(0)
            };
            Ok(Hit {
                id: field(1),
                value,
            })
        })
    }

    /// Every list entry and counter rebuilt from the records (a store written before lists
    /// existed, or a check). Returns how many records were listed.
    pub(crate) fn rebuild_lists(&self, families: &[crate::Family]) -> Result<u64> {
        let gate = self.inner.gate.shared();
        let _g = self.list_guard();
        // Also the project delivery index that the lists replaced.
        let mut old_delivery_index = keys::V.to_vec();
        old_delivery_index.extend_from_slice(b"wdp/");
        for prefix in [
            list_entries_root(),
            list_counters_root(),
            old_delivery_index,
        ] {
            let mut b = crate::engine::Batch::default();
            for (n, k) in self.inner.records.scan_prefix(&prefix).keys().enumerate() {
                b.remove(k?);
                if n % 100_000 == 99_999 {
                    self.inner
                        .records
                        .apply_batch_held(std::mem::take(&mut b), &gate)?;
                }
            }
            self.inner.records.apply_batch_held(b, &gate)?;
        }
        let mut counts: BTreeMap<ListId, u64> = BTreeMap::new();
        let mut listed = 0;
        let mut pending = 0usize;
        for (prefix, entries) in families {
            let mut b = crate::engine::Batch::default();
            for kv in self.inner.records.scan_prefix(prefix) {
                let (_, v) = kv?;
                listed += 1;
                for e in entries(&v)? {
                    b.insert(e.list.entry_key(e.order, e.id), e.value.clone());
                    *counts.entry(e.list).or_default() += 1;
                    pending += 1;
                }
                // In pieces: a million records are not one batch in memory.
                if pending >= 100_000 {
                    self.inner
                        .records
                        .apply_batch_held(std::mem::take(&mut b), &gate)?;
                    pending = 0;
                }
            }
            self.inner.records.apply_batch_held(b, &gate)?;
        }
        let mut b = crate::engine::Batch::default();
        for (list, n) in counts {
            b.insert(list.counter_key(), n.to_be_bytes().to_vec());
        }
        self.inner.records.apply_batch_held(b, &gate)?;
        Ok(listed)
    }

    /// Lists compared with what the records say: the differences, for tests and checks.
    pub fn verify_lists(&self) -> Result<Vec<String>> {
        let _g = self.list_guard();
        let mut want_entries: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut want_counts: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for (prefix, entries) in crate::listed_families() {
            for kv in self.inner.records.scan_prefix(prefix) {
                let (_, v) = kv?;
                for e in entries(&v)? {
                    want_entries.insert(e.list.entry_key(e.order, e.id), e.value.clone());
                    *want_counts.entry(e.list.counter_key()).or_default() += 1;
                }
            }
        }
        let mut diffs = Vec::new();
        let mut have_entries = BTreeMap::new();
        for kv in self.inner.records.scan_prefix(list_entries_root()) {
            let (k, v) = kv?;
            have_entries.insert(k.to_vec(), v.to_vec());
        }
        if have_entries != want_entries {
            diffs.push(format!(
                "list entries: {} stored, {} expected",
                have_entries.len(),
                want_entries.len()
            ));
        }
        let mut have_counts = BTreeMap::new();
        for kv in self.inner.records.scan_prefix(list_counters_root()) {
            let (k, v) = kv?;
            let n = <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .unwrap_or(0);
            have_counts.insert(k.to_vec(), n);
        }
        for (k, n) in &want_counts {
            if have_counts.get(k) != Some(n) {
                diffs.push(format!(
                    "counter {}: {:?} stored, {n} expected",
                    String::from_utf8_lossy(k),
                    have_counts.get(k)
                ));
            }
        }
        for k in have_counts.keys().filter(|k| !want_counts.contains_key(*k)) {
            diffs.push(format!("counter {} is stale", String::from_utf8_lossy(k)));
        }
        Ok(diffs)
    }
}

fn list_entries_root() -> Vec<u8> {
    let mut k = keys::V.to_vec();
    k.extend_from_slice(b"ls/");
    k
}

fn list_counters_root() -> Vec<u8> {
    let mut k = keys::V.to_vec();
    k.extend_from_slice(b"lc/");
    k
}

/// A page of ids read from one list: the `skip` entries before it are stepped over by key.
pub(crate) fn page_ids(
    hits: impl Iterator<Item = Result<Hit>>,
    skip: usize,
    take: usize,
) -> Result<Vec<Hit>> {
    hits.skip(skip).take(take).collect()
}

/// How a page is chosen from lists: the list of exactly the records wanted, or, when
/// several filters combine, the smallest list that holds them all, walked and filtered.
pub(crate) struct Query<'a, T> {
    /// The lists each single filter selects (none: `all`).
    pub candidates: Vec<ListId>,
    pub all: ListId,
    /// Order range `[lo, hi)`.
    pub lo: u64,
    pub hi: Option<u64>,
    /// A filter no list serves (the chosen list is then walked and `keep` checked).
    pub unlisted: bool,
    /// The whole filter, checked when the chosen list is not exact.
    pub keep: &'a dyn Fn(&T) -> bool,
    /// The key of the record an entry names.
    pub key: &'a dyn Fn(u64) -> Vec<u8>,
}

/// Records a walked list reads at once (one round trip on a network database).
const WALK_CHUNK: usize = 64;

impl<T: serde::de::DeserializeOwned> Query<'_, T> {
    /// The records `skip..skip + take` in list order, and how many there are in all.
    /// Costs: one exact list without a range reads the counter and the page; a range counts
    /// the entries inside it by key; combined filters decode the smallest list's records.
    pub(crate) fn run(self, store: &Store, skip: usize, take: usize) -> Result<(Vec<T>, u64)> {
        let ranged = self.lo > 0 || self.hi.is_some();
        let (list, exact) = match self.candidates.len() {
            0 => (self.all.clone(), !self.unlisted),
            1 => (self.candidates[0].clone(), !self.unlisted),
            _ => {
                let mut best = (u64::MAX, self.all.clone());
                for l in &self.candidates {
                    let n = store.list_len(l)?;
                    if n < best.0 {
                        best = (n, l.clone());
                    }
                }
                (best.1, false)
            }
        };
        let hits = store.list_rev(&list, self.lo, self.hi);
        if exact && !ranged {
            let keys: Vec<Vec<u8>> = page_ids(hits, skip, take)?
                .iter()
                .map(|h| (self.key)(h.id))
                .collect();
            return Ok((store.get_many(&keys)?, store.list_len(&list)?));
        }
        let mut total = 0u64;
        if exact {
            // Counted by key; only the page's records are read.
            let mut page = Vec::new();
            for h in hits {
                let h = h?;
                if total as usize >= skip && page.len() < take {
                    page.push((self.key)(h.id));
                }
                total += 1;
            }
            return Ok((store.get_many(&page)?, total));
        }
        let mut items = Vec::new();
        let mut chunk = Vec::with_capacity(WALK_CHUNK);
        let mut hits = hits.peekable();
        while hits.peek().is_some() {
            chunk.clear();
            for h in hits.by_ref().take(WALK_CHUNK) {
                chunk.push((self.key)(h?.id));
            }
            for r in store.get_many::<T>(&chunk)? {
                if !(self.keep)(&r) {
                    continue;
                }
                if total as usize >= skip && items.len() < take {
                    items.push(r);
                }
                total += 1;
            }
        }
        Ok((items, total))
    }
}

#[cfg(test)]
mod tests {
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
}
