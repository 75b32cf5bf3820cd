//! Blob keys of the pipeline: built from ids and a SHA-256 fleetops computed itself, never
//! from names.
//!
//! An upload link (on S3 the store's own presigned `PUT`, which cannot be revoked) writes
//! `upload`. On S3, confirm seals the bytes: it copies them under `sealed`, a folder no
//! upload link targets, validates that copy and points the record at `content`, so a late
//! `PUT` to the old link changes nothing a record vouches for. Each record has its own folder
//! (ids, not only the hash), so two records with the same bytes never share an object and
//! deleting one never takes the other's bytes.

pub(crate) const CAPSULES: &str = "capsules";
pub(crate) const CONFIGURATIONS: &str = "configurations";
/// Sealed log segments (`fleetops_storage::sessions::segments`): `logs/{project}/{session}/...`.
pub(crate) const LOGS: &str = "logs";

/// A project's folder of `kind`: every upload and sealed copy of its records.
pub(crate) fn project_folder(kind: &str, pid: u64) -> String {
    format!("{kind}/{pid}")
}

/// Where the upload link writes (and, on the local backend, where the bytes stay).
pub(crate) fn upload(kind: &str, pid: u64, id: u64) -> String {
    format!("{kind}/{pid}/{id}")
}

/// The record's private folder of sealed copies.
pub(crate) fn sealed(kind: &str, pid: u64, id: u64) -> String {
    format!("{kind}/{pid}/sealed/{id}")
}

/// The copy confirm validates (S3 capsules): taken before hashing, never recorded.
pub(crate) fn staging(kind: &str, pid: u64, id: u64) -> String {
    format!("{}/staging", sealed(kind, pid, id))
}

/// The validated bytes, addressed by their SHA-256 (lowercase hex, computed by fleetops).
pub(crate) fn content(kind: &str, pid: u64, id: u64, sha256_hex: &str) -> String {
    format!("{}/sha256-{sha256_hex}", sealed(kind, pid, id))
}

/// What an upload link, a lock or a blob folder is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UploadKind {
    Capsule,
    Configuration,
}

impl UploadKind {
    /// The name signed into links (`kind`).
    pub const fn as_str(self) -> &'static str {
        match self {
            UploadKind::Capsule => "capsule",
            UploadKind::Configuration => "configuration",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "capsule" => Some(UploadKind::Capsule),
            "configuration" => Some(UploadKind::Configuration),
            _ => None,
        }
    }

    /// The blob folder of its records.
    pub const fn folder(self) -> &'static str {
        match self {
            UploadKind::Capsule => CAPSULES,
            UploadKind::Configuration => CONFIGURATIONS,
        }
    }

    /// For messages: "Capsule", "Configuration".
    pub const fn noun(self) -> &'static str {
        match self {
            UploadKind::Capsule => "Capsule",
            UploadKind::Configuration => "Configuration",
        }
    }
}
