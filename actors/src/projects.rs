//! ProjectsSupervisor: starts a ProjectActor on first use of a project, restarts it (within its
//! budget) when it fails, and keeps the typed map from project id to the live actor.
//!
//! [`ProjectsHandle`] is the way in for everything project-scoped: writes go to the project's
//! actor and are answered once durable; reads go to the store directly, since sled reads are
//! safe concurrently and need no single writer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use fleetops_storage::{Device, DeviceGroup, Store};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::Semaphore;

use crate::clock::now_ms;
use crate::config::{DevicesConfig, SupervisionConfig};
use crate::error::{Error, Result};
use crate::mailbox::{self, Slot};
use crate::project::{ProjectActor, ProjectMsg};
use crate::supervision::{RestartBudget, Verdict};
use crate::views::{DeviceView, GroupView, HeartbeatAck, Page, PageReq};

pub(crate) enum ProjectsMsg {
    /// The live actor of a project, started if needed.
    Get(u64, RpcReplyPort<Result<ActorRef<ProjectMsg>>>),
    /// A delayed restart is due.
    Respawn(u64),
}

pub(crate) struct ProjectsSupervisor;

pub(crate) struct ProjectsArgs {
    pub store: Store,
    pub cfg: SupervisionConfig,
    pub registry: Arc<DashMap<u64, ActorRef<ProjectMsg>>>,
    pub restarts: Arc<AtomicU64>,
}

pub(crate) struct ProjectsState {
    args: ProjectsArgs,
    /// Which project each live child serves (the key of a supervision event).
    children: HashMap<ActorId, u64>,
    budgets: HashMap<u64, RestartBudget>,
    /// Projects whose actor is down until the instant (backoff or spent budget).
    down_until: HashMap<u64, Instant>,
}

impl ProjectsState {
    async fn spawn(
        &mut self,
        myself: &ActorRef<ProjectsMsg>,
        pid: u64,
    ) -> Result<ActorRef<ProjectMsg>> {
        if let Some(a) = self.args.registry.get(&pid) {
            return Ok(a.clone());
        }
        if let Some(until) = self.down_until.get(&pid) {
            let now = Instant::now();
            if *until > now {
                return Err(Error::Unavailable {
                    retry_after_secs: until.duration_since(now).as_secs().max(1),
                });
            }
            self.down_until.remove(&pid);
        }
        let (actor, _) = Actor::spawn_linked(
            None,
            ProjectActor,
            (self.args.store.clone(), pid),
            myself.get_cell(),
        )
        .await
        .map_err(|e| {
            if e.to_string().contains("does not exist") {
                Error::not_found("Project")
            } else {
                Error::Internal(format!("project actor failed to start: {e}"))
            }
        })?;
        self.children.insert(actor.get_id(), pid);
        self.args.registry.insert(pid, actor.clone());
        Ok(actor)
    }
}

