//! A pool of slots with a bounded share per tenant: whoever grabs first can take at most its
//! share, so one organization's slow readers, hung targets or trickling uploads cost the
//! others nothing beyond it. Used by the notification, stream and upload pools.
//!
//! The tenant is an organization. The pools: notifications being sent (`[alerts]
//! max_in_flight`, `max_in_flight_per_org`), exports and artifact ZIPs being streamed
//! (`[sessions] max_streams`, `max_streams_per_org`) and streamed uploads (`[http]
//! max_streamed_uploads`, `max_streamed_uploads_per_org`). A slot gives its place back when it
//! is dropped; [`Shares::take`] answers 503 with a `Retry-After` when there is none, and the
//! notifier uses [`Shares::try_take`] and keeps the notification owed until a slot is free.
//!
//! Tested by the unit test below, and through the server with one organization's targets,
//! readers or uploads stalled while another's go on.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `total` slots, at most `per_tenant` of them for one tenant.
#[derive(Clone)]
pub(crate) struct Shares {
    pool: Arc<Semaphore>,
    per_tenant: usize,
    /// Each tenant's share, made on first use (one small entry per organization).
    tenants: Arc<DashMap<u64, Arc<Semaphore>>>,
}

/// A slot of the pool and of its tenant's share; both are given back when it is dropped.
pub(crate) struct Slot {
    _tenant: OwnedSemaphorePermit,
    _pool: OwnedSemaphorePermit,
}

impl Shares {
    pub(crate) fn new(total: usize, per_tenant: usize) -> Self {
        Self {
            pool: Arc::new(Semaphore::new(total.max(1))),
            per_tenant: per_tenant.max(1),
            tenants: Arc::new(DashMap::new()),
        }
    }

    /// A slot for `tenant` if both its share and the pool have one free.
    pub(crate) fn try_take(&self, tenant: u64) -> Option<Slot> {
        let share = self
            .tenants
            .entry(tenant)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant)))
            .clone();
        let tenant = share.try_acquire_owned().ok()?;
        let pool = self.pool.clone().try_acquire_owned().ok()?;
        Some(Slot {
            _tenant: tenant,
            _pool: pool,
        })
    }

    /// As [`Shares::try_take`], or 503 with `Retry-After: retry_after_secs` when there is
    /// none (about how long a slot of this pool is held).
    pub(crate) fn take(&self, tenant: u64, retry_after_secs: u64) -> crate::error::Result<Slot> {
        self.try_take(tenant)
            .ok_or(crate::error::Error::Unavailable { retry_after_secs })
    }

    /// Slots free in the whole pool now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.pool.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_takes_at_most_its_share_and_the_pool_bounds_them_all() {
        let s = Shares::new(5, 2);
        let a: Vec<Slot> = (0..3).filter_map(|_| s.try_take(1)).collect();
        assert_eq!(a.len(), 2, "tenant 1 holds its share");
        let b: Vec<Slot> = (0..3).filter_map(|_| s.try_take(2)).collect();
        assert_eq!(b.len(), 2);
        assert!(s.try_take(3).is_some_and(|x| {
            drop(x);
            true
        }));
        let c = s.try_take(3).unwrap();
        assert!(s.try_take(4).is_none(), "the pool is full");
        drop(c);
        assert_eq!(s.available(), 1);
        drop(a);
        assert!(s.try_take(1).is_some(), "a dropped slot is given back");
    }
}
