//! kill -9 at each step of a seal and between a session's deletion and its segments' deletion:
//! no line lost or duplicated, nothing left behind.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::{client, field};
use crate::common::{DEV, eventually, files};

/// A data directory whose server seals every batch at once into segments of 20-line chunks,
/// with a housekeeping pass every second.
fn sealing_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        "[logs]\nseal_lines = 1\nchunk_lines = 20\n[supervision]\nhousekeeping_seconds = 1\n",
    )
    .unwrap();
    dir
}

/// Lines of each marker in the session's export (which reads every chunk, sealed or not).
async fn marker_counts(
    c: &reqwest::Client,
    base: &str,
    key: &str,
    sid: u64,
) -> BTreeMap<String, usize> {
    let r = c
        .get(format!(
            "{base}{DEV}/sessions/{sid}/logs/export?format=json"
        ))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let all: Value = r.json().await.unwrap();
    let mut out = BTreeMap::new();
    for e in all.as_array().unwrap() {
        let m = e["message"]
            .as_str()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        *out.entry(m).or_default() += 1;
    }
    out
}

/// Waits for the process to end by itself (a failpoint aborted it); false after 20 s.
fn ended(p: &mut crate::cli::Proc) -> bool {
    for _ in 0..400 {
        if p.child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

each_backend!(kill_9_at_each_seal_step_loses_and_duplicates_no_line);
/// `kill -9` (an abort at a failpoint) after a seal's segment is written and before its
/// transaction, and again right after the transaction: after a restart every acknowledged
/// batch is there exactly once, the one in doubt whole or absent, every chunk readable.
async fn kill_9_at_each_seal_step_loses_and_duplicates_no_line() {
    for point in ["seal:after-put", "seal:after-commit"] {
        let dir = sealing_dir();
        let mut p = crate::cli::serve(dir.path(), &[("FLEETOPS_FAILPOINT", point)]);
        let key = field(&p.stdout, "API key:").unwrap().to_string();
        let c = client();
        let base = p.base.clone();
        let (token, sid) = crate::cli::device_and_session(&c, &base, &key).await;
        let (mut acked, mut doubt) = (Vec::new(), None);
        for i in 0..500 {
            let marker = format!("m{i}");
            let batch: Vec<_> = (0..5)
                .map(|j| json!({"level": "info", "message": format!("{marker} {j}")}))
                .collect();
            match c
                .post(format!("{base}{DEV}/sessions/{sid}/logs"))
                .bearer_auth(&token)
                .json(&batch)
                .send()
                .await
            {
                Ok(r) if r.status() == 202 => acked.push(marker),
                _ => {
                    doubt = Some(marker);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(ended(&mut p), "{point}: the failpoint was never reached");
        drop(p);
        let p = crate::cli::serve(dir.path(), &[]);
        let base = p.base.clone();
        let check = |counts: BTreeMap<String, usize>| {
            for m in &acked {
                assert_eq!(counts.get(m), Some(&5), "{point}: {m}");
            }
            let extra: Vec<_> = counts
                .iter()
                .filter(|(m, n)| !acked.contains(m) && (Some(*m) != doubt.as_ref() || **n != 5))
                .collect();
            assert!(extra.is_empty(), "{point}: {extra:?}");
        };
        check(marker_counts(&c, &base, &key, sid).await);
        // Completing seals what was left; every line reads back from segments the same.
        let r = c
            .post(format!("{base}{DEV}/sessions/{sid}/complete"))
            .bearer_auth(&token)
            .json(&json!({"status": "completed"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
        check(marker_counts(&c, &base, &key, sid).await);
        assert!(!files(&dir.path().join("data/blobs/logs")).is_empty());
    }
}

each_backend!(kill_9_between_a_delete_and_its_segments_deletion_leaves_nothing);
/// `kill -9` between a session's delete and the deletion of its segments: the restart
/// answers 404 for it and the housekeeper deletes its segments from the to-delete list.
async fn kill_9_between_a_delete_and_its_segments_deletion_leaves_nothing() {
    let dir = sealing_dir();
    let mut p = crate::cli::serve(dir.path(), &[("FLEETOPS_FAILPOINT", "delete:after-commit")]);
    let key = field(&p.stdout, "API key:").unwrap().to_string();
    let c = client();
    let base = p.base.clone();
    let (token, sid) = crate::cli::device_and_session(&c, &base, &key).await;
    for i in 0..6 {
        let batch: Vec<_> = (0..10)
            .map(|j| json!({"level": "info", "message": format!("m{i} {j}")}))
            .collect();
        let r = c
            .post(format!("{base}{DEV}/sessions/{sid}/logs"))
            .bearer_auth(&token)
            .json(&batch)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
    }
    let segs = dir.path().join("data/blobs/logs");
    // Every batch sealed, and no seal under way: the abort below leaves no segment of a seal
    // in flight (that one would be an orphan, for the hourly sweep).
    let sealed = || async {
        let text = c
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines().any(|l| l == "fleetops_log_batches_sealed 6")
    };
    assert!(eventually(30, sealed).await);
    assert!(!files(&segs).is_empty());
    let _ = c
        .delete(format!("{base}{DEV}/sessions/{sid}"))
        .bearer_auth(&key)
        .send()
        .await;
    assert!(ended(&mut p), "the failpoint was never reached");
    drop(p);
    assert!(!files(&segs).is_empty(), "the segments outlived the kill");
    let p = crate::cli::serve(dir.path(), &[]);
    let r = c
        .get(format!("{}{DEV}/sessions/{sid}", p.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(
        eventually(30, || async { files(&segs).is_empty() }).await,
        "{:?}",
        files(&segs)
    );
}
