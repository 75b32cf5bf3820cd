//! Capsules: upload URL and confirm with the project secret, list, detail, delete.

use fleetops_actors::Role;
use fleetops_actors::pipeline::{CapsuleFilter, CapsuleRequest, Confirmed};
use http::{Response, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::app::{Cx, Req};
use crate::body;
use crate::error::{ApiError, ApiResult};
use crate::response::Body;

#[derive(Deserialize, schemars::JsonSchema)]
pub(crate) enum CapsuleType {
    SW,
    FW,
    OS,
}

#[derive(Deserialize, schemars::JsonSchema)]
pub(crate) enum FileFormat {
    #[serde(rename = ".tar.gz")]
    TarGz,
    #[serde(rename = ".tgz")]
    Tgz,
    #[serde(rename = ".tar")]
    Tar,
    #[serde(rename = ".zip")]
    Zip,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "DependencyRequest")]
pub(crate) struct DependencyBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::capsule_name")]
    name: String,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::constraint")]
    version: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CapsuleUploadRequest")]
pub(crate) struct UploadUrlBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::capsule_name")]
    name: String,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::version")]
    version: String,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::text::<2000>")]
    description: Option<String>,
    capsule_type: CapsuleType,
    file_format: FileFormat,
    #[serde(deserialize_with = "fleetops_actors::rules::whole::u64")]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::size::<{ u64::MAX }>")]
    file_size_bytes: u64,
    #[serde(default)]
    #[schemars(schema_with = "fleetops_actors::rules::schemas::opt_object")]
    metadata: Option<Box<RawValue>>,
    #[serde(default)]
    dependencies: Vec<DependencyBody>,
    /// The commit the capsule was built from (its provenance).
    #[serde(default)]
    source: Option<SourceBody>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CapsuleSource")]
#[serde(deny_unknown_fields)]
pub(crate) struct SourceBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::full_name")]
    repository: String,
    #[schemars(schema_with = "fleetops_actors::rules::schemas::commit_sha")]
    commit_sha: String,
}

pub async fn upload_url(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (pid, org) = cx.project_secret(&req)?;
    let b: UploadUrlBody = cx.json(&mut req).await?;
    let r = CapsuleRequest {
        name: b.name,
        version: b.version,
        description: b.description,
        capsule_type: match b.capsule_type {
            CapsuleType::SW => "SW",
            CapsuleType::FW => "FW",
            CapsuleType::OS => "OS",
        }
        .into(),
        file_format: match b.file_format {
            FileFormat::TarGz => ".tar.gz",
            FileFormat::Tgz => ".tgz",
            FileFormat::Tar => ".tar",
            FileFormat::Zip => ".zip",
        }
        .into(),
        file_size_bytes: b.file_size_bytes,
        metadata: b.metadata,
        dependencies: b
            .dependencies
            .into_iter()
            .map(|d| (d.name, d.version))
            .collect(),
        source: b.source.map(|s| (s.repository, s.commit_sha)),
    };
    body::created(
        &cx.rt()
            .pipeline
            .upload_url(org.id, &org.tier, pid, r)
            .await?,
    )
}

/// The body of both confirms (capsules and configurations).
#[derive(Deserialize, schemars::JsonSchema)]
#[schemars(rename = "ConfirmUpload")]
pub(crate) struct ConfirmBody {
    #[schemars(schema_with = "fleetops_actors::rules::schemas::sha256")]
    pub checksum_sha256: String,
}

pub async fn confirm(cx: &mut Cx<'_>, mut req: Req) -> ApiResult<Response<Body>> {
    let (pid, _) = cx.project_secret(&req)?;
    let id = req.id("capsule_id", "Capsule")?;
    cx.rt().pipeline.exists("capsule", pid, id)?;
    let b: ConfirmBody = cx.json(&mut req).await?;
    match cx.rt().pipeline.confirm(pid, id, b.checksum_sha256).await? {
        Confirmed::Done(c) => body::ok(&c),
        Confirmed::Pending(c) => body::accepted(&c),
    }
}

pub async fn list(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let capsule_type = match req.query.get("type") {
        None => None,
        Some(t @ ("SW" | "FW" | "OS")) => Some(t.to_string()),
        Some(_) => return Err(ApiError::unprocessable("type: must be SW, FW or OS")),
    };
    let latest_only = match req.query.get("latest_only") {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(_) => {
            return Err(ApiError::unprocessable(
                "latest_only: must be true or false",
            ));
        }
    };
    let f = CapsuleFilter {
        name: req.query.get("name").map(str::to_string),
        capsule_type,
        latest_only,
    };
    let json = cx.rt().pipeline.list_json(s.project.id, &f)?;
    Ok(crate::response::json_bytes(StatusCode::OK, json))
}

pub async fn get(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Viewer).await?;
    let id = req.id("capsule_id", "Capsule")?;
    body::ok(&cx.rt().pipeline.detail(s.project.id, id).await?)
}

pub async fn delete(cx: &mut Cx<'_>, req: Req) -> ApiResult<Response<Body>> {
    let (_, s) = cx.project(&req, Role::Member).await?;
    let id = req.id("capsule_id", "Capsule")?;
    cx.rt().pipeline.delete(s.project.id, id).await?;
    body::no_content()
}
