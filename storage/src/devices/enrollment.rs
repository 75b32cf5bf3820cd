//! Enrollment tokens: what lets a new robot register itself in a project and get its own
//! device token, with no user credential on the robot. A token is stored as its SHA-256 only,
//! under its project (`enr/{project}/{id}`) and indexed by that hash (`ix-enr/{hash}`: the
//! project and id). Revoking one deletes both. A device enrolled with one is written in the
//! same write as the token's use: a single-use token is deleted by it, another has its use
//! counted, and the write is guarded on the token still being what was read, so one
//! single-use token never enrolls two robots. An enrollment a robot named (its enrollment
//! id) is indexed in that write too (`ix-enr-at/{hash}`: the project and device), so the
//! robot asking again, its first answer lost, finds its device.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Device, Result, Store, Writes, keys};

/// An enrollment token as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnrollmentToken {
    pub id: u64,
    pub project_id: u64,
    pub name: String,
    pub token_hash: [u8; 32],
    /// Enrolls one robot, then is gone.
    pub single_use: bool,
    /// Unix ms after which it enrolls nothing; `None`: until revoked.
    pub expires_at: Option<i64>,
    /// Labels every device enrolled with it has, whatever the robot asks.
    pub labels: BTreeMap<String, String>,
    /// Devices enrolled with it.
    pub uses: u64,
    pub last_used_at: Option<i64>,
    pub created_at: i64,
    /// The label keys a robot enrolling with it may set labels under (none of `labels`).
    pub allowed_label_keys: Vec<String>,
}

/// The layout of a token before `allowed_label_keys`: read, never written.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct EnrollmentTokenV1 {
    id: u64,
    project_id: u64,
    name: String,
    token_hash: [u8; 32],
    single_use: bool,
    expires_at: Option<i64>,
    labels: BTreeMap<String, String>,
    uses: u64,
    last_used_at: Option<i64>,
    created_at: i64,
}

/// A stored token in either layout (an older one runs out of bytes as the current one).
fn decode_token(bytes: &[u8]) -> Result<EnrollmentToken> {
    crate::codec::decode::<EnrollmentToken>(bytes).or_else(|_| {
        crate::codec::decode::<EnrollmentTokenV1>(bytes).map(|t| EnrollmentToken {
            id: t.id,
            project_id: t.project_id,
            name: t.name,
            token_hash: t.token_hash,
            single_use: t.single_use,
            expires_at: t.expires_at,
            labels: t.labels,
            uses: t.uses,
            last_used_at: t.last_used_at,
            created_at: t.created_at,
            allowed_label_keys: Vec::new(),
        })
    })
}

impl Store {
    /// Stores a new token with its index entry.
    pub fn insert_enrollment_token(&self, t: &EnrollmentToken) -> Result<()> {
        let mut w = Writes::new();
        w.put(keys::enrollment(t.project_id, t.id), t)?;
        w.claim(
            keys::enrollment_by_hash(&t.token_hash),
            pair(t.project_id, t.id),
            "enrollment token",
        );
        self.apply(w)
    }

