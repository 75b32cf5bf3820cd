//! A consistent copy of a data directory, taken while it serves (pause, flush, copy), and
//! its restore.
//!
//! The webhook payload segments and the local blobs are first copied while everything runs.
//! Then writes wait on the backup gate while the sled trees are copied key by key into a fresh
//! database (compacted as a side effect) and the files are copied again where they changed
//! since (size or modification time: the open payload segment, blobs written meanwhile). Every
//! file a record refers to is written before the record and deleted after the record's
//! removal, so the copy has every file its records need (and at most a few orphans, which
//! housekeeping removes). Blobs are hard-linked when the destination is on the same filesystem
//! (a blob file is never changed in place: a new version is a new file renamed over it), else
//! copied. `backup.json` is written last: a directory without it is an interrupted backup, and
//! restore refuses it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Result, StorageError, Store};

/// Written last into a backup; what restore checks first.
pub const MANIFEST: &str = "backup.json";

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackupReport {
    pub path: String,
    /// Unix milliseconds when the copy was taken.
    pub taken_at_ms: i64,
    pub keys: u64,
    pub files: u64,
    pub bytes: u64,
    /// How long writes waited: the sled copy and the second pass over the files.
    pub paused_ms: u64,
    /// What the copy does not hold. With blobs in S3: artifacts, capsules, configurations and
    /// sealed log segments stay in the bucket (its versioning or replication backs them up);
    /// the copy holds the records, indexes and chunk locations that point at them. Empty with
    /// local blobs, which the copy holds.
    #[serde(default)]
    pub not_included: Vec<String>,
}

/// `p` with symlinks resolved as far as it exists, the rest appended; `..` refused (it would
/// resolve differently once the directories exist).
fn resolved(p: &Path) -> std::result::Result<PathBuf, String> {
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err("the backup destination must not contain '..'".into());
    }
    let mut existing = p.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut out = real;
            out.extend(rest.iter().rev());
            return Ok(out);
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return Err("the backup destination cannot be resolved".into()),
        }
    }
}

/// Why a destination cannot take a backup: for a 4xx, not a 5xx. It must be absolute, absent
/// or empty, and (symlinks resolved) neither inside nor around the data directory or the blob
/// directory, or the copy would walk into itself.
pub fn check_destination(
    dest: &Path,
    data_dir: &Path,
    blobs: Option<&Path>,
) -> std::result::Result<(), String> {
    if !dest.is_absolute() {
        return Err("the backup destination must be an absolute path".into());
    }
    let real = resolved(dest)?;
    for dir in [Some(data_dir), blobs].into_iter().flatten() {
        let dir = resolved(dir)?;
        if real.starts_with(&dir) || dir.starts_with(&real) {
            return Err(
                "the backup destination must be outside the data and blob directories".into(),
            );
        }
    }
    match std::fs::read_dir(dest) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err("the backup destination exists and is not empty".into());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("the backup destination cannot be read: {e}")),
    }
    Ok(())
}

impl Store {
    /// Copies this store into `dest` (absent or empty), with the local blobs under
    /// `blobs` (None on a remote blob store, whose own versioning keeps its objects).
    /// Blocking: run it off the async threads.
    pub fn backup_to(
        &self,
        dest: &Path,
        blobs: Option<&Path>,
        now_ms: i64,
    ) -> Result<BackupReport> {
        check_destination(dest, &self.inner.dir, blobs).map_err(StorageError::Config)?;
        let existed = dest.exists();
        let taken = self.copy_into(dest, blobs, now_ms);
        if taken.is_err() {
            // Absent or empty before: left so, and a retry to the same path works.
            let _ = std::fs::remove_dir_all(dest);
            if existed {
                let _ = crate::perms::create_dirs(dest);
            }
        }
        taken
    }

