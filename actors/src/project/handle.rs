//! [`ProjectsHandle`]: the way in for a project's devices and groups. Writes go to the
//! project's actor (under its keyed supervisor) and are answered once durable; reads go to the
//! store directly, since sled reads are safe concurrently and need no single writer.

pub use super::enrollment::TokenSpec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fleetops_storage::devices::DeviceQuery;
use fleetops_storage::{Device, DeviceGroup, Store};
use ractor::RpcReplyPort;

use crate::config::DevicesConfig;
use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::project::{DevicesMsg, ProjectActor, ProjectMsg};
use crate::signals::AlertSignals;
use crate::views::{DeviceView, GroupView, HeartbeatAck, Page, PageReq};

/// Filters of the device lists.
#[derive(Debug, Default, Clone)]
pub struct DeviceFilter {
    pub status: Option<DeviceStatus>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeviceStatus {
    Online,
    Offline,
}

/// A project's device counts ([`ProjectsHandle::devices_with_counts`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceCounts {
    pub total: u64,
    pub online: u64,
    pub offline: u64,
}

impl DeviceStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "online" => Some(Self::Online),
            "offline" => Some(Self::Offline),
            _ => None,
        }
    }
}

/// The way in for project-scoped records.
#[derive(Clone)]
pub struct ProjectsHandle {
    pub(crate) actors: Keyed<ProjectActor>,
    pub(crate) store: Store,
    pub(crate) devices: DevicesConfig,
    pub(crate) restarts: Arc<AtomicU64>,
    /// Online/offline is judged by the runtime's clock.
    pub(crate) clock: crate::clock::Clock,
    /// Heartbeats (and, through the sessions' handle, log batches) go on to the project's
    /// alert evaluator.
    pub(crate) alerts: Arc<dyn AlertSignals>,
}