    /// A project's tokens, oldest first, at most `limit`.
    pub fn enrollment_tokens(&self, project: u64, limit: usize) -> Result<Vec<EnrollmentToken>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::enrollment_prefix(project))
            .take(limit)
        {
            let (_, v) = kv?;
            out.push(decode_token(&v)?);
        }
        Ok(out)
    }

    pub fn enrollment_token(&self, project: u64, id: u64) -> Result<Option<EnrollmentToken>> {
        match self.inner.records.get(keys::enrollment(project, id))? {
            Some(v) => decode_token(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The token whose SHA-256 is `hash`, wherever it is.
    pub fn enrollment_token_by_hash(&self, hash: &[u8; 32]) -> Result<Option<EnrollmentToken>> {
        let Some(v) = self.inner.records.get(keys::enrollment_by_hash(hash))? else {
            return Ok(None);
        };
        match crate::webhooks::pair(&v) {
            Some((p, id)) => self.enrollment_token(p, id),
            None => Ok(None),
        }
    }

    /// Revokes a token: it and its index entry go.
    pub fn delete_enrollment_token(&self, t: &EnrollmentToken) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::enrollment(t.project_id, t.id));
        w.delete(keys::enrollment_by_hash(&t.token_hash));
        self.apply(w)
    }

    /// The project and device the enrollment attempt `hash` enrolled, if any (the device
    /// may have been deleted since).
    pub fn enrollment_attempt(&self, hash: &[u8; 32]) -> Result<Option<(u64, u64)>> {
        Ok(self
            .inner
            .records
            .get(keys::enrollment_attempt(hash))?
            .and_then(|v| crate::webhooks::pair(&v)))
    }

    /// Gives device `old` the token of `new` (the same device, never seen yet): the old
    /// token no longer authenticates it. Fails with [`crate::StorageError::Conflict`] once
    /// the device has another token or was seen.
    pub fn replace_device_token(&self, old: &Device, new: &Device) -> Result<()> {
        let mut w = Writes::new();
        let had = old.token_hash;
        w.guard(keys::device(old.project_id, old.id), "device", move |v| {
            v.and_then(|v| crate::codec::decode::<Device>(v).ok())
                .is_some_and(|d| d.token_hash == had && d.last_seen_at.is_none())
        });
        w.delete(keys::device_by_token(&old.token_hash));
        w.put_listed(keys::device(new.project_id, new.id), new)?;
        w.0.insert(
            keys::device_by_token(&new.token_hash),
            pair(new.project_id, new.id),
        );
        self.apply(w)
    }

    /// Stores device `d`, enrolled with `used` (as read), in one write with the token's use:
    /// a single-use token goes, another counts the use; `attempt` (the enrollment's hash,
    /// when the robot named one) is indexed to the device. Fails with
    /// [`crate::StorageError::Conflict`] when the token changed since it was read.
    pub fn enroll_device(
        &self,
        d: &Device,
        used: &EnrollmentToken,
        at: i64,
        attempt: Option<&[u8; 32]>,
    ) -> Result<()> {
        let mut w = Writes::new();
        if let Some(a) = attempt {
            w.0.insert(keys::enrollment_attempt(a), pair(d.project_id, d.id));
        }
        let read = used.clone();
        w.guard(
            keys::enrollment(used.project_id, used.id),
            "enrollment token",
            move |v| v.and_then(|v| decode_token(v).ok()).as_ref() == Some(&read),
        );
        if used.single_use {
            w.delete(keys::enrollment(used.project_id, used.id));
            w.delete(keys::enrollment_by_hash(&used.token_hash));
        } else {
            let next = EnrollmentToken {
                uses: used.uses + 1,
                last_used_at: Some(at),
                ..used.clone()
            };
            w.put(keys::enrollment(used.project_id, used.id), &next)?;
        }
        w.put_listed(keys::device(d.project_id, d.id), d)?;
        w.0.insert(
            keys::device_by_token(&d.token_hash),
            pair(d.project_id, d.id),
        );
        self.apply(w)
    }
}

