//! The data directory is private to the account that runs fleetops: it holds the JWT
//! signing key, the webhook secret and (by default) the key that opens integration secrets,
//! so any account that could copy it could mint a superuser's token.
//!
//! Opening a store sets the process's file-creation mask to 077, so every file and directory
//! fleetops creates from then on (sled's own files, blobs, payload segments, temporary
//! copies, backups) is readable and writable by its owner only (files 0600, directories
//! 0700); the directories this crate creates and the files a backup or restore copies are
//! given those modes explicitly as well. A data directory that other accounts can read or
//! write is refused at start ([`check_private`]) unless the operator says otherwise.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::{Result, StorageError};

/// Files and directories this process creates from now on are private to its account.
pub fn restrict_umask() {
    rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077));
}

/// Refuses a data directory that other accounts can read, write or enter (any group or
/// other permission bit), unless `allow`. A directory that does not exist yet is fine: it
/// is created 0700.
pub fn check_private(dir: &Path, allow: bool) -> Result<()> {
    let mode = match std::fs::metadata(dir) {
        Ok(m) => m.mode() & 0o777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if mode & 0o077 == 0 {
        return Ok(());
    }
    if allow {
        tracing::warn!(
            dir = %dir.display(),
            mode = format!("{mode:o}"),
            "the data directory can be read by other accounts ([storage] allow_shared_data_dir)"
        );
        return Ok(());
    }
    Err(StorageError::Config(format!(
        "the data directory {} can be read or written by other accounts (mode {mode:o}); it \
         holds the keys that sign tokens: `chmod -R go-rwx {}`, or set [storage] \
         allow_shared_data_dir = true (FLEETOPS_ALLOW_SHARED_DATA_DIR=true) to start anyway",
        dir.display(),
        dir.display()
    )))
}

/// `create_dir_all` with every directory it creates 0700.
pub(crate) fn create_dirs(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Makes a file private to its owner (0600).
pub(crate) fn private_file(path: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_directory_others_can_read_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("data");
        assert!(check_private(&d, false).is_ok(), "absent: created private");
        create_dirs(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        assert!(check_private(&d, false).is_ok());
        for mode in [0o755, 0o750, 0o701, 0o770] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_private(&d, false).unwrap_err().to_string();
            assert!(e.contains("chmod -R go-rwx"), "{e}");
            assert!(check_private(&d, true).is_ok());
        }
    }
}
