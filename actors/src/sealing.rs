//! Where the key that encrypts integration secrets lives, and the checks that keep a wrong
//! key from passing silently.
//!
//! By default the key is generated once and kept in the data directory (so the embedded
//! default needs no step). An operator who wants a copied data directory alone not to open
//! the secrets keeps it outside: `[secrets] key_file` (a file of 32 bytes as base64, made
//! mode 0600 at the first start that names it) or `FLEETOPS_SECRETS_KEY`. Moving out is a
//! restart: a key still in the data directory is written to the new file (or, when the file
//! already holds another key, every sealed secret is sealed again with it) and then removed
//! from the data directory.
//!
//! A sealed check value in the data directory says which key sealed its secrets: a start
//! with another key is refused with a clear message instead of failing at the first
//! notification.
//!
//! A key file is refused when other accounts can read or write it, or when it lies inside the
//! data directory (a copy would carry it); a new one is written beside its place and renamed
//! in whole, so a crash never leaves half a key. Sealing again is safe to repeat: a secret only
//! the new key opens was sealed again by a start a crash cut short, and is left alone.
//!
//! Tested by the unit test below and through the server (`tests/api/secrets.rs`: a copied data
//! directory without the key file does not open its secrets; a key file inside it is
//! refused).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use fleetops_storage::Store;

use crate::config::SecretsConfig;
use crate::project::alerting::seal_context;
use crate::secrets::{Sealer, random_bytes};

/// The meta key of the data directory's own secret-encryption key.
pub(crate) const SEALING_KEY_META: &str = "secret_encryption_key";
/// The meta key of the check value sealed with the current key.
const CHECK_META: &str = "secret_encryption_check";
const CHECK_CONTEXT: &[u8] = b"fleetops/key-check";
const CHECK_PLAIN: &[u8] = b"fleetops";

/// The sealer for this start: the configured key (moving the data directory's own out to it
/// once), else the data directory's (made on first use).
pub(crate) fn sealer(store: &Store, cfg: &SecretsConfig) -> anyhow::Result<Sealer> {
    let inside = store.meta_get(SEALING_KEY_META)?;
    let outside = if !cfg.key.trim().is_empty() {
        Some(decode(&cfg.key).context("FLEETOPS_SECRETS_KEY")?)
    } else if !cfg.key_file.trim().is_empty() {
        let path = Path::new(cfg.key_file.trim());
        if inside_of(path, store.dir()) {
            anyhow::bail!(
                "[secrets] key_file {} is inside the data directory, where a copy of the data \
                 directory would carry it: keep it elsewhere",
                path.display()
            );
        }
        Some(key_file(path, inside.as_deref())?)
    } else {
        None
    };
    let (key, moved) = match (outside, inside) {
        (Some(out), inside) => (out, inside),
        (None, Some(own)) => (own, None),
        (None, None) if store.meta_get(CHECK_META)?.is_some() => {
            anyhow::bail!(
                "this data directory's integration secrets were sealed with a key kept outside \
                 it: set [secrets] key_file (FLEETOPS_SECRETS_KEY_FILE) or FLEETOPS_SECRETS_KEY"
            )
        }
        (None, None) => {
            // Drawn before the call so that a failing random source fails the start.
            let fresh = random_bytes(32)?;
            (store.meta_get_or_init(SEALING_KEY_META, || fresh)?, None)
        }
    };
    let sealer = Sealer::new(&key)?;
    if let Some(old) = moved {
        let old = Sealer::new(&old)?;
        let n = reseal(store, &old, &sealer)?;
        store.meta_put(CHECK_META, &sealer.seal(CHECK_CONTEXT, CHECK_PLAIN)?)?;
        store.meta_remove(SEALING_KEY_META)?;
        store.flush_blocking()?;
        tracing::info!(
            resealed = n,
            "the secret-encryption key now lives outside the data directory"
        );
    }
    match store.meta_get(CHECK_META)? {
        Some(check) => {
            if sealer.open(CHECK_CONTEXT, &check).ok().as_deref() != Some(CHECK_PLAIN) {
                anyhow::bail!(
                    "the secret-encryption key ([secrets] key_file or FLEETOPS_SECRETS_KEY) is not \
                     the key this data directory's integration secrets were sealed with"
                );
            }
        }
        None => {
            store.meta_put(CHECK_META, &sealer.seal(CHECK_CONTEXT, CHECK_PLAIN)?)?;
            store.flush_blocking()?;
        }
    }
    Ok(sealer)
}