fn pair(a: u64, b: u64) -> Vec<u8> {
    let mut v = a.to_be_bytes().to_vec();
    v.extend_from_slice(&b.to_be_bytes());
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::on_each_engine;

    fn token(id: u64, single_use: bool) -> EnrollmentToken {
        EnrollmentToken {
            id,
            project_id: 1,
            name: "line".into(),
            token_hash: [id as u8; 32],
            single_use,
            expires_at: None,
            labels: BTreeMap::new(),
            uses: 0,
            last_used_at: None,
            created_at: 0,
            allowed_label_keys: Vec::new(),
        }
    }

    fn device(id: u64) -> Device {
        Device {
            id,
            project_id: 1,
            name: format!("r{id}"),
            labels: BTreeMap::new(),
            token_hash: [100 + id as u8; 32],
            created_at: 0,
            last_seen_at: None,
            metrics: BTreeMap::new(),
        }
    }

    fn a_single_use_token_enrolls_one_device_and_goes() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let t = token(1, true);
        store.insert_enrollment_token(&t).unwrap();
        assert_eq!(
            store.enrollment_token_by_hash(&t.token_hash).unwrap(),
            Some(t.clone())
        );
        store
            .enroll_device(&device(1), &t, 5, Some(&[9; 32]))
            .unwrap();
        assert_eq!(store.enrollment_token_by_hash(&t.token_hash).unwrap(), None);
        assert_eq!(store.enrollment_attempt(&[9; 32]).unwrap(), Some((1, 1)));
        assert_eq!(store.enrollment_attempt(&[8; 32]).unwrap(), None);
        // A second enrollment on the token as first read is refused, writing nothing.
        let r = store.enroll_device(&device(2), &t, 6, Some(&[8; 32]));
        assert!(matches!(r, Err(crate::StorageError::Conflict(_))), "{r:?}");
        assert!(store.device(1, 2).unwrap().is_none());
        assert!(store.device(1, 1).unwrap().is_some());
        assert_eq!(store.enrollment_attempt(&[8; 32]).unwrap(), None);
        // Its token replaced, the device answers to the new one only.
        let old = store.device(1, 1).unwrap().unwrap();
        let new = Device {
            token_hash: [77; 32],
            ..old.clone()
        };
        store.replace_device_token(&old, &new).unwrap();
        assert!(store.device_by_token(&old.token_hash).unwrap().is_none());
        assert_eq!(store.device_by_token(&[77; 32]).unwrap().unwrap().id, 1);
        // Once replaced, the old device as read is no longer there to replace.
        let r = store.replace_device_token(&old, &new);
        assert!(matches!(r, Err(crate::StorageError::Conflict(_))), "{r:?}");
    }
    on_each_engine!(a_single_use_token_enrolls_one_device_and_goes);

    fn a_reusable_token_counts_its_uses_until_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let t = token(2, false);
        store.insert_enrollment_token(&t).unwrap();
        store.enroll_device(&device(1), &t, 5, None).unwrap();
        let t = store.enrollment_token(1, 2).unwrap().unwrap();
        assert_eq!((t.uses, t.last_used_at), (1, Some(5)));
        store.enroll_device(&device(2), &t, 6, None).unwrap();
        assert_eq!(store.enrollment_tokens(1, 10).unwrap()[0].uses, 2);
        store.delete_enrollment_token(&t).unwrap();
        assert_eq!(store.enrollment_token_by_hash(&t.token_hash).unwrap(), None);
        assert!(store.enrollment_tokens(1, 10).unwrap().is_empty());
    }
    on_each_engine!(a_reusable_token_counts_its_uses_until_revoked);

    /// A token stored before `allowed_label_keys` is read (allowing no key), listed, and
    /// enrolls a device under its guard.
    fn a_token_of_the_earlier_layout_is_read_and_used() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let old = EnrollmentTokenV1 {
            id: 3,
            project_id: 1,
            name: "line".into(),
            token_hash: [3; 32],
            single_use: false,
            expires_at: None,
            labels: BTreeMap::from([("fleet".into(), "staging".into())]),
            uses: 0,
            last_used_at: None,
            created_at: 0,
        };
        let mut w = crate::engine::Batch::default();
        w.insert(keys::enrollment(1, 3), crate::codec::encode(&old).unwrap());
        w.insert(keys::enrollment_by_hash(&[3; 32]), pair(1, 3));
        store.inner.records.apply_batch(w).unwrap();
        let t = store.enrollment_token_by_hash(&[3; 32]).unwrap().unwrap();
        assert_eq!(t.labels["fleet"], "staging");
        assert!(t.allowed_label_keys.is_empty());
        assert_eq!(
            store.enrollment_tokens(1, 10).unwrap(),
            std::slice::from_ref(&t)
        );
        store.enroll_device(&device(1), &t, 5, None).unwrap();
        assert_eq!(store.enrollment_token(1, 3).unwrap().unwrap().uses, 1);
    }
    on_each_engine!(a_token_of_the_earlier_layout_is_read_and_used);
}
