//! Which package each device should run now, cached so that a robot's poll costs one map
//! read. Every write that can change an answer (a package's transition, a rollout's decision,
//! a device's labels, a group's members) bumps one generation counter after it is applied; a
//! poll reads the generation before it reads the store, so an answer is kept only with the
//! generation it was computed under and a later bump makes the next poll compute it again.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use dashmap::DashMap;
use fleetops_storage::{Deployment, Device, Store};

use crate::error::Result;
use crate::rules::deployments::{DeploymentSpec, evaluate, targets_device};
use crate::rules::rollouts::{RolloutPlan, by_activation, phases_of, reaches};

/// A device's answer: the package's ETag and the JSON body, or nothing assigned.
#[derive(Debug, Clone)]
pub struct Answer {
    pub etag: String,
    pub body: Bytes,
}

#[derive(Clone)]
struct Cached {
    generation: u64,
    built_at: i64,
    answer: Option<Arc<Answer>>,
}

pub(crate) struct Assignments {
    generation: AtomicU64,
    answers: DashMap<u64, Cached>,
    /// Each package's phase per target device, with the generation it was computed under.
    phases: DashMap<u64, (u64, Arc<HashMap<u64, u32>>)>,
    /// At most this many devices' answers are kept (then the cache starts over).
    max_entries: usize,
}

impl Assignments {
    pub(crate) fn new(max_entries: usize) -> Self {
        Self {
            generation: AtomicU64::new(1),
            answers: DashMap::new(),
            phases: DashMap::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// Called after every applied write that may change a device's package.
    pub(crate) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The cached answer of `device`, when computed under generation `generation` and built
    /// at or after `fresh_after` (its links still have most of their life).
    pub(crate) fn cached(
        &self,
        device: u64,
        generation: u64,
        fresh_after: i64,
    ) -> Option<Option<Arc<Answer>>> {
        let c = self.answers.get(&device)?;
        (c.generation == generation && c.built_at >= fresh_after).then(|| c.answer.clone())
    }

    pub(crate) fn keep(
        &self,
        device: u64,
        generation: u64,
        built_at: i64,
        answer: Option<Arc<Answer>>,
    ) {
        if self.answers.len() >= self.max_entries {
            self.answers.clear();
        }
        self.answers.insert(
            device,
            Cached {
                generation,
                built_at,
                answer,
            },
        );
    }

    /// The phase of each target device of package `d` under `plan`, computed once per
    /// generation.
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
        let map = Arc::new(phases_of(plan, d.id, &targets, |g| {
            store
                .group(d.project_id, g)
                .ok()
                .flatten()
                .map(|g| g.device_ids)
                .unwrap_or_default()
        }));
        if self.phases.len() >= self.max_entries {
            self.phases.clear();
        }
        self.phases.insert(d.id, (generation, map.clone()));
        Ok(map)
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