    fn copy_into(&self, dest: &Path, blobs: Option<&Path>, now_ms: i64) -> Result<BackupReport> {
        crate::create_dir_durable(dest)?;
        let copy = sled::Config::new()
            .path(dest.join("db"))
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let mut report = BackupReport {
            path: dest.display().to_string(),
            taken_at_ms: now_ms,
            keys: 0,
            files: 0,
            bytes: 0,
            paused_ms: 0,
            not_included: match blobs {
                Some(_) => Vec::new(),
                None => vec![
                    "blobs in the S3 bucket: artifacts, capsules, configurations and sealed log segments (back the bucket up with its versioning or replication)".into(),
                ],
            },
        };
        let spool = self.inner.dir.join("webhook-payloads");
        let mut seen = Seen::default();
        // The bulk of the files while writes go on; the paused pass below copies what changed.
        copy_tree(&spool, &dest.join("webhook-payloads"), false, &mut seen)?;
        if let Some(blobs) = blobs {
            copy_tree(blobs, &dest.join("blobs"), true, &mut seen)?;
        }
        let paused = std::time::Instant::now();
        {
            let _writes_wait = self.inner.gate.exclusive();
            for (name, from) in self.named_trees() {
                let to = copy.open_tree(name)?;
                let mut batch = sled::Batch::default();
                let mut in_batch = 0;
                for kv in from.scan_prefix(b"") {
                    let (k, v) = kv?;
                    report.bytes += (k.len() + v.len()) as u64;
                    batch.insert(k, v);
                    in_batch += 1;
                    report.keys += 1;
                    if in_batch == 10_000 {
                        to.apply_batch(std::mem::take(&mut batch))?;
                        in_batch = 0;
                    }
                }
                to.apply_batch(batch)?;
            }
            copy_tree(&spool, &dest.join("webhook-payloads"), false, &mut seen)?;
            if let Some(blobs) = blobs {
                copy_tree(blobs, &dest.join("blobs"), true, &mut seen)?;
            }
        }
        report.paused_ms = paused.elapsed().as_millis() as u64;
        // Made durable once writes go on again: nothing live writes the copy.
        copy.flush()?;
        seen.sync()?;
        report.files = seen.0.len() as u64;
        report.bytes += seen.0.values().map(|(_, len, _)| len).sum::<u64>();
        drop(copy);
        // sled's files' own entries in the copy's folder.
        sync_dir(&dest.join("db"))?;
        let manifest =
            serde_json::to_vec_pretty(&report).map_err(|e| StorageError::Corrupt(e.to_string()))?;
        write_synced(&dest.join(MANIFEST), &manifest)?;
        sync_dir(dest)?;
        Ok(report)
    }
}

