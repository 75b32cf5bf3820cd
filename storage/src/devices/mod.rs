//! Devices and device groups of a project.

pub mod enrollment;
pub mod records;

use std::sync::Arc;

use std::collections::BTreeMap;

use crate::lists::{Entry, ListId, Listed};
use crate::{Device, DeviceGroup, Result, Store, Writes, codec, keys};

fn all(project: u64) -> ListId {
    ListId::new("dv").id(project)
}
fn named(project: u64, name: &str) -> ListId {
    ListId::new("dvn").id(project).str(name)
}
/// By last-seen time (0: never seen), for the status filter's small side.
fn seen(project: u64) -> ListId {
    ListId::new("dvs").id(project)
}
/// One list per last-seen second, each newest device first: how many devices are online is a
/// sum of the offline window's counters, and a page of them a merge of those lists by id,
/// neither a walk over the devices.
fn seen_buckets(project: u64) -> ListId {
    ListId::new("dvb").id(project)
}

/// Past this many seconds in the offline window, online pages stop merging per-second lists
/// and walk instead (a window of hours).
const MAX_MERGED_SECONDS: usize = 1024;

impl Listed for Device {
    fn entries(&self) -> Vec<Entry> {
        let (p, id) = (self.project_id, self.id);
        let at = self.last_seen_at.map(|t| t.max(0) as u64);
        // The id-ordered lists carry the last-seen time, so a status filter reads no record.
        let v = at.unwrap_or(0).to_be_bytes().to_vec();
        let mut e = vec![
            Entry::at(all(p), id, id).with_value(v.clone()),
            Entry::at(named(p, &self.name), id, id).with_value(v.clone()),
            Entry::at(seen(p), at.unwrap_or(0), id),
        ];
        if let Some(t) = at {
            e.push(Entry::at(seen_buckets(p).id(t / 1000), id, id).with_value(v));
        }
        e
    }
}

/// Which devices a list shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceQuery<'a> {
    pub name: Option<&'a str>,
    /// `(online, since)`: online devices were seen at or after `since` (ms); offline ones
    /// were not.
    pub presence: Option<(bool, i64)>,
}

fn seen_at(v: &[u8]) -> u64 {
    <[u8; 8]>::try_from(v).map(u64::from_be_bytes).unwrap_or(0)
}

impl Store {
    /// How many of a project's devices were seen at or after `since` (ms).
    pub fn online_devices(&self, project: u64, since: i64) -> Result<u64> {
        let since = since.max(1) as u64;
        self.online_count(project, since, &self.online_seconds(project, since)?)
    }

    /// The last-seen seconds at or after `since`'s, with how many devices each holds.
    fn online_seconds(&self, project: u64, since: u64) -> Result<Vec<(u64, u64)>> {
        self.bucket_counts(&seen_buckets(project), since / 1000)
    }

