//! ProjectActor: one per project, started on first use, the single writer of the project's
//! records: devices (their heartbeats and kept metric samples), groups, session records
//! (status, tags, deletion), the pipeline (capsules, configurations, deployment packages,
//! devices' reports, rollout plans and decisions, the rollout policy) and alerting's
//! integrations and rules. One writer is what keeps uniqueness, `is_latest`, references (a
//! rule's integrations and groups, whatever a deletion would leave dangling) and state
//! transitions true under concurrent requests. This file holds the actor and its message enum;
//! the state changes of each family are in their own file (`devices`, `sessions`, `capsules`,
//! `configurations`, `deployments`, `alerting`), and the handle in `handle.rs`.
//!
//! With several servers on one database, each message is applied inside the project's
//! section (`fleetops_storage::sections`): one server's actor at a time, every write fenced
//! by the section's counter, so the one-writer guarantees hold across servers too.
//!
//! Invariants a change must keep:
//! - Each message is one atomic write, answered as soon as it is applied; the handles answer
//!   their callers once it is durable. Reads do not pass through the actor (see
//!   `projects::ProjectsHandle`).
//! - A write that can change which package a device should run (a device or group changed, a
//!   package's transition, a rollout's decision) bumps the project's generation in
//!   `assignments` after it is applied and before it is answered.
//! - A device's rollout result is handed to the events outbox (`events`) by the actor itself,
//!   after its reply, so it is published once on disk whatever became of the caller.
//! - The creation of a capsule or configuration carries the organization's quota turn
//!   (`quota`), released once the record is written or the message is dropped unapplied.
//! - It keeps nothing storage does not hold, beyond the project record and when each device's
//!   last metric sample was kept, so a restart after a panic loses nothing that was
//!   acknowledged.
//!
//! Tested by the unit tests below (through its mailbox on a temporary store, no HTTP), through
//! the API tests of devices, sessions, the pipeline, rollouts and alerts, and with panics and
//! stalls injected (`tests/api/supervision.rs`).

pub(crate) mod alerting;
mod capsules;
mod configurations;
mod deployments;
mod devices;
pub mod enrollment;
pub mod handle;
mod sessions;

use std::collections::BTreeMap;
use std::sync::Arc;

