//! Where what a robot runs came from: package → capsule → commit → the test runs of that
//! commit in the project, read from the store. Shown by a package's detail, the device update
//! API and alerts naming a device; the project's policy can require a passed run before a
//! package is activated.
//!
//! A capsule's source is a repository (`owner/name`) and a full commit id (40 or 64 hex
//! characters, stored lower-case), the form the host's events carry and test runs are indexed
//! by. Only test runs of the same project count: the commit index spans projects, and another
//! project's runs are never shown. At most the 20 newest runs are shown; the policy's check
//! reads every run of the commit. Reads only; shared by the project's actor (the policy check
//! at activation) and the handles, so it imports no handle (`tests/layering.rs` checks it as
//! a writer).
//!
//! Tested through the real server, from a commit's test run to the robot's answer and the
//! passed-run policy (`tests/api/rollouts/`).

use fleetops_storage::{Deployment, RunStatus, Store, pipeline::rollouts::CapsuleSource};
use serde::Serialize;

use crate::clock::fmt_ms;
use crate::error::{Error, Result};

/// At most this many test runs of a commit are shown (newest first).
const RUNS_SHOWN: usize = 20;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Provenance {
    pub deployment: PackageRef,
    pub capsule: CapsuleRef,
    /// `None` when the capsule declared no source at upload-url.
    pub source: Option<SourceView>,
    /// The commit's test runs in this project, newest first (at most 20).
    pub test_runs: Vec<RunRef>,
    /// Whether one of them passed.
    pub passed_test_run: bool,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PackageRef {
    pub id: u64,
    pub name: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CapsuleRef {
    pub id: u64,
    pub name: String,
    pub version: String,
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SourceView {
    pub repository: String,
    pub commit_sha: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RunRef {
    pub id: u64,
    pub status: RunStatus,
    pub event: String,
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub attempt: u32,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&CapsuleSource> for SourceView {
    fn from(s: &CapsuleSource) -> Self {
        Self {
            repository: s.repository.clone(),
            commit_sha: s.commit_sha.clone(),
        }
    }
}

/// A capsule's source and its commit's runs in project `pid`.
pub fn source_and_runs(
    store: &Store,
    pid: u64,
    capsule: u64,
) -> Result<(Option<SourceView>, Vec<RunRef>)> {
    let Some(src) = store.capsule_source(capsule)? else {
        return Ok((None, Vec::new()));
    };
    let runs = store
        .commit_runs(pid, &src.repository, &src.commit_sha, RUNS_SHOWN)?
        .iter()
        .map(|r| RunRef {
            id: r.id,
            status: r.status,
            event: r.event.clone(),
            git_ref: r.git_ref.clone(),
            attempt: r.attempt,
            created_at: fmt_ms(r.created_at),
            updated_at: fmt_ms(r.updated_at),
        })
        .collect();
    Ok((Some(SourceView::from(&src)), runs))
}

/// The chain of package `d`.
pub fn of_package(store: &Store, d: &Deployment) -> Result<Provenance> {
    let c = store
        .capsule(d.project_id, d.capsule_id)?
        .ok_or_else(|| Error::Internal(format!("package {} lost its capsule", d.id)))?;
    let (source, test_runs) = source_and_runs(store, d.project_id, c.id)?;
    Ok(Provenance {
        deployment: PackageRef {
            id: d.id,
            name: d.name.clone(),
        },
        capsule: CapsuleRef {
            id: c.id,
            name: c.name,
            version: c.version,
            sha256: c.upload.checksum_sha256,
        },
        source,
        passed_test_run: test_runs.iter().any(|r| r.status == RunStatus::Passed),
        test_runs,
    })
}

/// Why the project's policy refuses to activate a package of `capsule`, if it does:
/// `require_passed_test_run` wants a passed test run of the capsule's commit.
pub fn policy_blocker(store: &Store, pid: u64, capsule: u64) -> Result<Option<String>> {
    if !store.project_policy(pid)?.require_passed_test_run {
        return Ok(None);
    }
    let Some(src) = store.capsule_source(capsule)? else {
        return Ok(Some(format!(
            "Capsule {capsule} declares no source commit; the project requires a passed test run of it"
        )));
    };
    // Every run of the commit is read: an old passed run counts as much as a new one.
    let passed = store
        .commit_runs(pid, &src.repository, &src.commit_sha, 10_000)?
        .iter()
        .any(|r| r.status == RunStatus::Passed);
    Ok((!passed).then(|| {
        format!(
            "Commit {} of {} (capsule {capsule}) has no passed test run; the project requires one",
            src.commit_sha, src.repository
        )
    }))
}

/// Checks a declared source: `owner/name` as the host spells it, and a full commit id (40 hex
/// characters for SHA-1, 64 for SHA-256; stored lower-case), the form the host's events carry
/// and test runs are indexed by (an abbreviated id would never match one).
pub fn checked_source(repository: &str, commit_sha: &str) -> Result<CapsuleSource> {
    let ok_repo = repository.len() <= 200
        && repository.split_once('/').is_some_and(|(o, n)| {
            let part = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            };
            part(o) && part(n)
        });
    if !ok_repo {
        return Err(Error::unprocessable(
            "source.repository",
            "must be owner/name",
        ));
    }
    if !matches!(commit_sha.len(), 40 | 64) || !commit_sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::unprocessable(
            "source.commit_sha",
            "must be a full commit id: 40 or 64 hexadecimal characters",
        ));
    }
    Ok(CapsuleSource {
        repository: repository.to_string(),
        commit_sha: commit_sha.to_ascii_lowercase(),
    })
}
