//! The REST handlers, one file per resource family; [`dispatch`] maps each operation of the
//! route table (`router/`) to its handler. A handler parses, authorizes, makes one call into
//! the runtime and maps the reply; no business rule lives here, and a handler writes nothing
//! itself.
//!
//! Invariants a new handler keeps:
//! - Authentication, the rate limit and authorization come first, through [`Cx`] (401 → 429 →
//!   403 → 404); the body is read only after them, always under a size cap (413), then parsed
//!   (400, or 422 naming a field that does not fit) and checked by the runtime (422, 409): the
//!   order `lib.rs` states.
//! - What it answers is described in `openapi/` (`answers.rs`), whose exhaustive matches on the operation
//!   make a new one fail to compile until it is described.
//!
//! Tested through the real server (`tests/api/`), including malformed and hostile input
//! (`bad_input.rs`), the order of checks, and schemathesis against the served OpenAPI
//! document.

pub(crate) mod accounts;
pub(crate) mod alerts;
pub(crate) mod artifacts;
pub(crate) mod capsules;
pub(crate) mod configurations;
pub(crate) mod deployments;
pub(crate) mod devices;
pub(crate) mod links;
pub(crate) mod ops;
pub(crate) mod sessions;
pub(crate) mod updates;
pub(crate) mod webhooks;

use http::Response;

use crate::app::{Cx, Req};
use crate::error::ApiResult;
use crate::response::Body;
use crate::router::Op;
use fleetops_actors::pipeline::rollouts::RolloutAction;

