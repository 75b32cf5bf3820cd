//! Which package each device should run now (the most recently activated active package that
//! targets it and whose rollout, if it has one, has reached it), cached so that a robot's poll
//! costs one map read. Every write that can change an answer in a project (a package's
//! transition, a rollout's decision, a device created, changed or deleted, a group created,
//! changed or deleted) bumps that project's generation after it is applied and before it is
//! answered; a poll reads the generation before it reads the store, so an answer is kept only
//! with the generation it was computed under and a later bump makes the next poll compute it
//! again. Heartbeats and reports change no answer and bump nothing.
//!
//! Memory: a device's entry is a few dozen bytes, at most `[pipeline] device_cache_entries`
//! of them; the answer bodies (links, configuration, provenance) are built once per package
//! and shared by its devices, and a package's phase map is computed once per generation, for
//! at most 1,024 packages. Past either bound that cache starts over.
//!
//! Tested through the device update API (`tests/api/updates.rs`) and the rollouts that move
//! devices from package to package (`tests/api/rollouts/`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use dashmap::DashMap;
use fleetops_storage::{Deployment, Device, Store};

use crate::error::Result;
use crate::rules::deployments::{DeploymentSpec, evaluate, targets_device};
use crate::rules::rollouts::{RolloutPlan, by_activation, phases_of, reaches};

/// A package's answer: its ETag and the JSON body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub etag: String,
    pub body: Bytes,
}

#[derive(Clone)]
struct Cached {
    generation: u64,
    /// The package the device should run (`None`: nothing assigned), with how many times it
    /// was offered to the device again after a failure (its answer's ETag names it).
    package: Option<(u64, u32)>,
}

/// At most this many packages' phase maps and bodies are kept (then that cache starts over).
const MAX_PACKAGES: usize = 1024;

pub(crate) struct Assignments {
    generations: DashMap<u64, Arc<AtomicU64>>,
    answers: DashMap<u64, Cached>,
    /// Each package's answer body, with when it was built (its links age).
    bodies: DashMap<u64, (i64, Arc<Answer>)>,
    /// Each package's phase per target device, with the generation it was computed under.
    phases: DashMap<u64, (u64, Arc<HashMap<u64, u32>>)>,
    /// At most this many devices' entries are kept (then the cache starts over).
    max_entries: usize,
    /// Added to every project's generation: bumped to make every answer computed again
    /// (several nodes, a change announcement the bus may have lost).
    epoch: AtomicU64,
    /// Told of every change made here (the other nodes bump their generation of it).
    on_change: std::sync::OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
}

