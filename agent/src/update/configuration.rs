//! A package's configuration: fetched (bounded), checked against the package before it is
//! taken, and written where the hooks find it.

use super::*;

pub(super) fn config_path(cfg: &Config) -> PathBuf {
    cfg.update
        .config_path
        .clone()
        .unwrap_or_else(|| cfg.state_dir.join("configuration.json"))
}

/// Writes the package's effective configuration (inline, or from its link), or `{}`.
pub(super) async fn write_configuration(
    cfg: &Config,
    http: &reqwest::Client,
    pkg: &serde_json::Value,
) -> Result<(), ConfigProblem> {
    let c = &pkg["configuration"];
    let data = if c.is_null() {
        serde_json::json!({})
    } else if !c["config_data"].is_null() {
        c["config_data"].clone()
    } else if let Some(url) = c["download_url"].as_str() {
        fetch_configuration(http, url, c).await?
    } else {
        serde_json::json!({})
    };
    let path = config_path(cfg);
    let bytes =
        serde_json::to_vec_pretty(&data).map_err(|e| ConfigProblem::Transient(e.to_string()))?;
    write_private(&path, &bytes)
        .map_err(|e| ConfigProblem::Transient(format!("{}: {e}", path.display())))
}

/// The largest effective configuration the agent takes.
pub(super) const MAX_CONFIGURATION_BYTES: u64 = 16 << 20;

/// Why a downloaded configuration cannot be installed, for the `failed` report.
#[derive(Debug)]
pub enum ConfigProblem {
    /// The download did not finish (retried at the next poll).
    Transient(String),
    /// What came is not what the package names: the update fails with this reason.
    Refused(String),
}

/// Downloads the effective configuration the package links to, reading at most the size the
/// package gives (and never more than [`MAX_CONFIGURATION_BYTES`]), and checks its size and
/// SHA-256 against the package before it parses it as JSON.
pub(super) async fn fetch_configuration(
    http: &reqwest::Client,
    url: &str,
    c: &serde_json::Value,
) -> Result<serde_json::Value, ConfigProblem> {
    let (Some(size), Some(sha)) = (c["size_bytes"].as_u64(), c["sha256"].as_str()) else {
        return Err(ConfigProblem::Refused(
            "the package names no size and SHA-256 for its configuration".into(),
        ));
    };
    if size > MAX_CONFIGURATION_BYTES {
        return Err(ConfigProblem::Refused(format!(
            "the configuration is {size} bytes, over the agent's {MAX_CONFIGURATION_BYTES}"
        )));
    }
    let mut r = client::call(|| Ok(http.get(url)), Some(10))
        .await
        .map_err(|e| ConfigProblem::Transient(format!("downloading the configuration: {e}")))?;
    let mut bytes = Vec::with_capacity(size as usize);
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| ConfigProblem::Transient(format!("downloading the configuration: {e}")))?
    {
        if bytes.len() as u64 + chunk.len() as u64 > size {
            return Err(ConfigProblem::Refused(format!(
                "the configuration is larger than the {size} bytes its package names"
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    check_configuration(&bytes, size, sha)
}

/// A downloaded configuration checked against its package's size and SHA-256, then parsed.
pub fn check_configuration(
    bytes: &[u8],
    size: u64,
    sha: &str,
) -> Result<serde_json::Value, ConfigProblem> {
    let got = hex::encode(sha2::Sha256::digest(bytes));
    if bytes.len() as u64 != size || !got.eq_ignore_ascii_case(sha.trim()) {
        return Err(ConfigProblem::Refused(format!(
            "the configuration does not match its package: {} bytes with SHA-256 {got}, expected {size} bytes with {sha}",
            bytes.len()
        )));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ConfigProblem::Refused(format!("the configuration is not JSON: {e}")))
}
