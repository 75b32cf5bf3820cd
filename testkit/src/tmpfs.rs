//! [`Tmpfs`]: a small file system of a test's own, so a test that watches free space sees
//! only its own writes, not those of the other tests or other machines sharing the disk.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A `tmpfs` of a fixed size mounted on a fresh temporary directory; unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a `tmpfs` of `mib` MiB. Fails where mounting is not allowed (not root, or in a
    /// container without `CAP_SYS_ADMIN`), saying what `mount` printed.
    pub fn mount(mib: u64) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs { dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside it.
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(p)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a server thread that still holds a file there does not keep it mounted.
        match Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status()
        {
            Ok(s) if s.success() => {}
            other => eprintln!("umount {}: {other:?}", self.dir.path().display()),
        }
    }
}
