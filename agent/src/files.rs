//! Files on the robot's disk that only the agent may read: directories made 0700, files
//! written whole (a temporary file beside, synced, renamed) with mode 0600, and exclusive
//! locks taken without waiting. A leaf: it knows nothing of the service.

use std::path::Path;

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

/// Takes the exclusive lock of file `path` (made if missing) without waiting.
pub fn hold_file(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fa-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
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
