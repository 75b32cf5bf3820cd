//! Secrets at rest: the data directory and every file in it (and in a backup or a restore)
//! are private to the account that runs fleetops, a data directory others can read is refused
//! at start, and the key that encrypts integration secrets can live outside the data
//! directory, so a copy of the data directory alone does not open them.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::common::*;
use crate::peers::Sink;

const INTEGRATIONS: &str = "/api/v1/organizations/default/projects/default/integrations";
const SIGNING_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Every directory under `root` (itself included) is 0700 and every file 0600; how many
/// files were seen.
fn assert_private(root: &Path) -> usize {
    let mut files = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mode = std::fs::metadata(&d).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", d.display());
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                assert_eq!(
                    m.mode() & 0o777,
                    0o600,
                    "{} is {:o}",
                    e.path().display(),
                    m.mode() & 0o777
                );
                files += 1;
            }
        }
    }
    files
}

fn data_dir(s: &Srv) -> PathBuf {
    s._dir.path().join("data")
}

/// A device with an artifact and a log batch, and a signed webhook delivery: the data
/// directory then holds sled's files, a blob and a payload segment.
async fn write_a_little_of_everything(s: &Srv) {
    let (d, tok) = crate::sessions::device(s, "r1").await;
    let sid = crate::sessions::session(s, d, &tok).await;
    let r = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/a/trace.bin")))
                .bearer_auth(&tok)
                .body(vec![7u8; 10_000]),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let r = s
        .post(
            &format!("{DEV}/sessions/{sid}/logs"),
            &tok,
            json!([{"level": "info", "message": "hello"}]),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
}

each_backend!(the_data_directory_its_files_and_its_backups_are_private_to_their_owner);
async fn the_data_directory_its_files_and_its_backups_are_private_to_their_owner() {
    let s = start().await;
    write_a_little_of_everything(&s).await;
    s.rt().store().flush_blocking().unwrap();
    let files = assert_private(&data_dir(&s));
    // sled's files (not on PostgreSQL), the payload segment and the blob.
    let least = if crate::backend::on_postgres() { 1 } else { 3 };
    assert!(files >= least, "{files} files");
    // Files an earlier version left readable (0644) are private in the copy all the same.
    let mut stack = vec![data_dir(&s).join("blobs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.metadata().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
            }
        }
    }
    // A backup the server takes is private too, whatever the destination's parents are.
    let outside = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let to = outside.path().join("nightly/backup");
    let r = s
        .post("/api/v1/admin/backup", s.key(), json!({"to": to}))
        .await;
    if crate::backend::on_postgres() {
        // The records are the database's to back up: nothing is written at `to`.
        r.assert_error(409);
        assert!(!to.exists());
        return;
    }
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(assert_private(&to) >= files, "every file copied, each 0600");
    // A restore (a new data directory from the backup) is private.
    let dir = s.stopped().await;
    let restored = dir.path().join("restored");
    fleetops_storage::backup::restore(&to, &restored).unwrap();
    assert_private(&restored);
}

each_backend!(a_data_directory_other_accounts_can_read_is_refused_at_start);
async fn a_data_directory_other_accounts_can_read_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config(&dir, |_| {});
    std::fs::create_dir(&cfg.data_dir).unwrap();
    std::fs::set_permissions(&cfg.data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = refused(cfg.clone()).await;
    assert!(
        e.contains("can be read or written by other accounts") && e.contains("chmod"),
        "{e}"
    );
    assert!(
        !cfg.data_dir.join("db").exists(),
        "nothing written before the refusal"
    );
    // Told to, it starts (and says so in the log).
    let mut told = cfg.clone();
    told.storage.allow_shared_data_dir = true;
    started(told).await.stop().await;
}

