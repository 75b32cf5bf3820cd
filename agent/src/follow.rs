//! What `daemon` ships as logs: the lines appended to the files `[logs] files` names, and
//! the systemd journal with `[logs] journal`.
//!
//! **Files.** Each pattern (`*` and `?` in the file name) is looked at every 500 ms. A file is
//! read from where it was last read, through an open handle, so the lines written to a file
//! just before it was rotated away (renamed) are still read; once its path names another
//! file (a new inode), the new file is read from its start. A file that shrank (truncated in
//! place) is read again from its start. A file first seen is read from its end, as `tail -F`
//! does, unless the agent read it before. Where each file was read up to is kept in
//! `state_dir/follow.json` once the lines before it are in the spool, so a restart skips no
//! line of a file that was not rotated meanwhile; the lines read in the last moment before
//! an agent was killed may be read again (at least once, then).
//!
//! **Journal.** `journalctl -f -o json` is followed, from the cursor the agent last kept
//! (`state_dir/journal.cursor`), else from now. The level comes from the entry's `PRIORITY`
//! (0-3 error, 4 warn, 5-6 info, 7 debug), the module from its `SYSLOG_IDENTIFIER`.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::lines::{self, Entry};

/// Where each followed file was read up to.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
pub struct Offsets(pub BTreeMap<PathBuf, (u64, u64)>);

fn offsets_file(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("follow.json")
}

struct Followed {
    file: std::fs::File,
    inode: u64,
    offset: u64,
    /// A line begun and not ended yet.
    partial: Vec<u8>,
}

/// Follows the configured files for as long as the daemon runs, sending each whole line on.
/// `kept`: how many entries the batcher has put in the spool so far.
pub async fn files(
    cfg: Config,
    tx: mpsc::Sender<Entry>,
    kept: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut saved: Offsets = std::fs::read(offsets_file(&cfg))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut open: BTreeMap<PathBuf, Followed> = BTreeMap::new();
    // Entries sent so far, and the offsets as of each count not yet kept in the spool.
    let mut sent = 0u64;
    let mut pending: std::collections::VecDeque<(u64, Offsets)> = Default::default();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut first_scan = true;
    loop {
        tick.tick().await;
        let matched = crate::run::matching(&cfg.logs.files);
        // A file gone or no longer matched is let go (its handle, its offset).
        open.retain(|p, _| matched.contains(p));
        for path in matched {
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let rotated = open.get(&path).is_some_and(|f| f.inode != meta.ino());
            if rotated {
                // What the old file got before it was moved away, then the new one.
                if let Some(mut f) = open.remove(&path) {
                    sent += drain(&mut f, &path, &cfg, &tx).await;
                }
            }
            if !open.contains_key(&path) {
                let Ok(mut file) = std::fs::File::open(&path) else {
                    continue;
                };
                let offset = match saved.0.get(&path) {
                    Some(&(inode, off)) if inode == meta.ino() && off <= meta.len() => off,
                    // Rotated (while the agent looked, or while it was away), or created
                    // since the agent started: all of it. What a file held before the agent
                    // ever saw it: its end, as `tail -F` does.
                    _ if rotated || saved.0.contains_key(&path) || !first_scan => 0,
                    _ => meta.len(),
                };
                if file.seek(SeekFrom::Start(offset)).is_err() {
                    continue;
                }
                open.insert(
                    path.clone(),
                    Followed {
                        file,
                        inode: meta.ino(),
                        offset,
                        partial: Vec::new(),
                    },
                );
            }
            if let Some(f) = open.get_mut(&path) {
                if meta.len() < f.offset {
                    // Truncated in place.
                    f.offset = 0;
                    f.partial.clear();
                    let _ = f.file.seek(SeekFrom::Start(0));
                }
                sent += drain(f, &path, &cfg, &tx).await;
            }
        }
        first_scan = false;
        let now: Offsets = Offsets(
            open.iter()
                .map(|(p, f)| (p.clone(), (f.inode, f.offset - f.partial.len() as u64)))
                .collect(),
        );
        if pending.back().is_none_or(|(_, o)| *o != now) {
            pending.push_back((sent, now));
        }
        // The newest offsets whose lines are all in the spool.
        let in_spool = kept.load(std::sync::atomic::Ordering::SeqCst);
        let mut ready = None;
        while pending.front().is_some_and(|(n, _)| *n <= in_spool) {
            ready = pending.pop_front().map(|(_, o)| o);
        }
        if let Some(o) = ready
            && o != saved
        {
            if let Ok(b) = serde_json::to_vec(&o) {
                let _ = crate::files::write_private(&offsets_file(&cfg), &b);
            }
            saved = o;
        }
    }
}

/// Reads what `f` has past its offset and sends its whole lines: how many.
async fn drain(
    f: &mut Followed,
    path: &std::path::Path,
    cfg: &Config,
    tx: &mpsc::Sender<Entry>,
) -> u64 {
    let module = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut buf = vec![0u8; 64 << 10];
    let mut sent = 0;
    loop {
        let n = match f.file.read(&mut buf) {
            Ok(0) | Err(_) => return sent,
            Ok(n) => n,
        };
        f.offset += n as u64;
        f.partial.extend_from_slice(&buf[..n]);
        while let Some(i) = f.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = f.partial.drain(..=i).collect();
            let line = &line[..line.len() - 1];
            if line.is_empty() {
                continue;
            }
            let e = lines::entry(line, &module, "info", cfg.logs.max_line_bytes);
            if tx.send(e).await.is_err() {
                return sent;
            }
            sent += 1;
        }
        // A line longer than the bound is cut and sent as it is.
        if f.partial.len() > cfg.logs.max_line_bytes {
            let line = std::mem::take(&mut f.partial);
            if tx
                .send(lines::entry(
                    &line,
                    &module,
                    "info",
                    cfg.logs.max_line_bytes,
                ))
                .await
                .is_ok()
            {
                sent += 1;
            }
        }
    }
}