use fleetops_storage::{
    Capsule, Configuration, Deployment, Device, DeviceGroup, Project, Session, SessionStatus, Store,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::error::Result;
use crate::events::Outbox;
use crate::events::RolloutEvent;
use crate::mailbox::Envelope;
use crate::quota::Turn;
use crate::rules::blob_keys::UploadKind;
use crate::rules::deployments::{DeploymentPatch, DeploymentSpec, Transition};

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
        reply: Reply<i64>,
    },
    CreateEnrollmentToken {
        spec: Box<enrollment::TokenSpec>,
        reply: Reply<(
            fleetops_storage::devices::enrollment::EnrollmentToken,
            String,
        )>,
    },
    DeleteEnrollmentToken {
        id: u64,
        reply: Reply<()>,
    },
    /// A robot registers itself with the enrollment token whose SHA-256 is `hash`.
    Enroll {
        hash: [u8; 32],
        name: String,
        labels: BTreeMap<String, String>,
        attempt: Option<[u8; 32]>,
        reply: Reply<(Device, String)>,
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
        /// Where its code came from, if declared.
        source: Option<fleetops_storage::pipeline::rollouts::CapsuleSource>,
        /// The organization's quota turn, released once this message is written or dropped
        /// unapplied (never while the record may still appear).
        turn: Arc<Turn>,
        reply: Reply<Capsule>,
    },
    /// The bytes of a capsule or configuration were stored (refused once confirmed).
    Uploaded {
        kind: UploadKind,
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
    CreateConfiguration {
        config: Box<Configuration>,
        /// As for `CreateCapsule`.
        turn: Arc<Turn>,
        reply: Reply<Configuration>,
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
    /// Removes a capsule or configuration record; replies with the blob key to delete once
    /// durable. With `only_expired`, only a never-confirmed upload whose link has expired goes
    /// (`None`: kept). Each kind refuses while something still refers to it.
    DeleteUpload {
        kind: UploadKind,
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
    CreateIntegration {
        kind: fleetops_storage::IntegrationType,
        name: String,
        enabled: bool,
        config: serde_json::Value,
        reply: Reply<fleetops_storage::Integration>,
    },
    UpdateIntegration {
        id: u64,
        kind: Option<fleetops_storage::IntegrationType>,
        name: Option<String>,
        enabled: Option<bool>,
        config: Option<serde_json::Map<String, serde_json::Value>>,
        reply: Reply<fleetops_storage::Integration>,
    },
    /// Also takes it out of every rule.
    DeleteIntegration {
        id: u64,
        reply: Reply<()>,
    },
    CreateAlertRule {
        draft: Box<alerting::RuleDraft>,
        reply: Reply<fleetops_storage::AlertRule>,
    },
    UpdateAlertRule {
        id: u64,
        patch: Box<alerting::RulePatch>,
        reply: Reply<fleetops_storage::AlertRule>,
    },
    DeleteAlertRule {
        id: u64,
        reply: Reply<()>,
    },
    /// A device's report on a package; `any_state` admits the intermediate states.
    ReportRollout {
        id: u64,
        device_id: u64,
        status: String,
        message: Option<String>,
        any_state: bool,
        reply: Reply<fleetops_storage::pipeline::rollouts::DeviceProgress>,
    },
    /// The project's own retention of ended sessions.
    SetLogRetention {
        retention: fleetops_storage::sessions::LogRetention,
        reply: Reply<fleetops_storage::sessions::LogRetention>,
    },
    /// The project's rollout policy.
    SetPolicy {
        policy: fleetops_storage::pipeline::rollouts::ProjectPolicy,
        reply: Reply<fleetops_storage::pipeline::rollouts::ProjectPolicy>,
    },
    /// A rollout's step (its controller) or a member's action on it.
    /// A member offers a failed package again to one device; replies with its offer count.
    RetryDevice {
        id: u64,
        device_id: u64,
        /// Who asked (the history's entry names them).
        by: String,
        reply: Reply<u32>,
    },
    Rollout {
        id: u64,
        action: crate::rules::rollouts::RolloutAction,
        /// A controller's lease, which the write checks (several nodes); `None` for a member.
        fence: Option<fleetops_storage::leases::Fence>,
        reply: Reply<(fleetops_storage::pipeline::rollouts::Rollout, bool)>,
    },
    /// Fault injection for supervision tests.
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Fault injection: holds the actor up, as a slow disk would (deadline tests).
    #[cfg(feature = "fault-injection")]
    Stall(std::time::Duration),
}

impl ProjectMsg {
    /// Answers the request with `e()`, unapplied (its project's organization was deleted
    /// after the request got past its lookup).
    fn refuse(self, e: impl Fn() -> crate::Error) {
        macro_rules! refuse {
            ($($v:ident),*) => {
                match self {
                    $(ProjectMsg::$v { reply, .. } => {
                        let _ = reply.send(Err(e()));
                    })*
                    #[cfg(feature = "fault-injection")]
                    ProjectMsg::Panic | ProjectMsg::Stall(_) => {}
                }
            };
        }
        refuse!(
            CreateDevice,
            UpdateDevice,
            DeleteDevice,
            Heartbeat,
            CreateEnrollmentToken,
            DeleteEnrollmentToken,
            Enroll,
            CreateGroup,
            UpdateGroup,
            DeleteGroup,
            CreateSession,
            EndSession,
            Tag,
            DeleteSession,
            CreateCapsule,
            Uploaded,
            SettleCapsule,
            ValidationPending,
            CreateConfiguration,
            SettleConfiguration,
            DeleteUpload,
            CreateDeployment,
            UpdateDeployment,
            DeleteDeployment,
            TransitionDeployment,
            CreateIntegration,
            UpdateIntegration,
            DeleteIntegration,
            CreateAlertRule,
            UpdateAlertRule,
            DeleteAlertRule,
            ReportRollout,
            SetLogRetention,
            SetPolicy,
            RetryDevice,
            Rollout
        );
    }
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
    /// Told of every write that may change which package a device should run.
    pub assignments: std::sync::Arc<crate::assignments::Assignments>,
    /// What a heartbeat's `last_seen_at` is (the clock readers judge online by).
    pub clock: crate::clock::Clock,
    pub alerting: alerting::AlertingCtx,
}

pub(crate) struct ProjectState {
    /// The project as stored when the actor (re)started.
    project: Project,
    store: Store,
    rollouts: Outbox<RolloutEvent>,
    assignments: std::sync::Arc<crate::assignments::Assignments>,
    clock: crate::clock::Clock,
    alerting: alerting::AlertingCtx,
    /// When each device's last metric sample was kept (this incarnation).
    last_sample: std::collections::HashMap<u64, i64>,
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
                assignments,
                clock,
                alerting,
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
            assignments,
            clock,
            alerting,
            last_sample: std::collections::HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The project's one writer across servers too (several nodes on one database). Entered
        // before the request is taken on: a caller whose deadline passes while another node
        // holds the section has been answered 503, and its request is then never applied.
        let section = st
            .store
            .section(
                &format!("project/{}", st.pid()),
                fleetops_storage::sections::Cached::Project(st.pid()),
            )
            .await;
        let Some(msg) = msg.open() else {
            // Its caller gave up before it got here: never applied.
            return Ok(());
        };
        // Checked as the request is taken on (the handle checks before sending it too): a
        // request queued before its organization's deletion writes nothing after it.
        if st.store.project_retired(st.pid()) {
            msg.refuse(|| crate::Error::not_found("Project"));
            return Ok(());
        }
        #[cfg(feature = "fault-injection")]
        let msg = match msg {
            ProjectMsg::Panic => panic!("injected fault in ProjectActor {}", st.project.id),
            ProjectMsg::Stall(d) => {
                tokio::time::sleep(d).await;
                return Ok(());
            }
            msg => msg,
        };
        let mut section = match section {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(project = st.pid(), error = %e, "could not enter the project's section");
                msg.refuse(|| crate::Error::Unavailable {
                    retry_after_secs: 1,
                });
                return Ok(());
            }
        };
        let event = section.run(|| st.apply(msg));
        drop(section);
        if let Some(event) = event {
            st.rollouts.publish(event).await;
        }
        Ok(())
    }
}