/// Copies a backup into an absent or empty data directory (the server stopped): staged beside
/// it, opened there, and renamed into place whole; the backup itself is left untouched.
pub fn restore(from: &Path, data_dir: &Path) -> Result<BackupReport> {
    let manifest = std::fs::read(from.join(MANIFEST)).map_err(|_| {
        StorageError::Config(format!(
            "{} has no {MANIFEST}: not a backup, or one that did not finish",
            from.display()
        ))
    })?;
    let report: BackupReport =
        serde_json::from_slice(&manifest).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    if let Ok(mut entries) = std::fs::read_dir(data_dir)
        && entries.next().is_some()
    {
        return Err(StorageError::Config(format!(
            "the data directory {} is not empty: move it away first",
            data_dir.display()
        )));
    }
    // Copied beside the data directory and opened there; moved into place only whole, so a
    // failure part-way (a full disk) leaves the data directory as it was.
    let name = data_dir
        .file_name()
        .ok_or_else(|| StorageError::Config("the data directory has no name".into()))?;
    let parent = match data_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    crate::create_dir_durable(&parent)?;
    let staging = parent.join(format!(
        ".{}.restoring-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&staging);
    let staged = (|| -> Result<()> {
        let mut seen = Seen::default();
        copy_tree(from, &staging, false, &mut seen)?;
        seen.sync()?;
        std::fs::remove_file(staging.join(MANIFEST))?;
        drop(Store::open(&staging)?);
        sync_dir(&staging)?;
        // An empty data directory that exists is replaced; rename refuses a non-empty one.
        let _ = std::fs::remove_dir(data_dir);
        std::fs::rename(&staging, data_dir)?;
        sync_dir(&parent)
    })();
    if let Err(e) = staged {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    Ok(report)
}

/// The files copied so far: their source's inode, size and modification time when copied.
#[derive(Default)]
struct Seen(
    std::collections::HashMap<PathBuf, (u64, u64, Option<std::time::SystemTime>)>,
    /// Files copied and directories changed, synced by [`Seen::sync`] (a backup does so once
    /// writes go on again, so no fsync lengthens the pause).
    Vec<PathBuf>,
);

impl Seen {
    fn sync(&mut self) -> Result<()> {
        for p in std::mem::take(&mut self.1) {
            std::fs::File::open(&p)?.sync_all()?;
        }
        Ok(())
    }
}

/// Copies every file under `from` into `to`, keeping the layout, unless `seen` says it was
/// copied as it is now; hard links when `link` and the filesystem allows it. Each copied file
/// and directory is synced. A file deleted while the walk runs is skipped.
fn copy_tree(from: &Path, to: &Path, link: bool, seen: &mut Seen) -> Result<()> {
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = from.join(&rel);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let here = to.join(&rel);
        // A directory made now is an entry in its parent: both are synced, so a tree whose
        // folders hold only folders (blobs/capsules/{project}/...) survives power loss too.
        let mut changed = !here.is_dir();
        if changed {
            crate::perms::create_dirs(&here)?;
            if let Some(parent) = here.parent() {
                seen.1.push(parent.to_path_buf());
            }
        }
        for entry in entries {
            let entry = entry?;
            let kind = entry.file_type()?;
            let rel_child = rel.join(entry.file_name());
            if kind.is_symlink() {
                return Err(StorageError::Config(format!(
                    "{} is a symbolic link: a data directory holds none, so it is not copied",
                    from.join(&rel_child).display()
                )));
            } else if kind.is_dir() {
                stack.push(rel_child);
            } else if kind.is_file() {
                let (src, dst) = (from.join(&rel_child), to.join(&rel_child));
                let meta = match entry.metadata() {
                    Ok(m) => m,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                };
                let now = (
                    std::os::unix::fs::MetadataExt::ino(&meta),
                    meta.len(),
                    meta.modified().ok(),
                );
                if seen.0.get(&src) == Some(&now) {
                    continue;
                }
                let _ = std::fs::remove_file(&dst);
                if !(link && std::fs::hard_link(&src, &dst).is_ok()) {
                    match std::fs::copy(&src, &dst) {
                        Ok(_) => seen.1.push(dst.clone()),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                // A copy takes its source's mode (and a hard link is its source): private
                // either way, whatever the source's was.
                crate::perms::private_file(&dst)?;
                changed = true;
                seen.0.insert(src, now);
            }
        }
        if changed {
            seen.1.push(here);
        }
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::Device;

    fn device(id: u64) -> Device {
        Device {
            id,
            project_id: 7,
            name: format!("d{id}"),
            labels: BTreeMap::new(),
            token_hash: [id as u8; 32],
            created_at: id as i64,
            last_seen_at: Some(id as i64 * 1000),
            metrics: BTreeMap::new(),
        }
    }

    /// A backup taken while another thread writes is one moment of the store: every list
    /// counter matches its entries and records, the copy opens and restores, and the files
    /// come along.
    #[test]
    fn a_backup_under_writes_is_consistent_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let store = Store::open(&data).unwrap();
        let blobs = data.join("blobs");
        std::fs::create_dir_all(blobs.join("a")).unwrap();
        std::fs::write(blobs.join("a/one.bin"), b"blob bytes").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut id = 0;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    store.insert_device(&device(id)).unwrap();
                }
                id
            })
        };
        while store.device_count(7).unwrap() < 500 {
            std::thread::yield_now();
        }
        let dest = dir.path().join("backup");
        let report = store.backup_to(&dest, Some(&blobs), 1).unwrap();
        stop.store(true, Ordering::Relaxed);
        let written = writer.join().unwrap();
        assert!(report.keys > 0 && report.files >= 1, "{report:?}");
        assert!(dest.join(MANIFEST).exists());
        // Refused: a destination that is not empty, one inside the data directory, a relative one.
        assert!(store.backup_to(&dest, None, 2).is_err());
        assert!(store.backup_to(&data.join("b"), None, 2).is_err());
        assert!(store.backup_to(Path::new("rel"), None, 2).is_err());
        // ...and one that reaches the data or blob directory through a symlink or `..`.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        assert!(store.backup_to(&link.join("b"), None, 2).is_err());
        assert!(
            store
                .backup_to(&dir.path().join("x/../data/b"), None, 2)
                .is_err()
        );
        assert!(store.backup_to(&blobs.join("b"), Some(&blobs), 2).is_err());
        drop(store);

        let restored = dir.path().join("restored");
        restore(&dest, &restored).unwrap();
        assert!(!restored.join(MANIFEST).exists());
        assert_eq!(
            std::fs::read(restored.join("blobs/a/one.bin")).unwrap(),
            b"blob bytes"
        );
        let copy = Store::open(&restored).unwrap();
        assert_eq!(copy.verify_lists().unwrap(), Vec::<String>::new());
        let total = copy.device_count(7).unwrap();
        assert!(total >= 500 && total <= written, "{total} of {written}");
        // Devices 1..=total, none missing in the middle: the copy is a prefix of the writes.
        for id in 1..=total {
            assert!(copy.device(7, id).unwrap().is_some(), "device {id}");
        }
        // Restore refuses a directory that is not empty, and one that is no backup.
        assert!(restore(&dest, &restored).is_err());
        assert!(restore(&restored, &dir.path().join("other")).is_err());
    }
}