impl Assignments {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            generations: DashMap::new(),
            answers: DashMap::new(),
            bodies: DashMap::new(),
            phases: DashMap::new(),
            max_entries: max_entries.max(1),
            epoch: AtomicU64::new(0),
            on_change: std::sync::OnceLock::new(),
        }
    }

    /// Calls `tell` with the project of every change made on this node (set once).
    pub(crate) fn on_change(&self, tell: Box<dyn Fn(u64) + Send + Sync>) {
        let _ = self.on_change.set(tell);
    }

    /// Another node changed something of `project` that may change a device's package.
    pub(crate) fn changed_elsewhere(&self, project: u64) {
        self.counter(project).fetch_add(1, Ordering::AcqRel);
    }

    /// Makes every answer be computed again at its next poll.
    pub(crate) fn refresh_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    fn counter(&self, project: u64) -> Arc<AtomicU64> {
        self.generations
            .entry(project)
            .or_insert_with(|| Arc::new(AtomicU64::new(1)))
            .clone()
    }

    /// Called after every applied write of `project` that may change a device's package.
    pub(crate) fn changed(&self, project: u64) {
        self.counter(project).fetch_add(1, Ordering::AcqRel);
        if let Some(tell) = self.on_change.get() {
            tell(project);
        }
    }

    pub(crate) fn generation(&self, project: u64) -> u64 {
        // Every poll reads this: a shared read of the shard, a write only the first time.
        let epoch = self.epoch.load(Ordering::Acquire);
        if let Some(c) = self.generations.get(&project) {
            return c.load(Ordering::Acquire) + epoch;
        }
        self.counter(project).load(Ordering::Acquire) + epoch
    }

    /// The cached package of `device` when computed under `generation`: `Some(None)` is a
    /// cached "nothing assigned".
    pub(crate) fn cached(&self, device: u64, generation: u64) -> Option<Option<(u64, u32)>> {
        let c = self.answers.get(&device)?;
        (c.generation == generation).then_some(c.package)
    }

    pub(crate) fn keep(&self, device: u64, generation: u64, package: Option<(u64, u32)>) {
        if self.answers.len() >= self.max_entries {
            self.answers.clear();
        }
        self.answers.insert(
            device,
            Cached {
                generation,
                package,
            },
        );
    }

    /// The body of `package` when built at or after `fresh_after`.
    pub(crate) fn body(&self, package: u64, fresh_after: i64) -> Option<Arc<Answer>> {
        let b = self.bodies.get(&package)?;
        (b.0 >= fresh_after).then(|| b.1.clone())
    }

    pub(crate) fn keep_body(&self, package: u64, built_at: i64, answer: Arc<Answer>) {
        if self.bodies.len() >= MAX_PACKAGES {
            self.bodies.clear();
        }
        self.bodies.insert(package, (built_at, answer));
    }

    /// The phase of each target device of package `d` under `plan`, computed once per
    /// generation of its project.
    pub(crate) fn phases(
        &self,
        store: &Store,
        d: &Deployment,
        plan: &RolloutPlan,
        generation: u64,
    ) -> Result<Arc<HashMap<u64, u32>>> {
        if let Some(p) = self.phases.get(&d.id)
            && p.0 == generation
        {
            return Ok(p.1.clone());
        }
        let targets: Vec<u64> = evaluate(store, d.project_id, &DeploymentSpec::of(d))?
            .devices
            .iter()
            .map(|t| t.id)
            .collect();
        // A group's members are read up front, so a storage error fails the computation
        // instead of passing for an empty group (which would move its devices to later phases).
        let mut groups: HashMap<u64, Vec<u64>> = HashMap::new();
        for g in plan.phases.iter().filter_map(|p| p.devices.group_id) {
            let members = store
                .group(d.project_id, g)?
                .map(|g| g.device_ids)
                .unwrap_or_default();
            groups.insert(g, members);
        }
        let map = Arc::new(phases_of(plan, d.id, &targets, |g| {
            groups.get(&g).cloned().unwrap_or_default()
        }));
        if self.phases.len() >= MAX_PACKAGES {
            self.phases.clear();
        }
        self.phases.insert(d.id, (generation, map.clone()));
        Ok(map)
    }

    /// The id of the package device `device` of project `pid` should run now, from the cache
    /// when it holds this generation's answer, else computed and kept; `Ok(None)` when nothing
    /// is assigned, `NotFound` when the device does not exist. Blocking: call off the runtime's
    /// threads on a miss.
    pub(crate) fn package_of(&self, store: &Store, pid: u64, device: u64) -> Result<Option<u64>> {
        Ok(self.offer_of(store, pid, device)?.map(|(p, _)| p))
    }

    /// As [`Assignments::package_of`], with the package's offer count for the device.
    pub(crate) fn offer_of(
        &self,
        store: &Store,
        pid: u64,
        device: u64,
    ) -> Result<Option<(u64, u32)>> {
        let generation = self.generation(pid);
        if let Some(p) = self.cached(device, generation) {
            return Ok(p);
        }
        let d = store
            .device(pid, device)?
            .ok_or_else(|| crate::error::Error::not_found("Device"))?;
        let p = match self.assigned(store, &d, generation)? {
            Some(p) => Some((p.id, store.device_offer(p.id, device)?)),
            None => None,
        };
        self.keep(device, generation, p);
        Ok(p)
    }

    /// The package `device` should run now: the most recently activated active package that
    /// targets it and whose rollout has reached it.
    pub(crate) fn assigned(
        &self,
        store: &Store,
        device: &Device,
        generation: u64,
    ) -> Result<Option<Deployment>> {
        for d in by_activation(store.project_deployments(device.project_id)?) {
            if !targets_device(store, &d, device)? {
                continue;
            }
            let rollout = store.rollout(d.id)?;
            let phase = match rollout.as_ref().and_then(RolloutPlan::of) {
                Some(plan) => self
                    .phases(store, &d, &plan, generation)?
                    .get(&device.id)
                    .copied(),
                None => None,
            };
            if reaches(rollout.as_ref(), phase) {
                return Ok(Some(d));
            }
        }
        Ok(None)
    }
}