/// Seals every integration secret that `old` opens again with `new`; one that only `new`
/// opens was sealed again by a start a crash cut short. Returns how many it changed.
fn reseal(store: &Store, old: &Sealer, new: &Sealer) -> anyhow::Result<usize> {
    let mut changed = Vec::new();
    for mut i in store.all_integrations()? {
        if i.sealed_secrets.is_empty() {
            continue;
        }
        let cx = seal_context(i.project_id, i.id);
        match old.open(&cx, &i.sealed_secrets) {
            Ok(plain) => {
                i.sealed_secrets = new.seal(&cx, &plain)?;
                changed.push(i);
            }
            Err(_) if new.open(&cx, &i.sealed_secrets).is_ok() => {}
            Err(e) => {
                return Err(anyhow::anyhow!(e).context(format!(
                    "integration {} of project {} opens with neither key",
                    i.id, i.project_id
                )));
            }
        }
    }
    store.put_integrations(&changed)?;
    store.flush_blocking()?;
    Ok(changed.len())
}

/// The key in `path`; a file that does not exist yet is made (0600) holding `seed` (the
/// data directory's key) or a fresh key.
fn key_file(path: &Path, seed: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    match std::fs::metadata(path) {
        Ok(m) => {
            if m.mode() & 0o077 != 0 {
                anyhow::bail!(
                    "the secret-encryption key file {} can be read or written by other accounts \
                     (mode {:o}): chmod 600 it",
                    path.display(),
                    m.mode() & 0o777
                );
            }
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            decode(&text).with_context(|| path.display().to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = match seed {
                Some(k) => k.to_vec(),
                None => random_bytes(32)?,
            };
            // Written beside it and renamed into place whole, so a crash never leaves a
            // partial key file behind (the next start makes it again).
            let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            let text = base64::engine::general_purpose::STANDARD.encode(&key);
            f.write_all(format!("{text}\n").as_bytes())?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, path).with_context(|| format!("creating {}", path.display()))?;
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            std::fs::File::open(dir)?.sync_all()?;
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Whether `path` lies inside `dir` (both resolved as far as they exist).
fn inside_of(path: &Path, dir: &Path) -> bool {
    let resolve = |p: &Path| {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        // The file may not exist yet: resolve its directory.
        match (abs.parent(), abs.file_name()) {
            (Some(parent), Some(name)) => std::fs::canonicalize(parent)
                .map(|c| c.join(name))
                .unwrap_or(abs.clone()),
            _ => abs,
        }
    };
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    resolve(path).starts_with(dir)
}

/// 32 bytes written as base64 (standard or URL-safe, padded or not).
fn decode(text: &str) -> anyhow::Result<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let t = text.trim();
    let key = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|e| e.decode(t).ok())
        .ok_or_else(|| anyhow::anyhow!("the secret-encryption key is not base64"))?;
    if key.len() != 32 {
        anyhow::bail!(
            "the secret-encryption key must be 32 bytes, not {}",
            key.len()
        );
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_are_32_bytes_of_base64_in_any_spelling() {
        let key = [7u8; 32];
        for e in [
            base64::engine::general_purpose::STANDARD,
            base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            assert_eq!(decode(&format!("{}\n", e.encode(key))).unwrap(), key);
        }
        assert!(decode("not base64!").is_err());
        assert!(decode(&base64::engine::general_purpose::STANDARD.encode([1u8; 16])).is_err());
    }
}