impl ProjectState {
    /// Applies one message and answers it; a device's rollout result comes back, to be
    /// published once the section is left.
    fn apply(&mut self, msg: ProjectMsg) -> Option<RolloutEvent> {
        let st = self;
        match msg {
            ProjectMsg::CreateDevice {
                name,
                labels,
                reply,
            } => {
                // A new device may be a target (labels): it joins the packages' phase maps.
                let r = st.create_device(name, labels);
                if r.is_ok() {
                    st.reassigned();
                }
                let _ = reply.send(r);
            }
            ProjectMsg::UpdateDevice {
                id,
                name,
                labels,
                reply,
            } => {
                let r = st.update_device(id, name, labels);
                st.reassigned();
                let _ = reply.send(r);
            }
            ProjectMsg::DeleteDevice { id, reply } => {
                let r = st.delete_device(id);
                st.reassigned();
                let _ = reply.send(r);
            }
            ProjectMsg::Heartbeat { id, metrics, reply } => {
                let _ = reply.send(st.heartbeat(id, metrics));
            }
            ProjectMsg::CreateEnrollmentToken { spec, reply } => {
                let _ = reply.send(st.create_enrollment_token(*spec));
            }
            ProjectMsg::DeleteEnrollmentToken { id, reply } => {
                let _ = reply.send(st.delete_enrollment_token(id));
            }
            ProjectMsg::Enroll {
                hash,
                name,
                labels,
                attempt,
                reply,
            } => {
                // A new device may be a target (labels), as one created by a member.
                let r = st.enroll(hash, name, labels, attempt);
                if r.is_ok() {
                    st.reassigned();
                }
                let _ = reply.send(r);
            }
            ProjectMsg::CreateGroup {
                name,
                device_ids,
                reply,
            } => {
                let r = st.create_group(name, device_ids);
                st.reassigned();
                let _ = reply.send(r);
            }
            ProjectMsg::UpdateGroup {
                id,
                name,
                device_ids,
                reply,
            } => {
                let r = st.update_group(id, name, device_ids);
                st.reassigned();
                let _ = reply.send(r);
            }
            ProjectMsg::DeleteGroup { id, reply } => {
                let r = st.delete_group(id);
                st.reassigned();
                let _ = reply.send(r);
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
                source,
                turn,
                reply,
            } => {
                let _ = reply.send(st.create_capsule(*capsule, source, turn.mark));
                drop(turn);
            }
            ProjectMsg::Uploaded {
                kind,
                id,
                size,
                reply,
            } => {
                let _ = reply.send(st.uploaded(kind, id, size));
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
                let _ = reply.send(st.create_configuration(*config, turn.mark));
                drop(turn);
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
            ProjectMsg::DeleteUpload {
                kind,
                id,
                only_expired,
                reply,
            } => {
                let _ = reply.send(match kind {
                    UploadKind::Capsule => st.delete_capsule(id, only_expired),
                    UploadKind::Configuration => st.delete_configuration(id, only_expired),
                });
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
                let r = st.transition(id, to);
                st.reassigned();
                let _ = reply.send(r);
            }
            ProjectMsg::CreateIntegration {
                kind,
                name,
                enabled,
                config,
                reply,
            } => {
                let _ = reply.send(st.create_integration(kind, name, enabled, config));
            }
            ProjectMsg::UpdateIntegration {
                id,
                kind,
                name,
                enabled,
                config,
                reply,
            } => {
                let _ = reply.send(st.update_integration(id, kind, name, enabled, config));
            }
            ProjectMsg::DeleteIntegration { id, reply } => {
                let _ = reply.send(st.delete_integration(id));
            }
            ProjectMsg::CreateAlertRule { draft, reply } => {
                let _ = reply.send(st.create_alert_rule(*draft));
            }
            ProjectMsg::UpdateAlertRule { id, patch, reply } => {
                let _ = reply.send(st.update_alert_rule(id, *patch));
            }
            ProjectMsg::DeleteAlertRule { id, reply } => {
                let _ = reply.send(st.delete_alert_rule(id));
            }
            ProjectMsg::ReportRollout {
                id,
                device_id,
                status,
                message,
                any_state,
                reply,
            } => {
                match st.report_rollout(id, device_id, status, message, any_state) {
                    Ok((res, previous)) => {
                        let event = res.state.result().map(|status| RolloutEvent {
                            project_id: st.project.id,
                            deployment_id: id,
                            device_id,
                            status,
                            previous,
                            at: res.at,
                        });
                        // Answered as soon as the write is applied; then the event leaves
                        // from the writer, whatever became of the caller, once on disk.
                        let _ = reply.send(Ok(res));
                        return event;
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            ProjectMsg::SetPolicy { policy, reply } => {
                let _ = reply.send(st.set_policy(policy));
            }
            ProjectMsg::SetLogRetention { retention, reply } => {
                let _ = reply.send(st.set_log_retention(retention));
            }
            ProjectMsg::RetryDevice {
                id,
                device_id,
                by,
                reply,
            } => {
                let r = st.retry_device(id, device_id, by);
                if r.is_ok() {
                    st.reassigned();
                }
                let _ = reply.send(r);
            }
            ProjectMsg::Rollout {
                id,
                action,
                fence,
                reply,
            } => {
                let r = st.rollout_action(id, action, fence.as_ref());
                if r.as_ref().is_ok_and(|(_, changed)| *changed) {
                    st.reassigned();
                }
                let _ = reply.send(r);
            }
            #[cfg(feature = "fault-injection")]
            ProjectMsg::Panic | ProjectMsg::Stall(_) => {}
        }
        None
    }

    fn pid(&self) -> u64 {
        self.project.id
    }

    /// After a write that may change which package a device should run, before its reply.
    fn reassigned(&self) {
        self.assignments.changed(self.project.id);
    }
}

/// The ProjectActor driven through its mailbox on a temporary store, with no HTTP: devices
/// and groups keep their invariants (members exist, a deleted device leaves its groups), a
/// heartbeat stamps the runtime's clock, and the actor restarted from storage sees it all.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::clock::{Clock, now_ms};
    use crate::error::Error;
    use crate::mailbox::ask;
    use fleetops_storage::ValidationStatus;
    use fleetops_storage::accounts::Seq;

    async fn spawn(store: &Store, clock: &Clock, pid: u64) -> ActorRef<Envelope<ProjectMsg>> {
        let ctx = ProjectCtx {
            store: store.clone(),
            rollouts: Outbox::start(store.clone()),
            assignments: std::sync::Arc::new(crate::assignments::Assignments::new(16)),
            clock: clock.clone(),
            alerting: alerting::AlertingCtx {
                sealer: crate::secrets::Sealer::new(&[1; 32]).unwrap(),
                allow_private_targets: false,
                history_resolution_ms: 10_000,
                max_rules: 500,
                max_integrations_per_rule: 20,
            },
        };
        Actor::spawn(None, ProjectActor, (ctx, pid))
            .await
            .unwrap()
            .0
    }

    /// A store on a temporary directory holding one project; the directory lives as long as
    /// the first element.
    fn project_store() -> (tempfile::TempDir, Store, u64) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let pid = store.new_id(Seq::Project).unwrap();
        store
            .insert_project(&Project {
                id: pid,
                org_id: 1,
                slug: "p".into(),
                name: "p".into(),
                secret_hash: [0; 32],
                created_at: 0,
            })
            .unwrap();
        (dir, store, pid)
    }

    #[tokio::test]
    async fn devices_and_groups_keep_their_invariants_across_a_restart() {
        let (_dir, store, pid) = project_store();
        let clock = Clock::default();
        let a = spawn(&store, &clock, pid).await;
        let device = |name: &str| {
            let name = name.to_string();
            ask(&a, move |reply| ProjectMsg::CreateDevice {
                name,
                labels: BTreeMap::new(),
                reply,
            })
        };
        let (d1, token) = device("r1").await.unwrap();
        assert!(token.starts_with("fopsd_"));
        let (d2, _) = device("r2").await.unwrap();
        assert!(matches!(device("").await, Err(Error::Unprocessable(_))));

        // Members must exist; a deleted device leaves its groups.
        let bad = ask(&a, |reply| ProjectMsg::CreateGroup {
            name: "g".into(),
            device_ids: vec![d1.id, 999],
            reply,
        })
        .await;
        assert!(matches!(bad, Err(Error::Unprocessable(_))));
        let g = ask(&a, |reply| ProjectMsg::CreateGroup {
            name: "g".into(),
            device_ids: vec![d2.id, d1.id, d1.id],
            reply,
        })
        .await
        .unwrap();
        assert_eq!(g.device_ids, vec![d1.id, d2.id]);
        ask(&a, |reply| ProjectMsg::DeleteDevice { id: d1.id, reply })
            .await
            .unwrap();
        assert_eq!(
            store.group(pid, g.id).unwrap().unwrap().device_ids,
            vec![d2.id]
        );

        // A heartbeat stamps the runtime's clock.
        clock.advance(std::time::Duration::from_secs(3600));
        let before = clock.now_ms();
        ask(&a, |reply| ProjectMsg::Heartbeat {
            id: d2.id,
            metrics: BTreeMap::from([("cpu".to_string(), 0.5)]),
            reply,
        })
        .await
        .unwrap();
        let seen = store
            .device(pid, d2.id)
            .unwrap()
            .unwrap()
            .last_seen_at
            .unwrap();
        assert!(seen >= before && seen <= clock.now_ms());

        // A new incarnation, from storage: the same devices and group.
        a.stop(None);
        let a = spawn(&store, &clock, pid).await;
        let missing = ask(&a, |reply| ProjectMsg::Heartbeat {
            id: d1.id,
            metrics: BTreeMap::new(),
            reply,
        })
        .await;
        assert!(matches!(missing, Err(Error::NotFound(_))));
        let g = ask(&a, |reply| ProjectMsg::UpdateGroup {
            id: g.id,
            name: Some("g2".into()),
            device_ids: None,
            reply,
        })
        .await
        .unwrap();
        assert_eq!((g.name.as_str(), g.device_ids.clone()), ("g2", vec![d2.id]));
        a.stop(None);
    }

    fn capsule(name: &str, version: &str, deps: &[(&str, &str)], expires_at: i64) -> Capsule {
        let v = semver::Version::parse(version).unwrap();
        Capsule {
            id: 0,
            project_id: 0,
            name: name.into(),
            version: version.into(),
            version_major: v.major,
            version_minor: v.minor,
            version_patch: v.patch,
            description: None,
            capsule_type: "SW".into(),
            file_size_bytes: 10,
            metadata_json: b"{}".to_vec(),
            dependencies: deps
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string()))
                .collect(),
            is_latest: false,
            upload: fleetops_storage::UploadState::pending("tar.gz".into(), expires_at),
            created_at: 0,
            updated_at: 0,
        }
    }

