//! Devices and device groups of a project.

use std::sync::Arc;

use std::collections::BTreeMap;

use crate::{Device, DeviceGroup, Result, Store, Writes, codec, keys};

impl Store {
    pub fn device(&self, project: u64, id: u64) -> Result<Option<Device>> {
        self.get(&keys::device(project, id))
    }

    /// The (project, device) a device token belongs to.
    pub fn device_by_token(&self, hash: &[u8; 32]) -> Result<Option<Device>> {
        let Some(v) = self.inner.records.get(keys::device_by_token(hash))? else {
            return Ok(None);
        };
        let (Some(p), Some(d)) = (
            v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()),
            v.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok()),
        ) else {
            return Ok(None);
        };
        self.device(u64::from_be_bytes(p), u64::from_be_bytes(d))
    }

    pub fn insert_device(&self, d: &Device) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::device(d.project_id, d.id), d)?;
        let mut loc = d.project_id.to_be_bytes().to_vec();
        loc.extend_from_slice(&d.id.to_be_bytes());
        w.0.insert(keys::device_by_token(&d.token_hash), loc);
        self.apply(w.0)
    }

    /// Rewrites a device whose token did not change.
    pub fn update_device(&self, d: &Device) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::device(d.project_id, d.id), d)?;
        self.apply(w.0)
    }

    /// Rewrites a device after a heartbeat and, when `sample`, keeps its metrics as one
    /// sample of its history, in the same write.
    pub fn heartbeat_device(&self, d: &Device, sample: bool) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::device(d.project_id, d.id), d)?;
        if sample && let Some(at) = d.last_seen_at {
            let metrics: Vec<(&str, f64)> =
                d.metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            w.put(keys::metric_sample(d.project_id, d.id, at), &metrics)?;
            w.0.insert(
                keys::metric_sample_expiry(at, d.project_id, d.id),
                Vec::new(),
            );
        }
        self.apply(w.0)
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
            self.apply(w.0)?;
        }
        Ok(n)
    }

    /// Deletes a device and takes it out of the given (already updated) groups, atomically.
    pub fn delete_device(&self, d: &Device, groups: &[DeviceGroup]) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::device(d.project_id, d.id));
        w.delete(keys::device_by_token(&d.token_hash));
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
        self.apply(w.0)?;
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