impl Actor for ProjectsSupervisor {
    type Msg = ProjectsMsg;
    type State = ProjectsState;
    type Arguments = ProjectsArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Children of an earlier incarnation are gone with it; start from an empty map.
        for a in args.registry.iter() {
            a.value().stop(None);
        }
        args.registry.clear();
        Ok(ProjectsState {
            args,
            children: HashMap::new(),
            budgets: HashMap::new(),
            down_until: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ProjectsMsg::Get(pid, reply) => {
                let r = st.spawn(&myself, pid).await;
                let _ = reply.send(r);
            }
            ProjectsMsg::Respawn(pid) => {
                st.down_until.remove(&pid);
                if !st.args.registry.contains_key(&pid)
                    && let Err(e) = st.spawn(&myself, pid).await
                {
                    tracing::warn!(project = pid, error = %e, "project actor restart failed");
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match evt {
            SupervisionEvent::ActorFailed(cell, err) => {
                let Some(pid) = st.children.remove(&cell.get_id()) else {
                    return Ok(());
                };
                st.args
                    .registry
                    .remove_if(&pid, |_, a| a.get_id() == cell.get_id());
                st.args.restarts.fetch_add(1, Ordering::Relaxed);
                if st.args.registry.contains_key(&pid) {
                    // A caller already had it started again on demand.
                    tracing::error!(project = pid, error = %err, "project actor failed; already replaced");
                    return Ok(());
                }
                let verdict = st
                    .budgets
                    .entry(pid)
                    .or_default()
                    .on_failure(&st.args.cfg, Instant::now());
                tracing::error!(project = pid, error = %err, ?verdict, "project actor failed");
                match verdict {
                    Verdict::Restart(d) if d.is_zero() => {
                        if let Err(e) = st.spawn(&myself, pid).await {
                            tracing::warn!(project = pid, error = %e, "project actor restart failed");
                        }
                    }
                    Verdict::Restart(d) => {
                        st.down_until.insert(pid, Instant::now() + d);
                        myself.send_after(d, move || ProjectsMsg::Respawn(pid));
                    }
                    Verdict::GiveUpUntil(t) => {
                        st.down_until.insert(pid, t);
                    }
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(pid) = st.children.remove(&cell.get_id()) {
                    st.args
                        .registry
                        .remove_if(&pid, |_, a| a.get_id() == cell.get_id());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

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

impl DeviceStatus {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "online" => Some(Self::Online),
            "offline" => Some(Self::Offline),
            _ => None,
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
        }
    }
}

/// The way in for project-scoped records.
#[derive(Clone)]
pub struct ProjectsHandle {
    pub(crate) sup: Arc<Slot<ProjectsMsg>>,
    pub(crate) registry: Arc<DashMap<u64, ActorRef<ProjectMsg>>>,
    /// One mailbox bound per project, kept across restarts of its actor.
    pub(crate) gates: Arc<DashMap<u64, Arc<Semaphore>>>,
    pub(crate) store: Store,
    pub(crate) cfg: SupervisionConfig,
    pub(crate) devices: DevicesConfig,
    pub(crate) restarts: Arc<AtomicU64>,
}

impl ProjectsHandle {
    async fn actor(&self, pid: u64) -> Result<ActorRef<ProjectMsg>> {
        if let Some(a) = self.registry.get(&pid) {
            return Ok(a.clone());
        }
        self.sup.call(|r| ProjectsMsg::Get(pid, r)).await
    }

    /// One write to a project's actor, answered once durable. A send to an actor that has
    /// just died is retried once against its replacement.
    async fn write<T: Send + 'static>(
        &self,
        pid: u64,
        build: impl Fn(RpcReplyPort<Result<T>>) -> ProjectMsg,
    ) -> Result<T> {
        let gate = self
            .gates
            .entry(pid)
            .or_insert_with(|| Arc::new(Semaphore::new(self.cfg.mailbox_limit)))
            .clone();
        let timeout = Duration::from_millis(self.cfg.call_timeout_ms);
        let actor = self.actor(pid).await?;
        let r = match mailbox::deliver(&actor, &gate, timeout, &build).await {
            mailbox::Outcome::Replied(r) => r?,
            mailbox::Outcome::Lost => {
                // Forget the dead incarnation (unless already replaced) and ask again.
                self.registry
                    .remove_if(&pid, |_, a| a.get_id() == actor.get_id());
                let next = self.actor(pid).await?;
                match mailbox::deliver(&next, &gate, timeout, &build).await {
                    mailbox::Outcome::Replied(r) => r?,
                    mailbox::Outcome::Lost => return Err(mailbox::lost_twice()),
                }
            }
        };
        self.store.durable().await?;
        Ok(r)
    }

    /// Actor restarts since start-up (for `/metrics`).
    pub fn restart_count(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Makes the project's actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    pub async fn inject_panic(&self, pid: u64) -> Result<()> {
        let a = self.actor(pid).await?;
        a.cast(ProjectMsg::Panic).map_err(|_| Error::Unavailable {
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

    pub fn device(&self, pid: u64, id: u64) -> Result<DeviceView> {
        let d = self
            .store
            .device(pid, id)?
            .ok_or_else(|| Error::not_found("Device"))?;
        let groups = self.store.project_groups(pid)?;
        Ok(self.view(&d, &groups, now_ms()))
    }

    pub fn device_exists(&self, pid: u64, id: u64) -> Result<()> {
        self.store
            .device(pid, id)?
            .map(|_| ())
            .ok_or_else(|| Error::not_found("Device"))
    }

    fn filtered(&self, pid: u64, f: &DeviceFilter, now: i64) -> Result<Vec<DeviceView>> {
        let groups = self.store.project_groups(pid)?;
        Ok(self
            .store
            .project_devices(pid)?
            .iter()
            .filter(|d| f.name.as_ref().is_none_or(|n| &d.name == n))
            .map(|d| self.view(d, &groups, now))
            .filter(|v| f.status.is_none_or(|s| v.status == s.as_str()))
            .collect())
    }

    pub fn devices(&self, pid: u64, f: &DeviceFilter, page: PageReq) -> Result<Page<DeviceView>> {
        Ok(page.slice(self.filtered(pid, f, now_ms())?))
    }

    /// Devices of several projects (an organization's), each with its project slug, newest
    /// first.
    pub fn org_devices(
        &self,
        projects: &[(u64, String)],
        f: &DeviceFilter,
        page: PageReq,
    ) -> Result<Page<DeviceView>> {
        let now = now_ms();
        let mut all = Vec::new();
        for (pid, slug) in projects {
            for mut v in self.filtered(*pid, f, now)? {
                v.project = Some(slug.clone());
                all.push(v);
            }
        }
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        Ok(page.slice(all))
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
            .write(pid, |reply| ProjectMsg::CreateDevice {
                name: name.clone(),
                labels: labels.clone(),
                reply,
            })
            .await?;
        let mut v = self.view(&d, &[], now_ms());
        v.device_token = Some(token);
        Ok(v)
    }

    pub async fn update_device(
        &self,
        pid: u64,
        id: u64,
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
    ) -> Result<DeviceView> {
        let d = self
            .write(pid, |reply| ProjectMsg::UpdateDevice {
                id,
                name: name.clone(),
                labels: labels.clone(),
                reply,
            })
            .await?;
        let groups = self.store.project_groups(pid)?;
        Ok(self.view(&d, &groups, now_ms()))
    }

    pub async fn delete_device(&self, pid: u64, id: u64) -> Result<()> {
        self.write(pid, |reply| ProjectMsg::DeleteDevice { id, reply })
            .await
    }

    pub async fn heartbeat(
        &self,
        pid: u64,
        id: u64,
        metrics: BTreeMap<String, f64>,
    ) -> Result<HeartbeatAck> {
        self.write(pid, |reply| ProjectMsg::Heartbeat {
            id,
            metrics: metrics.clone(),
            reply,
        })
        .await?;
        Ok(HeartbeatAck { status: "online" })
    }

    pub async fn create_group(
        &self,
        pid: u64,
        name: String,
        device_ids: Vec<u64>,
    ) -> Result<GroupView> {
        self.write(pid, |reply| ProjectMsg::CreateGroup {
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
        self.write(pid, |reply| ProjectMsg::UpdateGroup {
            id,
            name: name.clone(),
            device_ids: device_ids.clone(),
            reply,
        })
        .await
        .map(|g| GroupView::from(&g))
    }

    pub async fn delete_group(&self, pid: u64, id: u64) -> Result<()> {
        self.write(pid, |reply| ProjectMsg::DeleteGroup { id, reply })
            .await
    }
}