    /// The pipeline half of the writer: a capsule's upload, verdict and `is_latest`, the
    /// immutability of confirmed bytes, and the references that keep one from being deleted.
    #[tokio::test]
    async fn capsules_settle_move_latest_and_refuse_deletion_while_referred_to() {
        let (_dir, store, pid) = project_store();
        let clock = Clock::default();
        let a = spawn(&store, &clock, pid).await;
        let create = |c: Capsule| {
            ask(&a, move |reply| ProjectMsg::CreateCapsule {
                capsule: Box::new(c),
                source: None,
                turn: crate::quota::Turn::detached(),
                reply,
            })
        };
        let settle = |id: u64, passed: bool| {
            ask(&a, move |reply| ProjectMsg::SettleCapsule {
                id,
                size: 10,
                checksum: "ab".repeat(32),
                passed,
                notes: "bad archive".into(),
                blob_key: None,
                reply,
            })
        };
        let far = now_ms() + 3_600_000;
        let v1 = create(capsule("arm", "1.0.0", &[], far)).await.unwrap();
        assert!(matches!(
            create(capsule("arm", "1.0.0", &[], far)).await,
            Err(Error::Conflict(_))
        ));
        let v2 = create(capsule("arm", "1.1.0", &[], far)).await.unwrap();
        for id in [v1.id, v2.id] {
            ask(&a, |reply| ProjectMsg::Uploaded {
                kind: UploadKind::Capsule,
                id,
                size: 10,
                reply,
            })
            .await
            .unwrap();
        }

        // Only a passed version can be latest; the highest passed one is.
        let failed = settle(v2.id, false).await.unwrap();
        assert_eq!(
            (failed.upload.validation_status, failed.is_latest),
            (ValidationStatus::Failed, false)
        );
        assert_eq!(failed.upload.validation_notes, "bad archive");
        let passed = settle(v1.id, true).await.unwrap();
        assert!(passed.is_latest);
        let v3 = create(capsule("arm", "2.0.0", &[], far)).await.unwrap();
        settle(v3.id, true).await.unwrap();
        assert!(!store.capsule(pid, v1.id).unwrap().unwrap().is_latest);
        assert!(store.capsule(pid, v3.id).unwrap().unwrap().is_latest);

        // Confirmed bytes are immutable, and a verdict is given once.
        let again = ask(&a, |reply| ProjectMsg::Uploaded {
            kind: UploadKind::Capsule,
            id: v1.id,
            size: 11,
            reply,
        })
        .await;
        assert!(matches!(again, Err(Error::Conflict(_))));
        assert!(matches!(settle(v1.id, true).await, Err(Error::Conflict(_))));

        // A dependency is kept while a capsule depends on it; the housekeeper's delete
        // (`only_expired`) leaves a confirmed or unexpired record alone.
        let app = create(capsule("app", "1.0.0", &[("arm", "^2")], far))
            .await
            .unwrap();
        let delete = |id: u64, only_expired: bool| {
            ask(&a, move |reply| ProjectMsg::DeleteUpload {
                kind: UploadKind::Capsule,
                id,
                only_expired,
                reply,
            })
        };
        assert!(matches!(
            delete(v3.id, false).await,
            Err(Error::Conflict(_))
        ));
        assert_eq!(delete(v3.id, true).await.unwrap(), None);
        assert_eq!(delete(app.id, true).await.unwrap(), None);
        let expired = create(capsule("old", "1.0.0", &[], now_ms() - 1))
            .await
            .unwrap();
        assert_eq!(
            delete(expired.id, true).await.unwrap(),
            Some(expired.upload.blob_key.clone())
        );
        assert!(store.capsule(pid, expired.id).unwrap().is_none());

        // Deleting the latest moves `is_latest` back, and a new incarnation sees it.
        delete(app.id, false).await.unwrap();
        delete(v3.id, false).await.unwrap();
        a.stop(None);
        let a = spawn(&store, &clock, pid).await;
        assert!(store.capsule(pid, v1.id).unwrap().unwrap().is_latest);
        let gone = ask(&a, |reply| ProjectMsg::SettleCapsule {
            id: v3.id,
            size: 10,
            checksum: String::new(),
            passed: true,
            notes: String::new(),
            blob_key: None,
            reply,
        })
        .await;
        assert!(matches!(gone, Err(Error::NotFound(_))));
        a.stop(None);
    }
}
