//! Who this robot is to the service: `state_dir/device.json` (its id, device token,
//! organization and project), written once at enrollment, readable only by the agent's user
//! (0600 in a 0700 directory). With none, the agent enrolls with the enrollment token first.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::client::{self, CallError};
use crate::config::Config;
use crate::files::{private_dir, write_private};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub server: String,
    pub device_id: u64,
    pub device_token: String,
    pub organization: String,
    pub project: String,
}

impl Identity {
    /// The URL of a project-scoped route (`path` starts with `/`).
    pub fn project_url(&self, path: &str) -> String {
        format!(
            "{}/api/v1/organizations/{}/projects/{}{path}",
            self.server, self.organization, self.project
        )
    }
}

fn file(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("device.json")
}

/// The identity on disk, or a new one from enrolling.
pub async fn load_or_enroll(cfg: &Config, http: &reqwest::Client) -> Result<Identity, String> {
    let path = file(cfg);
    match std::fs::read(&path) {
        Ok(bytes) => {
            return serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: {e} (delete it to enroll again)", path.display()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    // One enrollment at a time on this robot (a daemon and a run starting together): the
    // second finds the first's identity.
    private_dir(&cfg.state_dir).map_err(|e| format!("{}: {e}", cfg.state_dir.display()))?;
    let lock = cfg.state_dir.join("enroll.lock");
    let _enrolling = loop {
        match crate::files::hold_file(&lock) {
            Ok(Some(f)) => break f,
            Ok(None) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            Err(e) => return Err(format!("{}: {e}", lock.display())),
        }
    };
    if let Ok(bytes) = std::fs::read(&path) {
        return serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: {e} (delete it to enroll again)", path.display()));
    }
    let token = std::env::var("FLEETOPS_ENROLLMENT_TOKEN")
        .ok()
        .or_else(|| cfg.enrollment_token.clone())
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| {
            format!(
                "not enrolled yet ({} is missing) and no enrollment token: set enrollment_token \
                 or FLEETOPS_ENROLLMENT_TOKEN",
                path.display()
            )
        })?;
    let name = cfg.name.clone().unwrap_or_else(hostname);
    // Kept before the first try, so that an enrollment whose answer was lost (or an agent
    // killed while it waited) asks again as the same enrollment and gets its device.
    let attempt_file = cfg.state_dir.join("enrollment-id");
    let attempt = match std::fs::read_to_string(&attempt_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => {
            let id = new_enrollment_id()?;
            write_private(&attempt_file, id.as_bytes())
                .map_err(|e| format!("{}: {e}", attempt_file.display()))?;
            id
        }
    };
    let body = serde_json::json!({"name": name, "labels": cfg.labels, "enrollment_id": attempt});
    let url = format!("{}/api/v1/device/enroll", cfg.server());
    let r = client::call(
        || Ok(http.post(&url).bearer_auth(token.trim()).json(&body)),
        None,
    )
    .await
    .map_err(|e| match e {
        CallError::Status(s, _) if s == reqwest::StatusCode::UNAUTHORIZED => {
            "the enrollment token was refused (unknown, revoked, used up or expired)".to_string()
        }
        e => format!("enrolling: {e}"),
    })?;
    let v: serde_json::Value = r
        .json()
        .await
        .map_err(|e| format!("enrolling: unreadable answer: {e}"))?;
    let id = Identity {
        server: cfg.server().to_string(),
        device_id: v["id"]
            .as_u64()
            .ok_or("enrolling: no device id in the answer")?,
        device_token: v["device_token"]
            .as_str()
            .ok_or("enrolling: no device token in the answer")?
            .to_string(),
        organization: v["organization"]
            .as_str()
            .ok_or("enrolling: no organization in the answer")?
            .to_string(),
        project: v["project_slug"]
            .as_str()
            .ok_or("enrolling: no project in the answer")?
            .to_string(),
    };
    private_dir(&cfg.state_dir).map_err(|e| format!("{}: {e}", cfg.state_dir.display()))?;
    let bytes = serde_json::to_vec_pretty(&id).map_err(|e| e.to_string())?;
    write_private(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let _ = std::fs::remove_file(&attempt_file);
    eprintln!(
        "fleetops-agent: enrolled as device {} in {}/{}",
        id.device_id, id.organization, id.project
    );
    Ok(id)
}

/// A random UUID (version 4) naming one enrollment.
fn new_enrollment_id() -> Result<String, String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness for an enrollment id: {e}"))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "robot".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enrollment_ids_are_random_version_4_uuids() {
        let (a, b) = (new_enrollment_id().unwrap(), new_enrollment_id().unwrap());
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }
}
