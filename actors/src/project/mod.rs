//! ProjectActor: one per project, started on first use, the single writer of the project's
//! records: devices (their heartbeats and kept metric samples), groups, session records
//! (status, tags, deletion), the pipeline (capsules, configurations, deployment packages,
//! devices' reports, rollout plans and decisions, the rollout policy) and alerting's
//! integrations and rules. One writer is what keeps uniqueness, `is_latest`, references (a
//! rule's integrations and groups, whatever a deletion would leave dangling) and state
//! transitions true under concurrent requests. This file holds the actor and its `apply_*` (its
//! messages, one sub-enum per family, in `messages.rs`); the state changes of each family are in their own file (`devices`, `sessions`, `capsules`,
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
//! Tested by the unit tests in `tests.rs` (through its mailbox on a temporary store, no HTTP), through
//! the API tests of devices, sessions, the pipeline, rollouts and alerts, and with panics and
//! stalls injected (`tests/api/supervision/`).

pub(crate) mod alerting;
mod capsules;
mod configurations;
mod deployments;
mod devices;
pub mod enrollment;
pub mod handle;
mod messages;
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

pub(crate) use messages::{AlertingMsg, DevicesMsg, PipelineMsg, ProjectMsg, SessionsMsg};

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
        match msg {
            ProjectMsg::Devices(m) => self.apply_devices(m),
            ProjectMsg::Sessions(m) => self.apply_sessions(m),
            ProjectMsg::Pipeline(m) => self.apply_pipeline(m),
            ProjectMsg::Alerting(m) => self.apply_alerting(m),
            #[cfg(feature = "fault-injection")]
            ProjectMsg::Panic | ProjectMsg::Stall(_) => None,
        }
    }

    fn apply_devices(&mut self, msg: DevicesMsg) -> Option<RolloutEvent> {
        let st = self;
        match msg {
            DevicesMsg::CreateDevice {
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
            DevicesMsg::UpdateDevice {
                id,
                name,
                labels,
                reply,
            } => {
                let r = st.update_device(id, name, labels);
                st.reassigned();
                let _ = reply.send(r);
            }
            DevicesMsg::DeleteDevice { id, reply } => {
                let r = st.delete_device(id);
                st.reassigned();
                let _ = reply.send(r);
            }
            DevicesMsg::Heartbeat { id, metrics, reply } => {
                let _ = reply.send(st.heartbeat(id, metrics));
            }
            DevicesMsg::CreateEnrollmentToken { spec, reply } => {
                let _ = reply.send(st.create_enrollment_token(*spec));
            }
            DevicesMsg::DeleteEnrollmentToken { id, reply } => {
                let _ = reply.send(st.delete_enrollment_token(id));
            }
            DevicesMsg::Enroll {
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
            DevicesMsg::CreateGroup {
                name,
                device_ids,
                reply,
            } => {
                let r = st.create_group(name, device_ids);
                st.reassigned();
                let _ = reply.send(r);
            }
            DevicesMsg::UpdateGroup {
                id,
                name,
                device_ids,
                reply,
            } => {
                let r = st.update_group(id, name, device_ids);
                st.reassigned();
                let _ = reply.send(r);
            }
            DevicesMsg::DeleteGroup { id, reply } => {
                let r = st.delete_group(id);
                st.reassigned();
                let _ = reply.send(r);
            }
        }
        None
    }

    fn apply_sessions(&mut self, msg: SessionsMsg) -> Option<RolloutEvent> {
        let st = self;
        match msg {
            SessionsMsg::CreateSession {
                device_id,
                tags,
                package_id,
                reply,
            } => {
                let _ = reply.send(st.create_session(device_id, tags, package_id));
            }
            SessionsMsg::EndSession { id, status, reply } => {
                let _ = reply.send(st.end_session(id, status));
            }
            SessionsMsg::Tag {
                id,
                tag,
                add,
                reply,
            } => {
                let _ = reply.send(st.tag(id, tag, add));
            }
            SessionsMsg::DeleteSession { id, reply } => {
                let _ = reply.send(st.delete_session(id));
            }
            SessionsMsg::SetLogRetention { retention, reply } => {
                let _ = reply.send(st.set_log_retention(retention));
            }
        }
        None
    }

    fn apply_pipeline(&mut self, msg: PipelineMsg) -> Option<RolloutEvent> {
        let st = self;
        match msg {
            PipelineMsg::CreateCapsule {
                capsule,
                source,
                turn,
                reply,
            } => {
                let _ = reply.send(st.create_capsule(*capsule, source, turn.mark));
                drop(turn);
            }
            PipelineMsg::Uploaded {
                kind,
                id,
                size,
                reply,
            } => {
                let _ = reply.send(st.uploaded(kind, id, size));
            }
            PipelineMsg::SettleCapsule {
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
            PipelineMsg::ValidationPending {
                id,
                checksum,
                reply,
            } => {
                let _ = reply.send(st.validation_pending(id, &checksum));
            }
            PipelineMsg::CreateConfiguration {
                config,
                turn,
                reply,
            } => {
                let _ = reply.send(st.create_configuration(*config, turn.mark));
                drop(turn);
            }
            PipelineMsg::SettleConfiguration {
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
            PipelineMsg::DeleteUpload {
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
            PipelineMsg::CreateDeployment { spec, reply } => {
                let _ = reply.send(st.create_deployment(*spec));
            }
            PipelineMsg::UpdateDeployment { id, patch, reply } => {
                let _ = reply.send(st.update_deployment(id, *patch));
            }
            PipelineMsg::DeleteDeployment { id, reply } => {
                let _ = reply.send(st.delete_deployment(id));
            }
            PipelineMsg::TransitionDeployment { id, to, reply } => {
                let r = st.transition(id, to);
                st.reassigned();
                let _ = reply.send(r);
            }
            PipelineMsg::ReportRollout {
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
            PipelineMsg::SetPolicy { policy, reply } => {
                let _ = reply.send(st.set_policy(policy));
            }
            PipelineMsg::RetryDevice {
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
            PipelineMsg::Rollout {
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
        }
        None
    }

    fn apply_alerting(&mut self, msg: AlertingMsg) -> Option<RolloutEvent> {
        let st = self;
        match msg {
            AlertingMsg::CreateIntegration {
                kind,
                name,
                enabled,
                config,
                reply,
            } => {
                let _ = reply.send(st.create_integration(kind, name, enabled, config));
            }
            AlertingMsg::UpdateIntegration {
                id,
                kind,
                name,
                enabled,
                config,
                reply,
            } => {
                let _ = reply.send(st.update_integration(id, kind, name, enabled, config));
            }
            AlertingMsg::DeleteIntegration { id, reply } => {
                let _ = reply.send(st.delete_integration(id));
            }
            AlertingMsg::CreateAlertRule { draft, reply } => {
                let _ = reply.send(st.create_alert_rule(*draft));
            }
            AlertingMsg::UpdateAlertRule { id, patch, reply } => {
                let _ = reply.send(st.update_alert_rule(id, *patch));
            }
            AlertingMsg::DeleteAlertRule { id, reply } => {
                let _ = reply.send(st.delete_alert_rule(id));
            }
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

#[cfg(test)]
mod tests;
