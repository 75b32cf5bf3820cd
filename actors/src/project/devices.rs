//! The ProjectActor's state changes for devices, their heartbeats and groups.

use super::ProjectState;
use crate::clock::now_ms;
use crate::error::Error;
use crate::error::Result;
use crate::rules;
use crate::secrets;
use fleetops_storage::Device;
use fleetops_storage::DeviceGroup;
use fleetops_storage::accounts::Seq;
use std::collections::BTreeMap;

impl ProjectState {
    pub(super) fn device(&self, id: u64) -> Result<Device> {
        self.store
            .device(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Device"))
    }

    pub(super) fn group(&self, id: u64) -> Result<DeviceGroup> {
        self.store
            .group(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Device group"))
    }

    pub(super) fn create_device(
        &self,
        name: String,
        labels: BTreeMap<String, String>,
    ) -> Result<(Device, String)> {
        let name = rules::name("name", &name, 200)?;
        rules::labels(&labels)?;
        let token = secrets::new_device_token()?;
        let d = Device {
            id: self.store.new_id(Seq::Device)?,
            project_id: self.pid(),
            name,
            labels,
            token_hash: secrets::sha256(token.as_bytes()),
            created_at: now_ms(),
            last_seen_at: None,
            metrics: BTreeMap::new(),
        };
        self.store.insert_device(&d)?;
        Ok((d, token))
    }

    pub(super) fn update_device(
        &self,
        id: u64,
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    ) -> Result<Device> {
        let mut d = self.device(id)?;
        if let Some(n) = name {
            d.name = rules::name("name", &n, 200)?;
        }
        if let Some(l) = labels {
            rules::labels(&l)?;
            d.labels = l;
        }
        self.store.update_device(&d)?;
        Ok(d)
    }

    pub(super) fn delete_device(&self, id: u64) -> Result<()> {
        let d = self.device(id)?;
        let mut touched = Vec::new();
        for g in self.store.project_groups(self.pid())?.iter() {
            let mut g = g.clone();
            if g.device_ids.contains(&id) {
                g.device_ids.retain(|x| *x != id);
                touched.push(g);
            }
        }
        self.store.delete_device(&d, &touched)?;
        Ok(())
    }

    /// Returns the time stamped as `last_seen_at`.
    pub(super) fn heartbeat(&mut self, id: u64, metrics: BTreeMap<String, f64>) -> Result<i64> {
        rules::metrics(&metrics)?;
        let mut d = self.device(id)?;
        let at = self.clock.now_ms();
        d.last_seen_at = Some(at);
        d.metrics = metrics;
        // At most one kept sample per device per resolution (the backtests' history).
        let every = self.alerting.history_resolution_ms;
        let sample = self
            .last_sample
            .get(&id)
            .is_none_or(|last| at - last >= every);
        self.store.heartbeat_device(&d, sample)?;
        if sample {
            self.last_sample.insert(id, at);
        }
        Ok(at)
    }

    pub(super) fn check_members(&self, ids: Vec<u64>) -> Result<Vec<u64>> {
        let mut ids = ids;
        ids.sort_unstable();
        ids.dedup();
        rules::at_most("device_ids", ids.len(), rules::MAX_GROUP_MEMBERS)?;
        for id in &ids {
            if self.store.device(self.pid(), *id)?.is_none() {
                return Err(Error::unprocessable(
                    "device_ids",
                    format!("device {id} does not exist in this project"),
                ));
            }
        }
        Ok(ids)
    }

    pub(super) fn create_group(&self, name: String, device_ids: Vec<u64>) -> Result<DeviceGroup> {
        let name = rules::name("name", &name, 200)?;
        let device_ids = self.check_members(device_ids)?;
        let g = DeviceGroup {
            id: self.store.new_id(Seq::Group)?,
            project_id: self.pid(),
            name,
            device_ids,
            created_at: now_ms(),
        };
        self.store.put_group(&g)?;
        Ok(g)
    }

    pub(super) fn update_group(
        &self,
        id: u64,
        name: Option<String>,
        device_ids: Option<Vec<u64>>,
    ) -> Result<DeviceGroup> {
        let mut g = self.group(id)?;
        if let Some(n) = name {
            g.name = rules::name("name", &n, 200)?;
        }
        if let Some(ids) = device_ids {
            g.device_ids = self.check_members(ids)?;
        }
        self.store.put_group(&g)?;
        Ok(g)
    }

    pub(super) fn delete_group(&self, id: u64) -> Result<()> {
        let g = self.group(id)?;
        if let Some(r) = self.rule_naming_group(id)? {
            return Err(Error::Conflict(format!(
                "Device group {} is used by alert rule {} ({})",
                g.name, r.id, r.name
            )));
        }
        if let Some((d, _)) =
            self.plan_naming(|p| p.phases.iter().any(|x| x.devices.group_id == Some(id)))?
        {
            return Err(Error::Conflict(format!(
                "Device group {} holds a phase of the rollout of deployment {} ({})",
                g.name, d.id, d.name
            )));
        }
        self.store.delete_group(&g)?;
        Ok(())
    }
}