pub async fn dispatch(op: Op, cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    match op {
        Op::Healthz => ops::healthz(cx),
        Op::Readyz => ops::readyz(cx).await,
        Op::Metrics => ops::metrics(cx, &req),
        Op::Backup => ops::backup(cx, req).await,
        Op::AdminOrgs => ops::admin_orgs(cx, req).await,
        Op::OpenApi => ops::openapi(cx),
        Op::Login => accounts::login(cx, req).await,
        Op::Refresh => accounts::refresh(cx, req).await,
        Op::Logout => accounts::logout(cx, req).await,
        Op::CreateApiKey => accounts::create_api_key(cx, req).await,
        Op::ListApiKeys => accounts::list_api_keys(cx, req).await,
        Op::DeleteApiKey => accounts::delete_api_key(cx, req).await,
        Op::Me => accounts::me(cx, req).await,
        Op::CreateUser => accounts::create_user(cx, req).await,
        Op::CreateOrg => accounts::create_org(cx, req).await,
        Op::ListOrgs => accounts::list_orgs(cx, req).await,
        Op::GetOrg => accounts::get_org(cx, req).await,
        Op::PatchOrg => accounts::patch_org(cx, req).await,
        Op::DeleteOrg => accounts::delete_org(cx, req).await,
        Op::AddMember => accounts::add_member(cx, req).await,
        Op::CreateProject => accounts::create_project(cx, req).await,
        Op::ListProjects => accounts::list_projects(cx, req).await,
        Op::RotateSecret => accounts::rotate_secret(cx, req).await,
        Op::OrgDevices => devices::org_devices(cx, req).await,
        Op::CreateDevice => devices::create(cx, req).await,
        Op::CreateEnrollmentToken => devices::create_enrollment_token(cx, req).await,
        Op::ListEnrollmentTokens => devices::enrollment_tokens(cx, req).await,
        Op::DeleteEnrollmentToken => devices::delete_enrollment_token(cx, req).await,
        Op::Enroll => devices::enroll(cx, req).await,
        Op::ListDevices => devices::list(cx, req).await,
        Op::GetDevice => devices::get(cx, req).await,
        Op::PatchDevice => devices::patch(cx, req).await,
        Op::DeleteDevice => devices::delete(cx, req).await,
        Op::Heartbeat => devices::heartbeat(cx, req).await,
        Op::CreateGroup => devices::create_group(cx, req).await,
        Op::ListGroups => devices::list_groups(cx, req).await,
        Op::GetGroup => devices::get_group(cx, req).await,
        Op::PatchGroup => devices::patch_group(cx, req).await,
        Op::DeleteGroup => devices::delete_group(cx, req).await,
        Op::CreateSession => sessions::create(cx, req).await,
        Op::ListSessions => sessions::list(cx, req).await,
        Op::GetSession => sessions::get(cx, req).await,
        Op::DeleteSession => sessions::delete(cx, req).await,
        Op::AddTag => sessions::add_tag(cx, req).await,
        Op::RemoveTag => sessions::remove_tag(cx, req).await,
        Op::AppendLogs => sessions::append_logs(cx, req).await,
        Op::QueryLogs => sessions::query_logs(cx, req).await,
        Op::CompleteSession => sessions::complete(cx, req).await,
        Op::ExportLogs => sessions::export_logs(cx, req).await,
        Op::PutFile => artifacts::put(cx, req).await,
        Op::ListFiles => artifacts::list(cx, req).await,
        Op::GetFile => artifacts::get(cx, req).await,
        Op::DownloadFiles => artifacts::download(cx, req).await,
        Op::LiveLogs => crate::ws::live_logs(cx, req).await,
        Op::CapsuleUploadUrl => capsules::upload_url(cx, req).await,
        Op::CapsuleConfirm => capsules::confirm(cx, req).await,
        Op::ListCapsules => capsules::list(cx, req).await,
        Op::GetCapsule => capsules::get(cx, req).await,
        Op::DeleteCapsule => capsules::delete(cx, req).await,
        Op::Upload => links::upload(cx, req).await,
        Op::Download => links::download(cx, req).await,
        Op::ConfigUploadUrl => configurations::upload_url(cx, req).await,
        Op::ConfigConfirm => configurations::confirm(cx, req).await,
        Op::ListConfigs => configurations::list(cx, req).await,
        Op::GetConfig => configurations::get(cx, req).await,
        Op::ExplainConfig => configurations::explain(cx, req).await,
        Op::DeleteConfig => configurations::delete(cx, req).await,
        Op::CreateDeployment => deployments::create(cx, req).await,
        Op::PlanDeployment => deployments::plan(cx, req).await,
        Op::ListDeployments => deployments::list(cx, req).await,
        Op::GetDeployment => deployments::get(cx, req).await,
        Op::PatchDeployment => deployments::patch(cx, req).await,
        Op::DeleteDeployment => deployments::delete(cx, req).await,
        Op::ActivateDeployment => {
            deployments::transition(
                cx,
                req,
                fleetops_actors::pipeline::deployments::Transition::Activate,
            )
            .await
        }
        Op::DeprecateDeployment => {
            deployments::transition(
                cx,
                req,
                fleetops_actors::pipeline::deployments::Transition::Deprecate,
            )
            .await
        }
        Op::DeviceStatus => deployments::device_status(cx, req).await,
        Op::DeviceUpdate => updates::current(cx, req).await,
        Op::GetRollout => deployments::rollout(cx, req).await,
        Op::GetPolicy => deployments::policy(cx, req).await,
        Op::GetLogRetention => sessions::log_retention(cx, req).await,
        Op::PatchLogRetention => sessions::set_log_retention(cx, req).await,
        Op::PatchPolicy => deployments::set_policy(cx, req).await,
        Op::PauseRollout => deployments::rollout_action(cx, req, RolloutAction::Pause).await,
        Op::ResumeRollout => deployments::rollout_action(cx, req, RolloutAction::Resume).await,
        Op::AbortRollout => deployments::rollout_action(cx, req, RolloutAction::Abort).await,
        Op::RetryDevice => deployments::retry_device(cx, req).await,
        Op::DeviceUpdateStatus => updates::report(cx, req).await,
        Op::DeviceHistory => updates::history(cx, req).await,
        Op::ScmWebhook => webhooks::receive(cx, req).await,
        Op::ScmRotate => webhooks::rotate(cx, req).await,
        Op::ScmStatus => webhooks::status(cx, req).await,
        Op::ScmInstallations => webhooks::installations(cx, req).await,
        Op::BindInstallation => webhooks::bind_installation(cx, req).await,
        Op::ScmDeliveries => webhooks::deliveries(cx, req).await,
        Op::ScmDelivery => webhooks::delivery(cx, req).await,
        Op::CreateRepo => webhooks::create_repo(cx, req).await,
        Op::ListRepos => webhooks::repos(cx, req).await,
        Op::GetRepo => webhooks::repo(cx, req).await,
        Op::PatchRepo => webhooks::patch_repo(cx, req).await,
        Op::DeleteRepo => webhooks::delete_repo(cx, req).await,
        Op::ListRuns => webhooks::runs(cx, req).await,
        Op::GetRun => webhooks::run(cx, req).await,
        Op::ClaimRun => webhooks::claim(cx, req).await,
        Op::RunHeartbeat => webhooks::heartbeat(cx, req).await,
        Op::CompleteRun => webhooks::complete(cx, req).await,
        Op::ProjectDeliveries => webhooks::project_deliveries(cx, req).await,
        Op::ProjectDelivery => webhooks::project_delivery(cx, req).await,
        Op::CreateIntegration => alerts::create_integration(cx, req).await,
        Op::ListIntegrations => alerts::integrations(cx, req).await,
        Op::GetIntegration => alerts::integration(cx, req).await,
        Op::PatchIntegration => alerts::patch_integration(cx, req).await,
        Op::DeleteIntegration => alerts::delete_integration(cx, req).await,
        Op::TestIntegration => alerts::test_integration(cx, req).await,
        Op::CreateAlertRule => alerts::create_rule(cx, req).await,
        Op::ListAlertRules => alerts::rules(cx, req).await,
        Op::GetAlertRule => alerts::rule(cx, req).await,
        Op::PatchAlertRule => alerts::patch_rule(cx, req).await,
        Op::DeleteAlertRule => alerts::delete_rule(cx, req).await,
        Op::ListAlerts => alerts::list_alerts(cx, req).await,
        Op::GetAlert => alerts::alert(cx, req).await,
        Op::BacktestRule => alerts::backtest(cx, req).await,
    }
}
