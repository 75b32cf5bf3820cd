//! Alerting: integrations (where notifications go), alert rules, the per-project rule
//! evaluator and the notifier. This file holds the handle `http/` calls; each concept has
//! its own file. Integrations and rules are written by the project's actor (so a rule's
//! references and a group's deletion are decided by one writer); alerts by the project's
//! evaluator; notification outcomes by the notifier.

pub mod integrations;
pub mod rules;
pub mod sender;

use crate::clock::Clock;
use crate::project::handle::ProjectsHandle;
use crate::secrets::Sealer;
use fleetops_storage::Store;

pub use integrations::{IntegrationPatch, IntegrationRequest, IntegrationView, TestResult};
pub use rules::{RulePatchRequest, RuleRequest, RuleView};

#[derive(Clone)]
pub struct AlertsHandle {
    pub(crate) projects: ProjectsHandle,
    pub(crate) store: Store,
    pub(crate) sealer: Sealer,
    pub(crate) sender: sender::Sender,
    pub(crate) clock: Clock,
}