/// An entry of `journalctl -o json`, its message cut at `max_bytes`.
pub fn journal_entry(line: &str, max_bytes: usize) -> Option<(Entry, Option<String>)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let text = |k: &str| match &v[k] {
        serde_json::Value::String(s) => Some(s.clone()),
        // A message that is not UTF-8 comes as an array of bytes.
        serde_json::Value::Array(a) => Some(
            String::from_utf8_lossy(
                &a.iter()
                    .filter_map(|b| b.as_u64().map(|b| b as u8))
                    .collect::<Vec<u8>>(),
            )
            .into_owned(),
        ),
        _ => None,
    };
    let mut message = text("MESSAGE")?;
    if message.len() > max_bytes {
        let mut cut = max_bytes;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let level = match text("PRIORITY").and_then(|p| p.parse::<u8>().ok()) {
        Some(0..=3) => "error",
        Some(4) => "warn",
        Some(7) => "debug",
        _ => "info",
    };
    let ms = text("__REALTIME_TIMESTAMP")
        .and_then(|t| t.parse::<i64>().ok())
        .map_or_else(lines::now_ms, |us| us / 1000);
    Some((
        Entry {
            timestamp: lines::rfc3339(ms),
            level,
            module: text("SYSLOG_IDENTIFIER").unwrap_or_default(),
            message,
        },
        text("__CURSOR"),
    ))
}

/// Follows the journal for as long as the daemon runs (restarting `journalctl` if it ends).
/// `kept`: how many of its entries the batcher has put in the spool so far; the cursor is
/// kept only once the entries before it are in the spool.
pub async fn journal(
    cfg: Config,
    tx: mpsc::Sender<Entry>,
    kept: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    let mut sent = 0u64;
    let mut pending: std::collections::VecDeque<(u64, String)> = Default::default();
    let cursor_file = cfg.state_dir.join("journal.cursor");
    loop {
        let cursor = std::fs::read_to_string(&cursor_file).ok();
        let mut cmd = tokio::process::Command::new("journalctl");
        cmd.args(["-f", "-o", "json", "--no-pager"]);
        match cursor.as_deref().map(str::trim).filter(|c| !c.is_empty()) {
            Some(c) => cmd.arg(format!("--after-cursor={c}")),
            None => cmd.arg("--since=now"),
        };
        let child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("fleetops-agent: journalctl cannot run here; the journal is not shipped");
            return;
        };
        if let Some(out) = child.stdout.take() {
            let mut lines_in = tokio::io::BufReader::new(out).lines();
            let mut last_saved = std::time::Instant::now();
            while let Ok(Some(line)) = lines_in.next_line().await {
                let Some((e, cursor)) = journal_entry(&line, cfg.logs.max_line_bytes) else {
                    continue;
                };
                if tx.send(e).await.is_err() {
                    return;
                }
                sent += 1;
                if let Some(c) = cursor {
                    pending.push_back((sent, c));
                }
                if last_saved.elapsed() >= Duration::from_secs(1) {
                    let in_spool = kept.load(std::sync::atomic::Ordering::SeqCst);
                    let mut ready = None;
                    while pending.front().is_some_and(|(n, _)| *n <= in_spool) {
                        ready = pending.pop_front().map(|(_, c)| c);
                    }
                    if let Some(c) = ready {
                        let _ = crate::files::write_private(&cursor_file, c.as_bytes());
                    }
                    // Bounded: past this many, the oldest cursors are not needed.
                    while pending.len() > 100_000 {
                        pending.pop_front();
                    }
                    last_saved = std::time::Instant::now();
                }
            }
        }
        let _ = child.wait().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_entries_carry_their_level_module_time_and_cursor() {
        let (e, c) = journal_entry(
            r#"{"MESSAGE":"motor hot","PRIORITY":"4","SYSLOG_IDENTIFIER":"drive","__REALTIME_TIMESTAMP":"1795863541839000","__CURSOR":"s=abc"}"#,
            1000,
        )
        .unwrap();
        assert_eq!(
            (e.level, e.module.as_str(), e.message.as_str()),
            ("warn", "drive", "motor hot")
        );
        assert_eq!(e.timestamp, "2026-11-28T10:59:01.839Z");
        assert_eq!(c.as_deref(), Some("s=abc"));
        let (e, _) = journal_entry(r#"{"MESSAGE":[104,105],"PRIORITY":"2"}"#, 1000).unwrap();
        assert_eq!((e.level, e.message.as_str()), ("error", "hi"));
        assert!(journal_entry("not json", 1000).is_none());
        assert!(journal_entry(r#"{"PRIORITY":"6"}"#, 1000).is_none());
        let (e, _) = journal_entry(r#"{"MESSAGE":"abcdef"}"#, 3).unwrap();
        assert_eq!(e.message, "abc");
    }
}
