//! Configurations: upload URL and confirm with the project secret, list, detail, explain,
//! delete.

use fleetops_actors::Role;
use fleetops_actors::pipeline::configurations::{ConfigFilter, ConfigRequest};
use http::Response;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::capsules::ConfirmBody;
use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

#[derive(Deserialize, schemars::JsonSchema)]
pub(crate) enum ConfigFormat {
    #[serde(rename = ".json")]
    Json,
    #[serde(rename = ".yaml")]
    Yaml,
    #[serde(rename = ".toml")]
    Toml,
    #[serde(rename = ".ini")]
    Ini,
    #[serde(rename = ".env")]
    Env,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ConfigUploadRequest")]
pub(crate) struct UploadUrlBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::capsule_name")]
    name: String,
    #[serde(deserialize_with = "fleetops_actors::rules::whole::u64")]
    capsule_id: u64,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::version")]
    version: String,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::environment")]
    environment: String,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::constraint")]
    compatible_capsule_versions: String,
    file_format: ConfigFormat,
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::opt_u64")]
    parent_config_id: Option<u64>,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<2000>")]
    description: Option<String>,
    #[serde(default, deserialize_with = "fleetops_actors::rules::whole::opt_u64")]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_size::<{ u64::MAX }>")]
    file_size_bytes: Option<u64>,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_json_schema")]
    validation_schema: Option<Box<RawValue>>,
}

pub async fn upload_url(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (pid, org) = cx.project_secret(&req)?;
    let b: UploadUrlBody = cx.json(&mut req).await?;
    let r = ConfigRequest {
        name: b.name,
        capsule_id: b.capsule_id,
        version: b.version,
        environment: b.environment,
        compatible_capsule_versions: b.compatible_capsule_versions,
        file_format: match b.file_format {
            ConfigFormat::Json => ".json",
            ConfigFormat::Yaml => ".yaml",
            ConfigFormat::Toml => ".toml",
            ConfigFormat::Ini => ".ini",
            ConfigFormat::Env => ".env",
        }
        .into(),
        parent_config_id: b.parent_config_id,
        description: b.description,
        file_size_bytes: b.file_size_bytes,
        validation_schema: b.validation_schema,
    };
    body::created(
        &cx.rt()
            .pipeline
            .config_upload_url(org.id, &org.tier, pid, r)
            .await?,
    )
}

pub async fn confirm(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (pid, _) = cx.project_secret(&req)?;
    let id = req.id("config_id", "Configuration")?;
    cx.rt().pipeline.exists("configuration", pid, id)?;
    let b: ConfirmBody = cx.json(&mut req).await?;
    body::ok(
        &cx.rt()
            .pipeline
            .confirm_configuration(pid, id, b.checksum_sha256)
            .await?,
    )
}

pub async fn list(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let f = ConfigFilter {
        capsule_id: req.query.u64("capsule_id")?,
        environment: match req.query.get("environment") {
            Some("") => return Err(ApiError::unprocessable("environment: must not be empty")),
            e => e.map(str::to_string),
        },
    };
    let page = req.query.page()?;
    body::ok(
        &cx.rt()
            .pipeline
            .configurations(s.project.id, &f, page)
            .await?,
    )
}

pub async fn get(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("config_id", "Configuration")?;
    body::ok(
        &cx.rt()
            .pipeline
            .configuration_detail(s.project.id, id)
            .await?,
    )
}

pub async fn explain(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("config_id", "Configuration")?;
    body::ok(&cx.rt().pipeline.explain(s.project.id, id)?)
}

pub async fn delete(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("config_id", "Configuration")?;
    cx.rt()
        .pipeline
        .delete_configuration(s.project.id, id)
        .await?;
    body::no_content()
}
