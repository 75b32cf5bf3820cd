//! Who this robot is to the service: `state_dir/device.json` (its id, device token,
//! organization and project), written once at enrollment, readable only by the agent's user
//! (0600 in a 0700 directory). With none, the agent enrolls with the enrollment token first.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::client::{self, CallError};
use crate::config::Config;

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

/// Makes `dir` (and its parents) with mode 0700.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes `bytes` to `path` whole, mode 0600: into a new temporary file beside it (a random
/// name, created exclusively, never through a symlink), synced, then renamed over `path`.
/// The temporary name ends in `.tmp`.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).map_err(|e| std::io::Error::other(e.to_string()))?;
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", hex::encode(r)));
    write_through(&tmp, path, bytes)
}

/// Writes `bytes` into a new file `tmp` (refused when anything, a symlink too, is there
/// already), syncs it and renames it to `path`.
fn write_through(tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|()| std::fs::rename(tmp, path)) {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
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
        match crate::run::hold_file(&lock) {
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
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fa-identity-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn enrollment_ids_are_random_version_4_uuids() {
        let (a, b) = (new_enrollment_id().unwrap(), new_enrollment_id().unwrap());
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }

    #[test]
    fn a_symlink_planted_at_the_temporary_path_is_refused_and_its_target_left_alone() {
        let d = dir("planted");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let tmp = d.join("device.json.tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let e = write_through(&tmp, &d.join("device.json"), b"secret").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!d.join("device.json").exists());
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn private_files_are_written_whole_0600_under_a_random_temporary_name() {
        let d = dir("random");
        let victim = d.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        // The name a fixed scheme would pick is no way in.
        std::os::unix::fs::symlink(&victim, d.join("device.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("device.json.tmp")).unwrap();
        let path = d.join("device.json");
        write_private(&path, b"one").unwrap();
        write_private(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        // Nothing left behind but what was there.
        let mut names: Vec<String> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["device.json", "device.json.tmp", "device.tmp", "victim"]
        );
        let _ = std::fs::remove_dir_all(d);
    }
}
