//! Opening a store: the engine marker and the directory lock, assembling the trees, building
//! once what a store written by an older version lacks; durable directories.

use super::*;

/// Which engine keeps the records of the data directory `dir`: `dir/engine` says, written at
/// its first open (and by `admin migrate`). Opening it with the other engine is refused, so a
/// configuration that lost its `[database] url`, or gained one, never starts an empty store
/// beside the real one.
pub(crate) fn engine_marker(dir: &Path, want: &str) -> Result<()> {
    let path = dir.join("engine");
    match std::fs::read_to_string(&path) {
        Ok(have) if have.trim() == want => Ok(()),
        Ok(have) => Err(StorageError::Config(format!(
            "{} keeps its records in {} but the configuration names {want}: set [database] url \
             (FLEETOPS_DATABASE_URL) to match{}",
            dir.display(),
            have.trim(),
            if want == "postgres" {
                ", or move an embedded store over with `fleetops admin migrate`"
            } else {
                ""
            }
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if want == "postgres" && dir.join("db").exists() {
                return Err(StorageError::Config(format!(
                    "{} holds an embedded store: move it over with `fleetops admin migrate \
                     --to <url>` first",
                    dir.display()
                )));
            }
            write_engine_marker(dir, want)
        }
        Err(e) => Err(e.into()),
    }
}

/// Records `engine` as the data directory's, durably.
pub(crate) fn write_engine_marker(dir: &Path, engine: &str) -> Result<()> {
    let tmp = dir.join("engine.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(engine.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join("engine"))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Takes `dir/lock` exclusively, or [`StorageError::Locked`] while another process holds it.
pub(super) fn lock_dir(dir: &Path) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(StorageError::Locked(dir.display().to_string())),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}
/// `create_dir_all` whose new directories' entries are durable (power loss, not only kill
/// -9): each directory it made is synced in its parent, up to the first that existed.
pub(crate) fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    // A relative path's last parent is "", which names the working directory.
    pub(super) fn parent(p: &Path) -> Option<&Path> {
        p.parent().map(|q| {
            if q.as_os_str().is_empty() {
                Path::new(".")
            } else {
                q
            }
        })
    }
    let mut existing = dir;
    while !existing.exists() {
        match parent(existing) {
            Some(p) => existing = p,
            None => break,
        }
    }
    if existing == dir {
        return Ok(());
    }
    perms::create_dirs(dir)?;
    let mut d = parent(dir);
    while let Some(p) = d {
        std::fs::File::open(p)?.sync_all()?;
        if p == existing {
            break;
        }
        d = parent(p);
    }
    Ok(())
}

/// Every listed record family: its key prefix and how to read a stored record's entries.
pub(crate) type Family = (Vec<u8>, fn(&[u8]) -> Result<Vec<lists::Entry>>);

pub(super) fn listed_families() -> Vec<Family> {
    use lists::old_entries;
    vec![
        (keys::all_devices_prefix(), old_entries::<Device>),
        (keys::all_sessions_prefix(), old_entries::<Session>),
        (keys::delivery_prefix(), old_entries::<Delivery>),
        (keys::all_runs_prefix(), old_entries::<TestRun>),
        (keys::all_configs_prefix(), old_entries::<Configuration>),
        (keys::all_deployments_prefix(), old_entries::<Deployment>),
        (keys::all_alerts_prefix(), old_entries::<Alert>),
    ]
}

impl Store {
    /// Opens a store its test just dropped, on the test's engine: sled's own flusher thread
    /// (or PostgreSQL's closing session) may hold the lock a moment after the last handle goes.
    #[cfg(test)]
    pub(crate) fn reopen(dir: &Path) -> Self {
        let mut tries = 0;
        loop {
            let db = testing::database(dir);
            match Store::open_on(dir, std::time::Duration::ZERO, &db) {
                Err(StorageError::Locked(_)) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                #[allow(clippy::unwrap_used)]
                other => break other.unwrap(),
            }
        }
    }

    /// Opens (or creates) the sled database under `dir/db`. Fails with [`StorageError::Locked`]
    /// when another process holds it, without touching anything.
    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, std::time::Duration::ZERO)
    }

    /// As [`Store::open`], with the group-commit delay of `[storage] commit_delay_us`.
    pub fn open_with(dir: &Path, commit_delay: std::time::Duration) -> Result<Self> {
        Self::open_on(dir, commit_delay, &DatabaseConfig::default())
    }

    /// Opens the store `database` names: sled under `dir/db`, or a PostgreSQL database
    /// (migrated to this build's schema). The data directory holds the webhook payload log
    /// either way.
    pub fn open_on(
        dir: &Path,
        commit_delay: std::time::Duration,
        database: &DatabaseConfig,
    ) -> Result<Self> {
        perms::restrict_umask();
        create_dir_durable(dir)?;
        if database.is_postgres() {
            if !database.url.starts_with("postgres://")
                && !database.url.starts_with("postgresql://")
            {
                return Err(StorageError::Config(
                    "[database] url must be empty (sled) or a postgres:// URL".into(),
                ));
            }
            // The data directory (the webhook payload log) is still this process's alone.
            let lock = lock_dir(dir)?;
            engine_marker(dir, "postgres")?;
            let pg = engine::pg::Pg::open(&database.url, database.max_connections)?;
            pg.hold_for_one_server(&database.url, database.shared)?;
            let store = Self::assemble(dir, engine::Db::Pg(pg), None, database.shared)?;
            let _ = store.inner.dir_lock.set(lock);
            if database.shared {
                store.inner.cache.set_max_age(SHARED_CACHE_MAX_AGE);
            }
            return Ok(store);
        }
        engine_marker(dir, "sled")?;
        let db = sled::Config::new()
            .path(dir.join("db"))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| match e {
                sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                    StorageError::Locked(dir.display().to_string())
                }
                sled::Error::Io(io) if io.to_string().contains("lock") => {
                    StorageError::Locked(dir.display().to_string())
                }
                other => StorageError::Sled(other),
            })?;
        let flusher = flush::GroupCommit::start(db.clone(), commit_delay);
        Self::assemble(dir, engine::Db::Sled(db), Some(flusher), false)
    }

    pub(super) fn assemble(
        dir: &Path,
        db: engine::Db,
        flusher: Option<flush::GroupCommit>,
        shared: bool,
    ) -> Result<Self> {
        let gate = gate::Gate::default();
        let records = gate::Tree::new(db.open_tree("records")?, gate.clone());
        let logs = gate::Tree::new(db.open_tree("logs")?, gate.clone());
        let seq = gate::Tree::new(db.open_tree("seq")?, gate.clone());
        let meta = gate::Tree::new(db.open_tree("meta")?, gate.clone());
        let payload_log = webhooks::payload_log::PayloadLog::open(&dir.join("webhook-payloads"))?;
        let store = Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                db,
                records,
                logs,
                seq,
                meta,
                flusher,
                gate,
                cache: cache::Caches::default(),
                list_lock: std::sync::Mutex::new(()),
                recovered: 0.into(),
                payload_log,
                run_ids: std::sync::Mutex::new(0..0),
                retired: dashmap::DashSet::new(),
                log_pins: sessions::seal::LogPins::default(),
                shared,
                sections: dashmap::DashMap::new(),
                segments: std::sync::OnceLock::new(),
                dir_lock: std::sync::OnceLock::new(),
            }),
        };
        store.load_retired()?;
        store.ensure_lists()?;
        store.ensure_alert_expiry()?;
        store.drop_legacy_queue()?;
        let recovered = store.recover_deliveries()?;
        store
            .inner
            .recovered
            .store(recovered as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(store)
    }

    /// Builds the list indexes of a store written before they existed (once; a marker in
    /// `meta` says they are kept from then on).
    pub(super) fn ensure_lists(&self) -> Result<()> {
        const MARK: &[u8] = b"lists-format";
        // 2: last-seen seconds became lists with entries (1 kept only their counts).
        if self.inner.meta.get(MARK)?.as_deref() == Some(b"2".as_slice()) {
            return Ok(());
        }
        let n = self.rebuild_lists(&listed_families())?;
        self.inner.meta.insert(MARK, b"2".as_slice())?;
        self.inner.db.flush()?;
        if n > 0 {
            tracing::info!(records = n, "list indexes built");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// Nested new directories are made (and synced) whatever part of the path existed.
    #[test]
    fn durable_dirs_are_made_at_any_depth_and_again_harmlessly() {
        let t = tempfile::tempdir().unwrap();
        let deep = t.path().join("a/b/c");
        super::create_dir_durable(&deep).unwrap();
        assert!(deep.is_dir());
        super::create_dir_durable(&deep).unwrap();
        super::create_dir_durable(&t.path().join("a/d")).unwrap();
        assert!(t.path().join("a/d").is_dir());
        // A relative path whose first part is new.
        let rel =
            std::path::PathBuf::from(format!("target-durable-dir-test-{}/x", std::process::id()));
        super::create_dir_durable(&rel).unwrap();
        assert!(rel.is_dir());
        std::fs::remove_dir_all(rel.parent().unwrap()).unwrap();
    }
}
