//! The ProjectActor's state changes for enrollment tokens and the devices that enroll with
//! them.

use std::collections::BTreeMap;

use fleetops_storage::Device;
use fleetops_storage::StorageError;
use fleetops_storage::accounts::Seq;
use fleetops_storage::devices::enrollment::EnrollmentToken;

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
    /// The keys a robot may set its own labels under.
    pub allowed_label_keys: Vec<String>,
}

/// A robot asking again with its enrollment id gets its device within this long of its
/// enrollment (and only while the device was never seen).
pub const ENROLLMENT_RETRY_MS: i64 = 24 * 3600 * 1000;

/// The hash an enrollment a robot names is kept under: its token's hash and its enrollment
/// id (1-64 letters, digits and `-`; 422 otherwise).
pub fn enrollment_attempt(token_hash: &[u8; 32], enrollment_id: &str) -> Result<[u8; 32]> {
    if enrollment_id.is_empty()
        || enrollment_id.len() > 64
        || !enrollment_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(Error::unprocessable(
            "enrollment_id",
            "1-64 letters, digits and -",
        ));
    }
    let mut data = token_hash.to_vec();
    data.extend_from_slice(enrollment_id.as_bytes());
    Ok(secrets::sha256(&data))
}

/// A token allows a robot this many label keys at most.
pub const MAX_ALLOWED_LABEL_KEYS: usize = 64;

/// The labels of a robot enrolling with `labels` on a token: the token's, fixed, and the
/// robot's own under the keys the token allows. A label under another key is 422 naming it
/// (one of the token's own keys too, unless the robot asks for the token's value).
fn enrolled_labels(
    token: &EnrollmentToken,
    robot: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    let mut all = token.labels.clone();
    for (k, v) in robot {
        match token.labels.get(&k) {
            Some(fixed) if *fixed == v => {}
            Some(fixed) => {
                return Err(Error::unprocessable(
                    "labels",
                    format!("{k:?} is {fixed:?} for every robot of this enrollment token"),
                ));
            }
            None if token.allowed_label_keys.contains(&k) => {
                all.insert(k, v);
            }
            None => {
                return Err(Error::unprocessable(
                    "labels",
                    format!("this enrollment token lets a robot set no label {k:?}"),
                ));
            }
        }
    }
    Ok(all)
}

impl ProjectState {
    pub(super) fn create_enrollment_token(
        &self,
        spec: TokenSpec,
    ) -> Result<(EnrollmentToken, String)> {
        let name = rules::name("name", &spec.name, 200)?;
        rules::labels(&spec.labels)?;
        let keys = &spec.allowed_label_keys;
        if keys.len() > MAX_ALLOWED_LABEL_KEYS
            || keys.iter().any(|k| k.is_empty() || k.chars().count() > 128)
        {
            return Err(Error::unprocessable(
                "allowed_label_keys",
                format!("at most {MAX_ALLOWED_LABEL_KEYS} keys of 1-128 characters"),
            ));
        }
        if let Some(k) = keys.iter().find(|k| spec.labels.contains_key(*k)) {
            return Err(Error::unprocessable(
                "allowed_label_keys",
                format!("{k:?} is one of the token's own labels, fixed for its robots"),
            ));
        }
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
            allowed_label_keys: {
                let mut k = spec.allowed_label_keys;
                k.sort();
                k.dedup();
                k
            },
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
    /// `attempt` (the robot named its enrollment): the device that enrollment made, when it
    /// did and the device was never seen since, is answered again with a new token (the
    /// robot lost the first answer), whatever became of the token since.
    pub(super) fn enroll(
        &self,
        hash: [u8; 32],
        name: String,
        labels: BTreeMap<String, String>,
        attempt: Option<[u8; 32]>,
    ) -> Result<(Device, String)> {
        let now = self.clock.now_ms();
        if let Some(a) = &attempt
            && let Some((pid, id)) = self.store.enrollment_attempt(a)?
            && pid == self.pid()
            && let Some(d) = self.store.device(pid, id)?
        {
            if d.last_seen_at.is_some() || now - d.created_at > ENROLLMENT_RETRY_MS {
                return Err(Error::Unauthorized);
            }
            let token = secrets::new_device_token()?;
            let again = Device {
                token_hash: secrets::sha256(token.as_bytes()),
                ..d.clone()
            };
            return match self.store.replace_device_token(&d, &again) {
                Ok(()) => Ok((again, token)),
                // Seen meanwhile: its robot has its token.
                Err(StorageError::Conflict(_)) => Err(Error::Unauthorized),
                Err(e) => Err(e.into()),
            };
        }
        let t = self
            .store
            .enrollment_token_by_hash(&hash)?
            .filter(|t| t.project_id == self.pid())
            .filter(|t| t.expires_at.is_none_or(|e| now < e))
            .ok_or(Error::Unauthorized)?;
        let name = rules::name("name", &name, 200)?;
        let all = enrolled_labels(&t, labels)?;
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
        match self.store.enroll_device(&d, &t, now, attempt.as_ref()) {
            Ok(()) => Ok((d, token)),
            // Used up or revoked since it was read (outside this actor: a purge).
            Err(StorageError::Conflict(_)) => Err(Error::Unauthorized),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn token(labels: &[(&str, &str)], allowed: &[&str]) -> EnrollmentToken {
        EnrollmentToken {
            id: 1,
            project_id: 1,
            name: "line".into(),
            token_hash: [0; 32],
            single_use: false,
            expires_at: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            uses: 0,
            last_used_at: None,
            created_at: 0,
            allowed_label_keys: allowed.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn map(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_tokens_labels_are_fixed_and_a_robot_adds_only_under_allowed_keys() {
        let t = token(&[("fleet", "staging")], &["site"]);
        assert_eq!(
            enrolled_labels(&t, map(&[("site", "lyon")])).unwrap(),
            map(&[("fleet", "staging"), ("site", "lyon")])
        );
        // Asking for the token's own value is no change.
        assert_eq!(
            enrolled_labels(&t, map(&[("fleet", "staging")])).unwrap(),
            map(&[("fleet", "staging")])
        );
        let e = enrolled_labels(&t, map(&[("fleet", "prod")])).unwrap_err();
        assert!(
            matches!(&e, Error::Unprocessable(m) if m.contains("\"fleet\"")),
            "{e:?}"
        );
        let e = enrolled_labels(&t, map(&[("owner", "me")])).unwrap_err();
        assert!(
            matches!(&e, Error::Unprocessable(m) if m.contains("\"owner\"")),
            "{e:?}"
        );
        // By default a robot adds nothing.
        let t = token(&[], &[]);
        assert!(enrolled_labels(&t, map(&[("site", "lyon")])).is_err());
        assert_eq!(enrolled_labels(&t, map(&[])).unwrap(), map(&[]));
    }
}