/// A start with `cfg`, once the lock a server that just stopped (or a refused start) on the
/// same data directory may hold a moment longer is released.
async fn start_once_unlocked(
    cfg: &fleetops::config::Config,
) -> anyhow::Result<fleetops::startup::Running> {
    for _ in 0..100 {
        match fleetops::startup::start(cfg.clone()).await {
            Err(e) if format!("{e:#}").contains("in use by another") => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
    panic!("the data directory stayed locked");
}

/// Why a start with `cfg` is refused.
async fn refused(cfg: fleetops::config::Config) -> String {
    match start_once_unlocked(&cfg).await {
        Ok(r) => {
            r.stop().await;
            panic!("started, and should not have");
        }
        Err(e) => format!("{e:#}"),
    }
}

/// A server started with `cfg`.
async fn started(cfg: fleetops::config::Config) -> fleetops::startup::Running {
    start_once_unlocked(&cfg)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A webhook integration that signs with [`SIGNING_SECRET`]; its id.
async fn signing_integration(s: &Srv, sink: &Sink) -> u64 {
    let r = s
        .post(
            INTEGRATIONS,
            s.key(),
            json!({"type": "webhook", "name": "w", "config": {"url": sink.url("/hook"), "signing_secret": SIGNING_SECRET}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_u64().unwrap()
}

/// The integration's test alert reaches the sink signed with the secret as written: the
/// sealed secret opened.
async fn assert_signs(s: &Srv, sink: &Sink, id: u64) {
    let before = sink.requests.lock().unwrap().len();
    let r = s
        .post(&format!("{INTEGRATIONS}/{id}/test"), s.key(), json!({}))
        .await;
    assert_eq!(r.body["success"], true, "{}", r.body);
    let got = sink.wait_for(before + 1).await;
    let req = got.last().unwrap();
    assert_eq!(
        req.header("x-fleetops-signature-256").unwrap(),
        crate::webhooks::sign(SIGNING_SECRET, &req.body)
    );
}

fn allow_private(c: &mut fleetops::config::Config) {
    c.alerts.allow_private_targets = true;
}

fn key_in_data_dir(s: &Srv) -> Option<Vec<u8>> {
    s.rt().store().meta_get("secret_encryption_key").unwrap()
}

each_backend!(a_copied_data_directory_without_the_key_file_does_not_open_its_secrets);
async fn a_copied_data_directory_without_the_key_file_does_not_open_its_secrets() {
    let sink = Sink::start().await;
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("secrets.key");
    let path = key_file.to_str().unwrap().to_string();
    let s = start_with(|c| {
        allow_private(c);
        c.secrets.key_file = path.clone();
    })
    .await;
    let mode = std::fs::metadata(&key_file).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "made private: {mode:o}");
    assert_eq!(
        key_in_data_dir(&s),
        None,
        "the key is not in the data directory"
    );
    let id = signing_integration(&s, &sink).await;
    assert_signs(&s, &sink, id).await;
    let s = s
        .restart_with(|c| {
            allow_private(c);
            c.secrets.key_file = path.clone();
        })
        .await;
    assert_signs(&s, &sink, id).await;
    let dir = s.stopped().await;

    // The data directory copied elsewhere, started without the key: refused, clearly.
    let copy = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(dir.path().join("data"))
        .arg(copy.path().join("data"))
        .status()
        .unwrap();
    assert!(status.success());
    crate::common::copied_backend(dir.path(), copy.path());
    let e = refused(test_config(&copy, allow_private)).await;
    assert!(e.contains("sealed with a key kept outside it"), "{e}");
    // With it, the copy opens them.
    let cfg = test_config(&copy, |c| {
        allow_private(c);
        c.secrets.key_file = path.clone();
    });
    started(cfg).await.stop().await;
}

each_backend!(a_key_file_inside_the_data_directory_is_refused);
async fn a_key_file_inside_the_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("data/secrets.key");
    let path = inside.to_str().unwrap().to_string();
    let e = refused(test_config(&dir, |c| c.secrets.key_file = path.clone())).await;
    assert!(e.contains("inside the data directory"), "{e}");
    assert!(!inside.exists());
}

each_backend!(a_key_kept_in_the_data_directory_moves_out_to_a_new_key_file);
async fn a_key_kept_in_the_data_directory_moves_out_to_a_new_key_file() {
    let sink = Sink::start().await;
    let s = start_with(allow_private).await;
    let own = key_in_data_dir(&s).expect("kept in the data directory by default");
    let id = signing_integration(&s, &sink).await;
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("secrets.key");
    let path = key_file.to_str().unwrap().to_string();
    let s = s
        .restart_with(|c| {
            allow_private(c);
            c.secrets.key_file = path.clone();
        })
        .await;
    assert_eq!(key_in_data_dir(&s), None, "moved out");
    let text = std::fs::read_to_string(&key_file).unwrap();
    use base64::Engine;
    let written = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .unwrap();
    assert_eq!(
        written, own,
        "the file holds the key the secrets were sealed with"
    );
    assert_signs(&s, &sink, id).await;
}

each_backend!(a_key_file_holding_another_key_seals_every_secret_again);
async fn a_key_file_holding_another_key_seals_every_secret_again() {
    let sink = Sink::start().await;
    let s = start_with(allow_private).await;
    let id = signing_integration(&s, &sink).await;
    let keys = tempfile::tempdir().unwrap();
    let key_file = keys.path().join("secrets.key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key_file)
            .unwrap();
        use base64::Engine;
        let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([42u8; 32]);
        writeln!(f, "{key}").unwrap();
    }
    let path = key_file.to_str().unwrap().to_string();
    let s = s
        .restart_with(|c| {
            allow_private(c);
            c.secrets.key_file = path.clone();
        })
        .await;
    assert_eq!(key_in_data_dir(&s), None);
    assert_signs(&s, &sink, id).await;
    // The old key is gone for good: another key now is refused.
    let dir = s.stopped().await;
    std::fs::write(&key_file, format!("{}\n", "A".repeat(43) + "=")).unwrap();
    let cfg = test_config(&dir, |c| {
        allow_private(c);
        c.secrets.key_file = path.clone();
    });
    let e = refused(cfg).await;
    assert!(e.contains("is not the key"), "{e}");
}
