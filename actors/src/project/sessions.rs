//! The ProjectActor's state changes for session records: creation, ending, tags, deletion.

use super::ProjectState;
use crate::clock::now_ms;
use crate::error::Error;
use crate::error::Result;
use crate::rules;
use fleetops_storage::Session;
use fleetops_storage::SessionStatus;
use fleetops_storage::accounts::Seq;

impl ProjectState {
    pub(super) fn session(&self, id: u64) -> Result<Session> {
        self.store
            .session(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Session"))
    }

    pub(super) fn create_session(
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
        rules::at_most("tags", tags.len(), rules::MAX_TAGS)?;
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

    pub(super) fn set_log_retention(
        &self,
        r: fleetops_storage::sessions::LogRetention,
    ) -> Result<fleetops_storage::sessions::LogRetention> {
        self.store.put_log_retention(self.pid(), &r)?;
        Ok(r)
    }

    pub(super) fn end_session(&self, id: u64, status: SessionStatus) -> Result<Session> {
        let mut s = self.session(id)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        s.status = status;
        s.ended_at = Some(now_ms().max(s.started_at));
        self.store.put_session(&s)?;
        Ok(s)
    }

    pub(super) fn tag(&self, id: u64, tag: String, add: bool) -> Result<Session> {
        let mut s = self.session(id)?;
        if add {
            rules::tag("tag", &tag)?;
            if let Err(at) = s.tags.binary_search(&tag) {
                rules::at_most("tags", s.tags.len() + 1, rules::MAX_TAGS)?;
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
    pub(super) fn delete_session(&self, id: u64) -> Result<Vec<String>> {
        let s = self.session(id)?;
        Ok(self.store.delete_session(&s)?)
    }
}