    fn online_count(&self, project: u64, since: u64, seconds: &[(u64, u64)]) -> Result<u64> {
        let edge = since / 1000;
        let mut n = 0u64;
        for &(sec, count) in seconds {
            if sec > edge {
                n = n.saturating_add(count);
                continue;
            }
            // The second `since` falls in: only its devices seen at or after it.
            for h in self.list_rev(&seen_buckets(project).id(sec), 0, None) {
                if seen_at(&h?.value) >= since {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The first `n` online devices, newest first: a merge by id of the per-second lists of
    /// the offline window (the oldest second filtered by the exact time).
    fn online_ids(
        &self,
        project: u64,
        since: u64,
        seconds: &[(u64, u64)],
        n: usize,
    ) -> Result<Vec<u64>> {
        type Hits = Box<dyn Iterator<Item = Result<crate::lists::Hit>>>;
        let edge = since / 1000;
        let mut lists: Vec<Hits> = Vec::with_capacity(seconds.len());
        for &(sec, _) in seconds {
            let hits = self.list_rev(&seen_buckets(project).id(sec), 0, None);
            if sec > edge {
                lists.push(Box::new(hits));
            } else {
                lists.push(Box::new(hits.filter(move |h| {
                    h.as_ref().map_or(true, |h| seen_at(&h.value) >= since)
                })));
            }
        }
        let mut heads = std::collections::BinaryHeap::new();
        for (i, l) in lists.iter_mut().enumerate() {
            if let Some(h) = l.next() {
                heads.push((h?.id, i));
            }
        }
        let mut ids = Vec::with_capacity(n.min(4096));
        while ids.len() < n {
            let Some((id, i)) = heads.pop() else { break };
            ids.push(id);
            if let Some(h) = lists.get_mut(i).and_then(|l| l.next()) {
                heads.push((h?.id, i));
            }
        }
        Ok(ids)
    }

    /// The ids of the first `n` devices the query shows, newest first, and how many it
    /// shows in all.
    pub fn device_ids(
        &self,
        project: u64,
        q: DeviceQuery<'_>,
        n: usize,
    ) -> Result<(Vec<u64>, u64)> {
        let Some((online, since)) = q.presence else {
            let list = match q.name {
                Some(name) => named(project, name),
                None => all(project),
            };
            let ids = crate::lists::page_ids(self.list_rev(&list, 0, None), 0, n)?;
            return Ok((ids.iter().map(|h| h.id).collect(), self.list_len(&list)?));
        };
        let since = since.max(1) as u64;
        let matches = |v: &[u8]| {
            let at = seen_at(v);
            (at > 0 && at >= since) == online
        };
        if let Some(name) = q.name {
            // A name's devices are few: walk them all for the count.
            let (mut ids, mut total) = (Vec::new(), 0u64);
            for h in self.list_rev(&named(project, name), 0, None) {
                let h = h?;
                if matches(&h.value) {
                    if ids.len() < n {
                        ids.push(h.id);
                    }
                    total += 1;
                }
            }
            return Ok((ids, total));
        }
        let seconds = self.online_seconds(project, since)?;
        let on = self.online_count(project, since, &seconds)?;
        if online && seconds.len() <= MAX_MERGED_SECONDS {
            return Ok((self.online_ids(project, since, &seconds, n)?, on));
        }
        let everyone = self.list_len(&all(project))?;
        let total = if online {
            on
        } else {
            everyone.saturating_sub(on)
        };
        // The matching side read whole from the last-seen list and sorted, or the newest-first
        // list walked until the page is full (about `n × everyone / total` entries): whichever
        // is smaller, so neither costs more than about `sqrt(n × everyone)` entries.
        let small = ((n as f64) * (everyone as f64)).sqrt() as u64;
        let mut ids = Vec::new();
        if total <= small.max(1024) {
            let (lo, hi) = if online {
                (since, None)
            } else {
                (0, Some(since))
            };
            for h in self.list_rev(&seen(project), lo, hi) {
                ids.push(h?.id);
            }
            ids.sort_unstable_by(|a, b| b.cmp(a));
            ids.truncate(n);
        } else {
            for h in self.list_rev(&all(project), 0, None) {
                let h = h?;
                if matches(&h.value) {
                    ids.push(h.id);
                    if ids.len() >= n {
                        break;
                    }
                }
            }
        }
        Ok((ids, total))
    }

    /// A page of a project's devices, newest first, and how many the query shows in all.
    pub fn devices_page(
        &self,
        project: u64,
        q: DeviceQuery<'_>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<Device>, u64)> {
        let (ids, total) = self.device_ids(project, q, skip.saturating_add(take))?;
        let keys: Vec<Vec<u8>> = ids
            .into_iter()
            .skip(skip)
            .map(|id| keys::device(project, id))
            .collect();
        Ok((self.get_many(&keys)?, total))
    }

    /// How many devices a project has (one read).
    pub fn device_count(&self, project: u64) -> Result<u64> {
        self.list_len(&all(project))
    }
}

impl Store {
    pub fn device(&self, project: u64, id: u64) -> Result<Option<Device>> {
        self.get(&keys::device(project, id))
    }

    /// The devices at `(project, id)` each, in order (`None`: absent), in one read.
    pub fn devices_at(&self, at: &[(u64, u64)]) -> Result<Vec<Option<Device>>> {
        let keys: Vec<Vec<u8>> = at.iter().map(|(p, id)| keys::device(*p, *id)).collect();
        let mut out = Vec::with_capacity(at.len());
        for v in self.inner.records.get_many(&keys)? {
            out.push(v.map(|v| codec::decode(&v)).transpose()?);
        }
        Ok(out)
    }

    /// [`Store::device`] for a request's handler: awaited, never blocking a runtime thread
    /// on a network database.
    pub async fn device_async(&self, project: u64, id: u64) -> Result<Option<Device>> {
        self.get_async(&keys::device(project, id)).await
    }

    /// The (project, device) a device token belongs to.
    pub fn device_by_token(&self, hash: &[u8; 32]) -> Result<Option<Device>> {
        let Some(v) = self.inner.records.get(keys::device_by_token(hash))? else {
            return Ok(None);
        };
        match crate::webhooks::pair(&v) {
            Some((p, d)) => self.device(p, d),
            None => Ok(None),
        }
    }

    /// [`Store::device_by_token`] for a request's authentication: awaited.
    pub async fn device_by_token_async(&self, hash: &[u8; 32]) -> Result<Option<Device>> {
        let Some(v) = self
            .inner
            .records
            .get_async(&keys::device_by_token(hash))
            .await?
        else {
            return Ok(None);
        };
        match crate::webhooks::pair(&v) {
            Some((p, d)) => self.device_async(p, d).await,
            None => Ok(None),
        }
    }

    pub fn insert_device(&self, d: &Device) -> Result<()> {
        let mut w = Writes::new();
        w.put_listed(keys::device(d.project_id, d.id), d)?;
        let mut loc = d.project_id.to_be_bytes().to_vec();
        loc.extend_from_slice(&d.id.to_be_bytes());
        w.0.insert(keys::device_by_token(&d.token_hash), loc);
        self.apply(w)
    }

    /// Rewrites a device whose token did not change.
    pub fn update_device(&self, d: &Device) -> Result<()> {
        let mut w = Writes::new();
        w.put_listed(keys::device(d.project_id, d.id), d)?;
        self.apply(w)
    }

    /// Rewrites a device after a heartbeat and, when `sample`, keeps its metrics as one
    /// sample of its history, in the same write.
    pub fn heartbeat_device(&self, d: &Device, sample: bool) -> Result<()> {
        let mut w = Writes::new();
        w.put_listed(keys::device(d.project_id, d.id), d)?;
        if sample && let Some(at) = d.last_seen_at {
            let metrics: Vec<(&str, f64)> =
                d.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            w.put(keys::metric_sample(d.project_id, d.id, at), &metrics)?;
            w.0.insert(
                keys::metric_sample_expiry(at, d.project_id, d.id),
                Vec::new(),
            );
        }
        self.apply(w)
    }

    /// A device's kept heartbeats in `[from, to]`, oldest first.
    pub fn metric_history(
        &self,
        project: u64,
        device: u64,
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, BTreeMap<String, f64>)>> {
        let start = keys::metric_sample(project, device, from);
        let end = keys::metric_sample(project, device, to.saturating_add(1));
        let prefix = keys::metric_sample_prefix(project, device);
        let mut out = Vec::new();
        for kv in self.inner.records.range(start..end) {
            let (k, v) = kv?;
            let Some(at) = k
                .get(prefix.len()..prefix.len() + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(|b| u64::from_be_bytes(b) as i64)
            else {
                continue;
            };
            let metrics: Vec<(String, f64)> = codec::decode(&v)?;
            out.push((at, metrics.into_iter().collect()));
        }
        Ok(out)
    }

    /// At most `max` of a device's kept heartbeats in `[from, to]`, evenly spaced in time,
    /// oldest first, each with at most `max_metrics` metrics: only the chosen samples are
    /// decoded, so a chart costs `max` decodes however many samples were kept.
    pub fn metric_history_thinned(
        &self,
        project: u64,
        device: u64,
        from: i64,
        to: i64,
        max: usize,
        max_metrics: usize,
    ) -> Result<Vec<(i64, BTreeMap<String, f64>)>> {
        let start = keys::metric_sample(project, device, from);
        let end = keys::metric_sample(project, device, to.saturating_add(1));
        let prefix = keys::metric_sample_prefix(project, device);
        let slot = ((to - from) / (max.max(1) as i64)).max(1);
        let mut next = from;
        let mut out = Vec::new();
        for kv in self.inner.records.range(start..end) {
            let (k, v) = kv?;
            let Some(at) = k
                .get(prefix.len()..prefix.len() + 8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(|b| u64::from_be_bytes(b) as i64)
            else {
                continue;
            };
            if out.len() >= max {
                break;
            }
            if at < next {
                continue;
            }
            next = at.saturating_add(slot);
            let metrics: Vec<(String, f64)> = codec::decode(&v)?;
            out.push((at, metrics.into_iter().take(max_metrics).collect()));
        }
        Ok(out)
    }

    /// Deletes up to `limit` samples older than `before`; how many went.
    pub fn prune_metric_history(&self, before: i64, limit: usize) -> Result<usize> {
        let prefix = keys::metric_sample_expiry_prefix();
        let end = keys::metric_sample_expiry(before, 0, 0);
        let mut w = Writes::new();
        let mut n = 0;
        for kv in self.inner.records.range(prefix.clone()..end).take(limit) {
            let (k, _) = kv?;
            let field = |i: usize| {
                k.get(prefix.len() + i * 9..prefix.len() + i * 9 + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
            };
            if let (Some(at), Some(p), Some(d)) = (field(0), field(1), field(2)) {
                w.delete(keys::metric_sample(p, d, at as i64));
            }
            w.delete(k.to_vec());
            n += 1;
        }
        if n > 0 {
            self.apply(w)?;
        }
        Ok(n)
    }

    /// Deletes a device and takes it out of the given (already updated) groups, atomically.
    pub fn delete_device(&self, d: &Device, groups: &[DeviceGroup]) -> Result<()> {
        let mut w = Writes::new();
        w.delete_listed::<Device>(keys::device(d.project_id, d.id));
        w.delete(keys::device_by_token(&d.token_hash));
        for k in self.scan_keys(&keys::device_history_prefix(d.id))? {
            w.0.remove(k);
        }
        for g in groups {
            w.put(keys::group(g.project_id, g.id), g)?;
        }
        self.write_groups(d.project_id, w)
    }

    /// A project's devices, newest first.
    pub fn project_devices(&self, project: u64) -> Result<Vec<Device>> {
        self.scan_rev(&keys::device_prefix(project))
    }

    pub fn group(&self, project: u64, id: u64) -> Result<Option<DeviceGroup>> {
        self.get(&keys::group(project, id))
    }

    pub fn put_group(&self, g: &DeviceGroup) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::group(g.project_id, g.id), g)?;
        self.write_groups(g.project_id, w)
    }

    pub fn delete_group(&self, g: &DeviceGroup) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::group(g.project_id, g.id));
        self.write_groups(g.project_id, w)
    }

    fn write_groups(&self, project: u64, w: Writes) -> Result<()> {
        self.inner.cache.groups.forget(&project);
        self.apply(w)?;
        self.inner.cache.groups.forget(&project);
        Ok(())
    }

    /// A project's groups, newest first.
    pub fn project_groups(&self, project: u64) -> Result<Arc<Vec<DeviceGroup>>> {
        let c = &self.inner.cache.groups;
        let generation = c.generation();
        if let Some(g) = c.get(&project) {
            return Ok(g.clone());
        }
        let g = Arc::new(self.scan_rev(&keys::group_prefix(project))?);
        c.put(generation, project, g.clone());
        Ok(g)
    }
}
