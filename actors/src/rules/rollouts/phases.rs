//! Which devices each phase holds (stable across pauses), how far a rollout has reached, and
//! packages in the order they were activated.

use super::*;

/// A stable, well-mixed order for a package's devices (splitmix64 of the pair): the same on
/// every start and every version, unlike std's hasher.
pub(super) fn rank(device: u64, package: u64) -> u64 {
    let mut z = device ^ package.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The phase (0-based) of each of `targets`, the package's target devices now. Phases take
/// devices in order: a group phase its group's devices not already in a phase; a count or
/// percent phase the next devices in the package's stable order (a percent of all targets,
/// rounded up). Devices no phase took belong to the last phase, so a completed rollout reaches
/// every target.
pub fn phases_of(
    plan: &RolloutPlan,
    package: u64,
    targets: &[u64],
    group_devices: impl Fn(u64) -> Vec<u64>,
) -> HashMap<u64, u32> {
    let mut order: Vec<u64> = targets.to_vec();
    order.sort_by_key(|d| (rank(*d, package), *d));
    order.dedup();
    let total = order.len();
    let mut out: HashMap<u64, u32> = HashMap::with_capacity(total);
    let mut next = 0usize;
    let last = plan.phases.len().saturating_sub(1) as u32;
    for (i, p) in plan.phases.iter().enumerate() {
        let i = i as u32;
        if let Some(g) = p.devices.group_id {
            let members: std::collections::HashSet<u64> = group_devices(g).into_iter().collect();
            for d in &order {
                if members.contains(d) {
                    out.entry(*d).or_insert(i);
                }
            }
            continue;
        }
        let want = match (p.devices.count, p.devices.percent) {
            (Some(c), _) => usize::try_from(c).unwrap_or(usize::MAX),
            // Multiplied first: 7 % of 100 is 7, not ceil(7.000000000000001).
            (None, Some(pct)) => (pct * total as f64 / 100.0).ceil() as usize,
            _ => 0,
        };
        let mut taken = 0;
        while taken < want && next < order.len() {
            let d = order[next];
            next += 1;
            if let std::collections::hash_map::Entry::Vacant(e) = out.entry(d) {
                e.insert(i);
                taken += 1;
            }
        }
    }
    for d in order {
        out.entry(d).or_insert(last);
    }
    out
}

/// Whether the package `d`, which targets the device, reaches it now: a package without a
/// rollout reaches every target; with one, the device's phase must have started and the
/// rollout must not have been rolled back.
pub fn reaches(rollout: Option<&Rollout>, phase: Option<u32>) -> bool {
    match rollout {
        None => true,
        Some(r) => {
            r.started_at.is_some()
                && r.state != RolloutState::RolledBack
                && phase.is_some_and(|p| p <= r.phase)
        }
    }
}

/// The order in which a device's packages are considered: the most recently activated
/// active package first (the previously active one is next, which is what a rollback falls
/// back to).
pub fn by_activation(mut packages: Vec<Deployment>) -> Vec<Deployment> {
    packages.retain(|d| d.status == DeploymentStatus::Active);
    packages.sort_by_key(|d| std::cmp::Reverse((d.deployed_at.unwrap_or(0), d.id)));
    packages
}
