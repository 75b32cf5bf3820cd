//! ProjectActor: one per project, the single writer of the project's devices, groups, session
//! records and pipeline records (capsules, configurations, deployment packages and their
//! rollout results), so that invariants hold under concurrent requests. The pipeline's state
//! changes are in `pipeline.rs`.
//!
//! Its state is rebuilt from storage in `pre_start`, so a restart after a panic loses nothing
//! that was acknowledged. Reads do not pass through it (see `projects::ProjectsHandle`).

mod pipeline;

use std::collections::BTreeMap;
use std::sync::Arc;

use fleetops_storage::{
    Capsule, Configuration, Deployment, Device, DeviceGroup, DeviceResult, Project, Session,
    SessionStatus, Store, accounts::Seq,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::events::Outbox;
use crate::events::RolloutEvent;
use crate::mailbox::Envelope;
use crate::quota::Turn;
use crate::rules;
use crate::rules::deployments::{DeploymentPatch, DeploymentSpec, Transition};
use crate::secrets;
use fleetops_storage::ValidationStatus;

type Reply<T> = RpcReplyPort<Result<T>>;

pub(crate) enum ProjectMsg {
    CreateDevice {
        name: String,
        labels: BTreeMap<String, String>,
        reply: Reply<(Device, String)>,
    },
    UpdateDevice {
        id: u64,
        name: Option<String>,
        labels: Option<BTreeMap<String, String>>,
        reply: Reply<Device>,
    },
    DeleteDevice {
        id: u64,
        reply: Reply<()>,
    },
    Heartbeat {
        id: u64,
        metrics: BTreeMap<String, f64>,
        reply: Reply<()>,
    },
    CreateGroup {
        name: String,
        device_ids: Vec<u64>,
        reply: Reply<DeviceGroup>,
    },
    UpdateGroup {
        id: u64,
        name: Option<String>,
        device_ids: Option<Vec<u64>>,
        reply: Reply<DeviceGroup>,
    },
    DeleteGroup {
        id: u64,
        reply: Reply<()>,
    },
    CreateSession {
        device_id: u64,
        tags: Vec<String>,
        package_id: Option<u64>,
        reply: Reply<Session>,
    },
    /// Marks an active session completed or failed.
    EndSession {
        id: u64,
        status: SessionStatus,
        reply: Reply<Session>,
    },
    Tag {
        id: u64,
        tag: String,
        add: bool,
        reply: Reply<Session>,
    },
    DeleteSession {
        id: u64,
        reply: Reply<Vec<String>>,
    },
    CreateCapsule {
        capsule: Box<Capsule>,
        /// The organization's quota turn, released once this message is written or dropped
        /// unapplied (never while the record may still appear).
        turn: Arc<Turn>,
        reply: Reply<Capsule>,
    },
    CapsuleUploaded {
        id: u64,
        size: u64,
        reply: Reply<()>,
    },
    /// Records confirm's verdict and recomputes `is_latest` for the name. `blob_key`: the
    /// sealed copy the verdict is about (S3), recorded in the same write; `None` keeps it.
    SettleCapsule {
        id: u64,
        size: u64,
        checksum: String,
        passed: bool,
        notes: String,
        blob_key: Option<String>,
        reply: Reply<Capsule>,
    },
    /// A confirm answered 202: the validation is owed (resumed at start-up until settled).
    ValidationPending {
        id: u64,
        checksum: String,
        reply: Reply<()>,
    },
    /// Replies with the blob key to delete once durable; with `only_expired`, only a
    /// never-confirmed upload whose link has expired goes (`None`: kept).
    DeleteCapsule {
        id: u64,
        only_expired: bool,
        reply: Reply<Option<String>>,
    },
    CreateConfiguration {
        config: Box<Configuration>,
        /// As for `CreateCapsule`.
        turn: Arc<Turn>,
        reply: Reply<Configuration>,
    },
    ConfigurationUploaded {
        id: u64,
        size: u64,
        reply: Reply<()>,
    },
    /// Confirm's hashing and parsing done; inherit, check, record (`blob_key` as for
    /// `SettleCapsule`).
    SettleConfiguration {
        id: u64,
        checksum: String,
        size: u64,
        blob_key: Option<String>,
        parsed: std::result::Result<serde_json::Map<String, serde_json::Value>, String>,
        notes: Vec<String>,
        reply: Reply<Configuration>,
    },
    /// As `DeleteCapsule`.
    DeleteConfiguration {
        id: u64,
        only_expired: bool,
        reply: Reply<Option<String>>,
    },
    CreateDeployment {
        spec: Box<DeploymentSpec>,
        reply: Reply<Deployment>,
    },
    UpdateDeployment {
        id: u64,
        patch: Box<DeploymentPatch>,
        reply: Reply<Deployment>,
    },
    DeleteDeployment {
        id: u64,
        reply: Reply<()>,
    },
    TransitionDeployment {
        id: u64,
        to: Transition,
        reply: Reply<Deployment>,
    },
    /// A device's rollout result; replies with it and the device's previous status.
    ReportRollout {
        id: u64,
        device_id: u64,
        status: String,
        message: Option<String>,
        reply: Reply<DeviceResult>,
    },
    /// Fault injection for supervision tests.
    Panic,
    /// Fault injection: holds the actor up, as a slow disk would (deadline tests).
    Stall(std::time::Duration),
}

#[derive(Default)]
pub(crate) struct ProjectActor;

impl crate::keyed::KeyedChild for ProjectActor {
    type Req = ProjectMsg;
    type Ctx = ProjectCtx;
    const KIND: &'static str = "project";
}

/// What every project actor shares.
#[derive(Clone)]
pub(crate) struct ProjectCtx {
    pub store: Store,
    /// Rollout results, published once on disk.
    pub rollouts: Outbox<RolloutEvent>,
    /// What a heartbeat's `last_seen_at` is (the clock readers judge online by).
    pub clock: crate::clock::Clock,
}

pub(crate) struct ProjectState {
    /// The project as stored when the actor (re)started.
    project: Project,
    store: Store,
    rollouts: Outbox<RolloutEvent>,
    clock: crate::clock::Clock,
}

impl Actor for ProjectActor {
    type Msg = Envelope<ProjectMsg>;
    type State = ProjectState;
    type Arguments = (ProjectCtx, u64);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (
            ProjectCtx {
                store,
                rollouts,
                clock,
            },
            project_id,
        ): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let project = store
            .project(project_id)?
            .ok_or_else(|| format!("project {project_id} does not exist"))?;
        Ok(ProjectState {
            project,
            store,
            rollouts,
            clock,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        match msg {
            ProjectMsg::CreateDevice {
                name,
                labels,
                reply,
            } => {
                let _ = reply.send(st.create_device(name, labels));
            }
            ProjectMsg::UpdateDevice {
                id,
                name,
                labels,
                reply,
            } => {
                let _ = reply.send(st.update_device(id, name, labels));
            }
            ProjectMsg::DeleteDevice { id, reply } => {
                let _ = reply.send(st.delete_device(id));
            }
            ProjectMsg::Heartbeat { id, metrics, reply } => {
                let _ = reply.send(st.heartbeat(id, metrics));
            }
            ProjectMsg::CreateGroup {
                name,
                device_ids,
                reply,
            } => {
                let _ = reply.send(st.create_group(name, device_ids));
            }
            ProjectMsg::UpdateGroup {
                id,
                name,
                device_ids,
                reply,
            } => {
                let _ = reply.send(st.update_group(id, name, device_ids));
            }
            ProjectMsg::DeleteGroup { id, reply } => {
                let _ = reply.send(st.delete_group(id));
            }
            ProjectMsg::CreateSession {
                device_id,
                tags,
                package_id,
                reply,
            } => {
                let _ = reply.send(st.create_session(device_id, tags, package_id));
            }
            ProjectMsg::EndSession { id, status, reply } => {
                let _ = reply.send(st.end_session(id, status));
            }
            ProjectMsg::Tag {
                id,
                tag,
                add,
                reply,
            } => {
                let _ = reply.send(st.tag(id, tag, add));
            }
            ProjectMsg::DeleteSession { id, reply } => {
                let _ = reply.send(st.delete_session(id));
            }
            ProjectMsg::CreateCapsule {
                capsule,
                turn,
                reply,
            } => {
                let _ = reply.send(st.create_capsule(*capsule));
                drop(turn);
            }
            ProjectMsg::CapsuleUploaded { id, size, reply } => {
                let _ = reply.send(st.capsule_uploaded(id, size));
            }
            ProjectMsg::SettleCapsule {
                id,
                size,
                checksum,
                passed,
                notes,
                blob_key,
                reply,
            } => {
                let _ = reply.send(st.settle_capsule(id, size, checksum, passed, notes, blob_key));
            }
            ProjectMsg::ValidationPending {
                id,
                checksum,
                reply,
            } => {
                let _ = reply.send(st.validation_pending(id, &checksum));
            }
            ProjectMsg::CreateConfiguration {
                config,
                turn,
                reply,
            } => {
                let _ = reply.send(st.create_configuration(*config));
                drop(turn);
            }
            ProjectMsg::ConfigurationUploaded { id, size, reply } => {
                let _ = reply.send(st.configuration_uploaded(id, size));
            }
            ProjectMsg::SettleConfiguration {
                id,
                checksum,
                size,
                blob_key,
                parsed,
                notes,
                reply,
            } => {
                let _ = reply
                    .send(st.settle_configuration(id, checksum, size, blob_key, parsed, notes));
            }
            ProjectMsg::DeleteConfiguration {
                id,
                only_expired,
                reply,
            } => {
                let _ = reply.send(st.delete_configuration(id, only_expired));
            }
            ProjectMsg::CreateDeployment { spec, reply } => {
                let _ = reply.send(st.create_deployment(*spec));
            }
            ProjectMsg::UpdateDeployment { id, patch, reply } => {
                let _ = reply.send(st.update_deployment(id, *patch));
            }
            ProjectMsg::DeleteDeployment { id, reply } => {
                let _ = reply.send(st.delete_deployment(id));
            }
            ProjectMsg::TransitionDeployment { id, to, reply } => {
                let _ = reply.send(st.transition(id, to));
            }
            ProjectMsg::ReportRollout {
                id,
                device_id,
                status,
                message,
                reply,
            } => {
                match st.report_rollout(id, device_id, status, message) {
                    Ok((res, previous)) => {
                        let event = RolloutEvent {
                            project_id: st.project.id,
                            deployment_id: id,
                            device_id,
                            status: res.status,
                            previous,
                            at: res.reported_at,
                        };
                        // Answered as soon as the write is applied; then the event leaves
                        // from the writer, whatever became of the caller, once on disk.
                        let _ = reply.send(Ok(res));
                        st.rollouts.publish(event).await;
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            ProjectMsg::DeleteCapsule {
                id,
                only_expired,
                reply,
            } => {
                let _ = reply.send(st.delete_capsule(id, only_expired));
            }
            ProjectMsg::Panic => panic!("injected fault in ProjectActor {}", st.project.id),
            ProjectMsg::Stall(d) => tokio::time::sleep(d).await,
        }
        Ok(())
    }
}

impl ProjectState {
    fn pid(&self) -> u64 {
        self.project.id
    }

    fn device(&self, id: u64) -> Result<Device> {
        self.store
            .device(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Device"))
    }

    fn group(&self, id: u64) -> Result<DeviceGroup> {
        self.store
            .group(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Device group"))
    }

    fn create_device(
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

    fn update_device(
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

    fn delete_device(&self, id: u64) -> Result<()> {
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

    fn heartbeat(&self, id: u64, metrics: BTreeMap<String, f64>) -> Result<()> {
        if metrics.len() > 256 || metrics.keys().any(|k| k.is_empty() || k.len() > 128) {
            return Err(Error::unprocessable(
                "metrics",
                "at most 256 metrics with names of 1-128 bytes",
            ));
        }
        let mut d = self.device(id)?;
        d.last_seen_at = Some(self.clock.now_ms());
        d.metrics = metrics;
        self.store.update_device(&d)?;
        Ok(())
    }

    fn check_members(&self, ids: Vec<u64>) -> Result<Vec<u64>> {
        let mut ids = ids;
        ids.sort_unstable();
        ids.dedup();
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

    fn create_group(&self, name: String, device_ids: Vec<u64>) -> Result<DeviceGroup> {
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

    fn update_group(
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

    fn session(&self, id: u64) -> Result<Session> {
        self.store
            .session(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Session"))
    }

    fn create_session(
        &self,
        device_id: u64,
        tags: Vec<String>,
        package_id: Option<u64>,
    ) -> Result<Session> {
        let device = self.store.device(self.pid(), device_id)?.ok_or_else(|| {
            Error::unprocessable(
                "device_id",
                format!("device {device_id} does not exist in this project"),
            )
        })?;
        if let Some(p) = package_id
            && self.store.deployment(self.pid(), p)?.is_none()
        {
            return Err(Error::unprocessable(
                "package_id",
                format!("deployment package {p} does not exist in this project"),
            ));
        }
        let mut tags: Vec<String> = tags
            .into_iter()
            .map(|t| rules::tag("tags", &t).map(|()| t))
            .collect::<Result<_>>()?;
        tags.sort();
        tags.dedup();
        let s = Session {
            id: self.store.new_id(Seq::Session)?,
            project_id: self.pid(),
            device_id,
            device_name: device.name,
            status: SessionStatus::Active,
            started_at: now_ms(),
            ended_at: None,
            tags,
            package_id,
        };
        self.store.put_session(&s)?;
        Ok(s)
    }

    fn end_session(&self, id: u64, status: SessionStatus) -> Result<Session> {
        let mut s = self.session(id)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        s.status = status;
        s.ended_at = Some(now_ms().max(s.started_at));
        self.store.put_session(&s)?;
        Ok(s)
    }

    fn tag(&self, id: u64, tag: String, add: bool) -> Result<Session> {
        let mut s = self.session(id)?;
        if add {
            rules::tag("tag", &tag)?;
            if let Err(at) = s.tags.binary_search(&tag) {
                s.tags.insert(at, tag);
                self.store.put_session(&s)?;
            }
        } else if let Ok(at) = s.tags.binary_search(&tag) {
            s.tags.remove(at);
            self.store.put_session(&s)?;
        }
        Ok(s)
    }

    /// Returns the blob keys of the session's artifacts, for deletion once durable.
    fn delete_session(&self, id: u64) -> Result<Vec<String>> {
        let s = self.session(id)?;
        Ok(self.store.delete_session(&s)?)
    }

    fn capsule(&self, id: u64) -> Result<Capsule> {
        self.store
            .capsule(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Capsule"))
    }

    fn create_capsule(&self, mut c: Capsule) -> Result<Capsule> {
        if self
            .store
            .capsule_by_version(self.pid(), &c.name, &c.version)?
            .is_some()
        {
            return Err(Error::Conflict(format!(
                "Capsule {} {} already exists",
                c.name, c.version
            )));
        }
        c.id = self.store.new_id(Seq::Capsule)?;
        c.project_id = self.pid();
        c.blob_key =
            crate::rules::blob_keys::upload(crate::rules::blob_keys::CAPSULES, self.pid(), c.id);
        self.store.put_capsules(&[&c])?;
        Ok(c)
    }

    fn capsule_uploaded(&self, id: u64, size: u64) -> Result<()> {
        let mut c = self.capsule(id)?;
        if c.confirmed {
            return Err(Error::Conflict(
                "Capsule already confirmed; its bytes are immutable".into(),
            ));
        }
        c.uploaded_bytes = Some(size);
        c.updated_at = now_ms();
        Ok(self.store.put_capsules(&[&c])?)
    }

    /// The capsules of `name` whose `is_latest` must be rewritten (the highest passed version
    /// is latest), given the changed one or without the deleted one; the changed one is always
    /// among them.
    fn relatest(
        &self,
        name: &str,
        changed: Option<&Capsule>,
        deleted: Option<u64>,
    ) -> Result<Vec<Capsule>> {
        let mut all: Vec<Capsule> = self
            .store
            .project_capsules(self.pid())?
            .iter()
            .filter(|c| c.name == name && Some(c.id) != deleted)
            .map(|c| match changed {
                Some(ch) if ch.id == c.id => ch.clone(),
                _ => (**c).clone(),
            })
            .collect();
        let best = all
            .iter()
            .filter(|c| c.validation_status == ValidationStatus::Passed)
            .max_by_key(|c| (c.version_major, c.version_minor, c.version_patch))
            .map(|c| c.id);
        let mut moved = Vec::new();
        for c in all.iter_mut() {
            let latest = Some(c.id) == best;
            if c.is_latest != latest || changed.is_some_and(|ch| ch.id == c.id) {
                c.is_latest = latest;
                moved.push(c.clone());
            }
        }
        Ok(moved)
    }

    fn settle_capsule(
        &self,
        id: u64,
        size: u64,
        checksum: String,
        passed: bool,
        notes: String,
        blob_key: Option<String>,
    ) -> Result<Capsule> {
        let mut c = self.capsule(id)?;
        if c.confirmed {
            return Err(Error::Conflict("Capsule already confirmed".into()));
        }
        if let Some(k) = blob_key {
            c.blob_key = k;
        }
        c.checksum_sha256 = Some(checksum);
        c.uploaded_bytes = Some(size);
        c.validation_status = if passed {
            ValidationStatus::Passed
        } else {
            ValidationStatus::Failed
        };
        c.validation_notes = if passed { "ok".into() } else { notes };
        c.confirmed = true;
        c.updated_at = now_ms();
        let moved = self.relatest(&c.name, Some(&c), None)?;
        let refs: Vec<&Capsule> = moved.iter().collect();
        self.store.put_capsules(&refs)?;
        Ok(moved.into_iter().find(|m| m.id == id).unwrap_or(c))
    }

    fn validation_pending(&self, id: u64, checksum: &str) -> Result<()> {
        let c = self.capsule(id)?;
        if c.confirmed {
            return Err(Error::Conflict("Capsule already confirmed".into()));
        }
        Ok(self
            .store
            .put_pending_validation(self.pid(), id, checksum)?)
    }

    fn delete_capsule(&self, id: u64, only_expired: bool) -> Result<Option<String>> {
        let c = self.capsule(id)?;
        // The housekeeper never takes a capsule whose confirm was answered 202: its
        // validation is owed and finishes (or resumes after a restart).
        if only_expired
            && (c.confirmed
                || c.upload_expires_at > now_ms()
                || self.store.pending_validation(self.pid(), id)?.is_some())
        {
            return Ok(None);
        }
        if let Some(why) = self.capsule_in_use(id)? {
            return Err(Error::Conflict(format!(
                "Capsule {} {} is in use: {why}",
                c.name, c.version
            )));
        }
        let v = semver::Version::new(c.version_major, c.version_minor, c.version_patch);
        for o in self.store.project_capsules(self.pid())?.iter() {
            if o.id == c.id {
                continue;
            }
            for (name, constraint) in &o.dependencies {
                if *name == c.name
                    && crate::versions::Constraint::parse("dependency", constraint)
                        .is_ok_and(|k| k.matches(&v))
                {
                    return Err(Error::Conflict(format!(
                        "Capsule {} {} is a dependency of {} {}",
                        c.name, c.version, o.name, o.version
                    )));
                }
            }
        }
        let moved = self.relatest(&c.name, None, Some(c.id))?;
        let refs: Vec<&Capsule> = moved.iter().collect();
        self.store.delete_capsule(&c, &refs)?;
        Ok(Some(c.blob_key))
    }

    fn delete_group(&self, id: u64) -> Result<()> {
        let g = self.group(id)?;
        self.store.delete_group(&g)?;
        Ok(())
    }
}
