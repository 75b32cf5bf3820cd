//! The ProjectActor's state changes for enrollment tokens and the devices that enroll with
//! them.

use std::collections::BTreeMap;

use fleetops_storage::Device;
use fleetops_storage::StorageError;
use fleetops_storage::accounts::Seq;
use fleetops_storage::enrollment::EnrollmentToken;

use super::ProjectState;
use crate::error::{Error, Result};
use crate::rules;
use crate::secrets;

/// Tokens a project holds at most.
pub const MAX_ENROLLMENT_TOKENS: usize = 100;
/// The longest a token may be made to last: a year.
pub const MAX_ENROLLMENT_SECONDS: u64 = 366 * 86_400;

/// What a new token is made of.
#[derive(Clone)]
pub struct TokenSpec {
    pub name: String,
    pub single_use: bool,
    pub expires_in_seconds: Option<u64>,
    pub labels: BTreeMap<String, String>,
}

impl ProjectState {
    pub(super) fn create_enrollment_token(
        &self,
        spec: TokenSpec,
    ) -> Result<(EnrollmentToken, String)> {
        let name = rules::name("name", &spec.name, 200)?;
        rules::labels(&spec.labels)?;
        let now = self.clock.now_ms();
        let expires_at = match spec.expires_in_seconds {
            None => None,
            Some(s) if (1..=MAX_ENROLLMENT_SECONDS).contains(&s) => {
                Some(now.saturating_add(s as i64 * 1000))
            }
            Some(_) => {
                return Err(Error::unprocessable(
                    "expires_in_seconds",
                    format!("must be between 1 and {MAX_ENROLLMENT_SECONDS}"),
                ));
            }
        };
        if self
            .store
            .enrollment_tokens(self.pid(), MAX_ENROLLMENT_TOKENS)?
            .len()
            >= MAX_ENROLLMENT_TOKENS
        {
            return Err(Error::Conflict(format!(
                "A project holds at most {MAX_ENROLLMENT_TOKENS} enrollment tokens; revoke one first"
            )));
        }
        let token = secrets::new_enrollment_token()?;
        let t = EnrollmentToken {
            id: self.store.new_id(Seq::EnrollmentToken)?,
            project_id: self.pid(),
            name,
            token_hash: secrets::sha256(token.as_bytes()),
            single_use: spec.single_use,
            expires_at,
            labels: spec.labels,
            uses: 0,
            last_used_at: None,
            created_at: now,
        };
        self.store.insert_enrollment_token(&t)?;
        Ok((t, token))
    }

    pub(super) fn delete_enrollment_token(&self, id: u64) -> Result<()> {
        let t = self
            .store
            .enrollment_token(self.pid(), id)?
            .ok_or_else(|| Error::not_found("Enrollment token"))?;
        self.store.delete_enrollment_token(&t)?;
        Ok(())
    }

    /// Registers a robot with the token whose SHA-256 is `hash`: the device and its token.
    /// An unknown, revoked, used-up or expired token is 401, and nothing is written.
    pub(super) fn enroll(
        &self,
        hash: [u8; 32],
        name: String,
        labels: BTreeMap<String, String>,
    ) -> Result<(Device, String)> {
        let now = self.clock.now_ms();
        let t = self
            .store
            .enrollment_token_by_hash(&hash)?
            .filter(|t| t.project_id == self.pid())
            .filter(|t| t.expires_at.is_none_or(|e| now < e))
            .ok_or(Error::Unauthorized)?;
        let name = rules::name("name", &name, 200)?;
        let mut all = t.labels.clone();
        all.extend(labels);
        rules::labels(&all)?;
        let token = secrets::new_device_token()?;
        let d = Device {
            id: self.store.new_id(Seq::Device)?,
            project_id: self.pid(),
            name,
            labels: all,
            token_hash: secrets::sha256(token.as_bytes()),
            created_at: now,
            last_seen_at: None,
            metrics: BTreeMap::new(),
        };
        match self.store.enroll_device(&d, &t, now) {
            Ok(()) => Ok((d, token)),
            // Used up or revoked since it was read (outside this actor: a purge).
            Err(StorageError::Conflict(_)) => Err(Error::Unauthorized),
            Err(e) => Err(e.into()),
        }
    }
}
