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
mod tests;