impl ProjectsHandle {
    /// One write to a project's actor, answered once durable.
    pub(crate) async fn write<T: Send + 'static, M: Into<ProjectMsg>>(
        &self,
        pid: u64,
        build: impl Fn(RpcReplyPort<Result<T>>) -> M,
    ) -> Result<T> {
        // A deleted organization's project takes no write (those already queued are done or
        // dropped before its purge starts: `directory::purge`).
        if self.store.project_retired(pid) {
            return Err(Error::not_found("Project"));
        }
        let r = self.actors.call(pid, |reply| build(reply).into()).await?;
        self.store.durable().await?;
        Ok(r)
    }

    /// Actor restarts since start-up (for `/metrics`).
    pub fn restart_count(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Makes the project's actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_panic(&self, pid: u64) -> Result<()> {
        let a = self.actors.actor(pid).await?;
        a.cast(crate::mailbox::Envelope::cast(ProjectMsg::Panic))
            .map_err(|_| Error::Unavailable {
                retry_after_secs: 1,
            })
    }

    /// Calls waiting on the project's actor now (deadline tests only).
    #[doc(hidden)]
    pub fn waiting(&self, pid: u64) -> usize {
        self.actors.waiting(pid)
    }

    /// Holds the project's actor up for `d` (deadline tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
    pub async fn inject_stall(&self, pid: u64, d: std::time::Duration) -> Result<()> {
        let a = self.actors.actor(pid).await?;
        a.cast(crate::mailbox::Envelope::cast(ProjectMsg::Stall(d)))
            .map_err(|_| Error::Unavailable {
                retry_after_secs: 1,
            })
    }

    // ---- reads ----

    fn status(&self, d: &Device, now: i64) -> &'static str {
        let window = self.devices.offline_after_seconds as i64 * 1000;
        match d.last_seen_at {
            Some(t) if now - t < window => "online",
            _ => "offline",
        }
    }

    fn view(&self, d: &Device, groups: &[DeviceGroup], now: i64) -> DeviceView {
        let ids = groups
            .iter()
            .filter(|g| g.device_ids.binary_search(&d.id).is_ok())
            .map(|g| g.id)
            .collect();
        DeviceView::new(d, self.status(d, now), ids)
    }

    pub async fn device(&self, pid: u64, id: u64) -> Result<DeviceView> {
        let d = self
            .store
            .device_async(pid, id)
            .await?
            .ok_or_else(|| Error::not_found("Device"))?;
        let groups = self.store.project_groups(pid)?;
        Ok(self.view(&d, &groups, self.clock.now_ms()))
    }

    pub fn device_exists(&self, pid: u64, id: u64) -> Result<()> {
        self.store
            .device(pid, id)?
            .map(|_| ())
            .ok_or_else(|| Error::not_found("Device"))
    }

    /// What the store needs to apply the filter: online means seen within the offline
    /// window (`now - seen < window`).
    fn query<'a>(&self, f: &'a DeviceFilter, now: i64) -> DeviceQuery<'a> {
        let window = self.devices.offline_after_seconds as i64 * 1000;
        DeviceQuery {
            name: f.name.as_deref(),
            presence: f
                .status
                .map(|s| (s == DeviceStatus::Online, now - window + 1)),
        }
    }

    /// A device's kept heartbeat metrics over the last `hours`, oldest first: at most `max`
    /// samples evenly spaced in time, each with at most `max_metrics` metrics (the console's
    /// charts; only the chosen samples are read).
    pub async fn metric_history(
        &self,
        pid: u64,
        device: u64,
        hours: i64,
        max: usize,
        max_metrics: usize,
    ) -> Result<Vec<(i64, BTreeMap<String, f64>)>> {
        let store = self.store.clone();
        let now = self.clock.now_ms();
        crate::off_thread(move || {
            Ok(store.metric_history_thinned(
                pid,
                device,
                now - hours * 3_600_000,
                now,
                max,
                max_metrics,
            )?)
        })
        .await
    }

    /// The console's device list: a page of the devices `f` picks, headed by how many the
    /// project has, online and offline (offline is the rest), in one message and against one
    /// clock reading (three reads of the store: a device written meanwhile may show in one
    /// and not another).
    pub async fn devices_with_counts(
        &self,
        pid: u64,
        f: &DeviceFilter,
        page: PageReq,
    ) -> Result<(DeviceCounts, Page<DeviceView>)> {
        let me = self.clone();
        let f = f.clone();
        crate::off_thread(move || {
            let now = me.clock.now_ms();
            let count = |status: Option<DeviceStatus>| {
                let f = DeviceFilter { status, name: None };
                me.store
                    .devices_page(pid, me.query(&f, now), 0, 1)
                    .map(|(_, total)| total)
            };
            let total = count(None)?;
            let online = count(Some(DeviceStatus::Online))?;
            let counts = DeviceCounts {
                total,
                online,
                offline: total.saturating_sub(online),
            };
            Ok((counts, me.devices_at(pid, &f, page, now)?))
        })
        .await
    }

    pub async fn devices(
        &self,
        pid: u64,
        f: &DeviceFilter,
        page: PageReq,
    ) -> Result<Page<DeviceView>> {
        let me = self.clone();
        let f = f.clone();
        crate::off_thread(move || me.devices_now(pid, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn devices_now(&self, pid: u64, f: &DeviceFilter, page: PageReq) -> Result<Page<DeviceView>> {
        self.devices_at(pid, f, page, self.clock.now_ms())
    }

    fn devices_at(
        &self,
        pid: u64,
        f: &DeviceFilter,
        page: PageReq,
        now: i64,
    ) -> Result<Page<DeviceView>> {
        let (devices, total) =
            self.store
                .devices_page(pid, self.query(f, now), page.skip(), page.page_size)?;
        let groups = self.store.project_groups(pid)?;
        let items = devices.iter().map(|d| self.view(d, &groups, now)).collect();
        Ok(page.of(items, total))
    }

    /// Devices of several projects (an organization's), each with its project slug, newest
    /// first: each project gives its first page's worth, and the pages merge by id (ids
    /// follow creation).
    pub async fn org_devices(
        &self,
        projects: &[(u64, String)],
        f: &DeviceFilter,
        page: PageReq,
    ) -> Result<Page<DeviceView>> {
        let me = self.clone();
        let f = f.clone();
        let projects = projects.to_vec();
        crate::off_thread(move || me.org_devices_now(&projects, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn org_devices_now(
        &self,
        projects: &[(u64, String)],
        f: &DeviceFilter,
        page: PageReq,
    ) -> Result<Page<DeviceView>> {
        let now = self.clock.now_ms();
        let q = self.query(f, now);
        let want = page.skip().saturating_add(page.page_size);
        let (mut ids, mut total) = (Vec::new(), 0u64);
        for (i, (pid, _)) in projects.iter().enumerate() {
            let (found, n) = self.store.device_ids(*pid, q, want)?;
            total = total.saturating_add(n);
            ids.extend(found.into_iter().map(|id| (id, i)));
        }
        ids.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
        let page_ids: Vec<(u64, usize)> = ids
            .into_iter()
            .skip(page.skip())
            .take(page.page_size)
            .collect();
        let at: Vec<(u64, u64)> = page_ids
            .iter()
            .filter_map(|(id, i)| projects.get(*i).map(|(pid, _)| (*pid, *id)))
            .collect();
        let mut found = self.store.devices_at(&at)?.into_iter();
        let mut items = Vec::with_capacity(page.page_size);
        for (_, i) in page_ids {
            let Some((pid, slug)) = projects.get(i) else {
                continue;
            };
            if let Some(d) = found.next().flatten() {
                let groups = self.store.project_groups(*pid)?;
                let mut v = self.view(&d, &groups, now);
                v.project = Some(slug.clone());
                items.push(v);
            }
        }
        Ok(page.of(items, total))
    }

    pub fn group(&self, pid: u64, id: u64) -> Result<GroupView> {
        self.store
            .group(pid, id)?
            .map(|g| GroupView::from(&g))
            .ok_or_else(|| Error::not_found("Device group"))
    }

    pub fn group_exists(&self, pid: u64, id: u64) -> Result<()> {
        self.group(pid, id).map(|_| ())
    }

    pub fn groups(&self, pid: u64) -> Result<Vec<GroupView>> {
        Ok(self
            .store
            .project_groups(pid)?
            .iter()
            .map(GroupView::from)
            .collect())
    }

    // ---- writes ----

    pub async fn create_device(
        &self,
        pid: u64,
        name: String,
        labels: BTreeMap<String, String>,
    ) -> Result<DeviceView> {
        let (d, token) = self
            .write(pid, |reply| DevicesMsg::CreateDevice {
                name: name.clone(),
                labels: labels.clone(),
                reply,
            })
            .await?;
        let mut v = self.view(&d, &[], self.clock.now_ms());
        v.device_token = Some(token);
        Ok(v)
    }

    pub async fn create_enrollment_token(
        &self,
        pid: u64,
        spec: super::enrollment::TokenSpec,
    ) -> Result<crate::views::EnrollmentTokenView> {
        let (t, token) = self
            .write(pid, |reply| DevicesMsg::CreateEnrollmentToken {
                spec: Box::new(spec.clone()),
                reply,
            })
            .await?;
        let mut v = crate::views::EnrollmentTokenView::from(&t);
        v.token = Some(token);
        Ok(v)
    }

    pub fn enrollment_tokens(
        &self,
        pid: u64,
    ) -> Result<crate::views::Items<crate::views::EnrollmentTokenView>> {
        let items = self
            .store
            .enrollment_tokens(pid, super::enrollment::MAX_ENROLLMENT_TOKENS)?
            .iter()
            .map(crate::views::EnrollmentTokenView::from)
            .collect();
        Ok(crate::views::Items { items })
    }

    pub async fn delete_enrollment_token(&self, pid: u64, id: u64) -> Result<()> {
        self.write(pid, |reply| DevicesMsg::DeleteEnrollmentToken { id, reply })
            .await
    }

    /// A robot registers itself with enrollment token `token`: its device and device
    /// token, and the organization and project it joined. 401 for a token that is unknown,
    /// revoked, used up or expired. `enrollment_id`: the robot's name for this enrollment;
    /// asking again with it (the first answer lost) answers the same device, with a new
    /// device token, while that device was never seen.
    pub async fn enroll(
        &self,
        token: &str,
        name: String,
        labels: BTreeMap<String, String>,
        enrollment_id: Option<&str>,
    ) -> Result<crate::views::EnrolledView> {
        let hash = crate::secrets::sha256(token.as_bytes());
        let attempt = enrollment_id
            .map(|e| super::enrollment::enrollment_attempt(&hash, e))
            .transpose()?;
        let pid = match self.store.enrollment_token_by_hash(&hash)? {
            Some(t) => t.project_id,
            // Used up or revoked since: the enrollment it made, if this is its robot.
            None => match &attempt {
                Some(a) => {
                    self.store
                        .enrollment_attempt(a)?
                        .ok_or(Error::Unauthorized)?
                        .0
                }
                None => return Err(Error::Unauthorized),
            },
        };
        let project = self.store.project(pid)?.ok_or(Error::Unauthorized)?;
        let org = self.store.org(project.org_id)?.ok_or(Error::Unauthorized)?;
        let (d, device_token) = self
            .write(pid, |reply| DevicesMsg::Enroll {
                hash,
                name: name.clone(),
                labels: labels.clone(),
                attempt,
                reply,
            })
            .await
            .map_err(|e| match e {
                Error::NotFound(_) => Error::Unauthorized,
                e => e,
            })?;
        let mut device = self.view(&d, &[], self.clock.now_ms());
        device.device_token = Some(device_token);
        Ok(crate::views::EnrolledView {
            device,
            organization: org.slug,
            project_slug: project.slug,
        })
    }

    pub async fn update_device(
        &self,
        pid: u64,
        id: u64,
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    ) -> Result<DeviceView> {
        let d = self
            .write(pid, |reply| DevicesMsg::UpdateDevice {
                id,
                name: name.clone(),
                labels: labels.clone(),
                reply,
            })
            .await?;
        let groups = self.store.project_groups(pid)?;
        Ok(self.view(&d, &groups, self.clock.now_ms()))
    }

    pub async fn delete_device(&self, pid: u64, id: u64) -> Result<()> {
        self.write(pid, |reply| DevicesMsg::DeleteDevice { id, reply })
            .await?;
        // Its alerts resolve; it no longer goes offline.
        self.alerts.devices_changed(pid).await;
        Ok(())
    }

    pub async fn heartbeat(
        &self,
        pid: u64,
        id: u64,
        metrics: BTreeMap<String, f64>,
    ) -> Result<HeartbeatAck> {
        let metrics = Arc::new(metrics);
        let at = self
            .write(pid, |reply| DevicesMsg::Heartbeat {
                id,
                metrics: (*metrics).clone(),
                reply,
            })
            .await?;
        // Durable now: the project's alert rules may judge it.
        self.alerts.heartbeat(pid, id, at, metrics).await;
        Ok(HeartbeatAck { status: "online" })
    }

    pub async fn create_group(
        &self,
        pid: u64,
        name: String,
        device_ids: Vec<u64>,
    ) -> Result<GroupView> {
        self.write(pid, |reply| DevicesMsg::CreateGroup {
            name: name.clone(),
            device_ids: device_ids.clone(),
            reply,
        })
        .await
        .map(|g| GroupView::from(&g))
    }

    pub async fn update_group(
        &self,
        pid: u64,
        id: u64,
        name: Option<String>,
        device_ids: Option<Vec<u64>>,
    ) -> Result<GroupView> {
        let g = self
            .write(pid, |reply| DevicesMsg::UpdateGroup {
                id,
                name: name.clone(),
                device_ids: device_ids.clone(),
                reply,
            })
            .await?;
        if device_ids.is_some() {
            // Rules that name the group now cover other devices.
            self.alerts.devices_changed(pid).await;
        }
        Ok(GroupView::from(&g))
    }

    pub async fn delete_group(&self, pid: u64, id: u64) -> Result<()> {
        self.write(pid, |reply| DevicesMsg::DeleteGroup { id, reply })
            .await?;
        self.alerts.devices_changed(pid).await;
        Ok(())
    }
}
