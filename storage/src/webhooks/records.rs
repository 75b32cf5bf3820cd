//! Webhook deliveries, host installations, repository links and holds, and test runs.

use serde::{Deserialize, Serialize};

use crate::states::{DeliveryOutcome, InstallationState, RunStatus};

/// An accepted (correctly signed, first-seen) inbound webhook delivery; its payload is kept
/// apart (`Store::payload`) so outcome updates never rewrite it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    /// Arrival order (the processing order).
    pub seq: u64,
    /// The host's delivery UUID, lower-case.
    pub delivery_id: String,
    pub event: String,
    pub action: Option<String>,
    pub received_at: i64,
    pub status_code: u16,
    pub outcome: DeliveryOutcome,
    pub reason: Option<String>,
    pub installation_id: Option<u64>,
    pub repository: Option<String>,
    pub project_id: Option<u64>,
    pub test_run_id: Option<u64>,
    pub payload_len: u64,
    /// Where the payload is in the payload log (subscribed events only).
    pub payload_at: Option<(u64, u64)>,
}

impl Delivery {
    /// A delivery as the intake accepts it: `queued` for the worker when `subscribed`, else
    /// `ignored` (`event_ignored`); its payload is placed by `Store::claim_deliveries`.
    pub fn received(
        seq: u64,
        delivery_id: String,
        event: String,
        received_at: i64,
        subscribed: bool,
        payload_len: u64,
    ) -> Self {
        Self {
            seq,
            delivery_id,
            event,
            action: None,
            received_at,
            status_code: 202,
            outcome: if subscribed {
                DeliveryOutcome::Queued
            } else {
                DeliveryOutcome::Ignored
            },
            reason: (!subscribed).then(|| "event_ignored".into()),
            installation_id: None,
            repository: None,
            project_id: None,
            test_run_id: None,
            payload_len,
            payload_at: None,
        }
    }
}

/// A source-host installation (the host's app installed on an account).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Installation {
    pub id: u64,
    pub account_login: String,
    pub account_type: String,
    pub repository_selection: String,
    pub state: InstallationState,
    /// Repositories it holds now (full names as the host spells them).
    pub repositories: Vec<String>,
    /// Repositories removed from it (history).
    pub removed: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// The organization an installation is bound to: its deliveries resolve only to links of
/// that organization's projects. Kept beside the installation record (whose layout predates
/// it), written by the installation's actor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallationBinding {
    /// `None` while unbound (its deliveries are skipped `installation_unbound`).
    pub organization_id: Option<u64>,
    /// Organizations it was moved away from (newest last, at most 16): their links of its
    /// repositories show `disconnected` rather than `pending`.
    pub former: Vec<u64>,
}

impl InstallationBinding {
    /// At most this many former organizations are remembered.
    pub const FORMER_MAX: usize = 16;

    /// Binds to `org`, remembering the organization it leaves.
    pub fn bind(&mut self, org: u64) {
        if let Some(old) = self.organization_id.filter(|&o| o != org) {
            self.former.retain(|&o| o != old);
            self.former.push(old);
        }
        self.former.retain(|&o| o != org);
        if self.former.len() > Self::FORMER_MAX {
            let cut = self.former.len() - Self::FORMER_MAX;
            self.former.drain(..cut);
        }
        self.organization_id = Some(org);
    }
}

/// A repository linked to a project.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepoLink {
    pub id: u64,
    pub project_id: u64,
    pub full_name: String,
    pub branch_patterns: Vec<String>,
    pub include_drafts: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Which installation holds a repository, and whether it still does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepoHold {
    pub installation_id: u64,
    /// false once removed from the installation (the repository is then disconnected).
    pub current: bool,
}

/// A test run dispatched for a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRun {
    pub id: u64,
    pub project_id: u64,
    pub repository: String,
    pub commit_sha: String,
    /// The branch (pull request head, pushed branch, check suite or workflow branch).
    pub git_ref: String,
    /// pull_request, push, check_suite, workflow_run.
    pub event: String,
    pub pull_request_number: Option<u64>,
    pub status: RunStatus,
    pub attempt: u32,
    pub idempotency_key: String,
    pub delivery_id: Option<String>,
    pub summary: Option<String>,
    /// A JSON object (workflow run links), as JSON bytes.
    pub urls_json: Vec<u8>,
    pub lease_expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl TestRun {
    /// Whether the run holds its idempotency key (a cancelled run does not).
    pub fn holds_key(&self) -> bool {
        self.status != RunStatus::Cancelled
    }
    pub fn in_flight(&self) -> bool {
        matches!(self.status, RunStatus::Queued | RunStatus::Running)
    }
}
