//! The log spool: batches of lines kept on disk until the service has stored them, so lines
//! survive the service being out of reach and the agent being killed. Each batch is one file
//! named by its number (`{n:020}.ndjson`), written whole and synced before it is offered; the
//! shipper sends the oldest with `X-Batch-Sequence: n` and deletes it once answered 202, so a
//! batch sent again after a lost answer (or after a restart) is stored once by the service.
//!
//! The spool is bounded in bytes (`[logs] max_buffer_bytes`): a batch that would pass the
//! bound pushes out the oldest batches, whose lines are counted as dropped and reported in a
//! line of their own once the service takes batches again.

use std::path::{Path, PathBuf};

use crate::files::write_private;

pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    /// The next batch's number.
    next: u64,
    /// Batches on disk, oldest first: number, bytes, lines.
    queued: std::collections::VecDeque<(u64, u64, u64)>,
    bytes: u64,
    /// Lines pushed out by the bound and not reported yet.
    pub dropped: u64,
}

/// The file keeping the next batch's number.
const NEXT: &str = "next";

fn name(n: u64) -> String {
    format!("{n:020}.ndjson")
}

impl Spool {
    /// Opens (or makes) the spool in `dir`, taking up what an earlier run left there.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Self> {
        crate::files::private_dir(dir)?;
        let mut queued = Vec::new();
        // The next number as last written: numbers never go back, even once every batch left.
        let counted: u64 = std::fs::read_to_string(dir.join(NEXT))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(1);
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let file = e.file_name();
            let name = file.to_string_lossy();
            let Some(n) = name
                .strip_suffix(".ndjson")
                .and_then(|f| f.parse::<u64>().ok())
            else {
                if name.ends_with(".tmp") {
                    // A batch that was being written when the agent died: never offered.
                    let _ = std::fs::remove_file(e.path());
                }
                // Anything else is its owner's (a run's lock and session).
                continue;
            };
            let bytes = e.metadata()?.len();
            let lines = std::fs::read(e.path())?
                .iter()
                .filter(|b| **b == b'\n')
                .count() as u64;
            queued.push((n, bytes, lines));
        }
        queued.sort_unstable();
        let next = queued.last().map_or(1, |q| q.0 + 1).max(counted);
        let bytes = queued.iter().map(|q| q.1).sum();
        Ok(Self {
            dir: dir.to_path_buf(),
            max_bytes,
            next,
            queued: queued.into(),
            bytes,
            dropped: 0,
        })
    }

    /// Keeps a batch (NDJSON, one entry a line) on disk; its number.
    pub fn push(&mut self, body: &[u8], lines: u64) -> std::io::Result<u64> {
        let size = body.len() as u64;
        while !self.queued.is_empty() && self.bytes + size > self.max_bytes {
            if let Some((n, bytes, lines)) = self.queued.pop_front() {
                let _ = std::fs::remove_file(self.dir.join(name(n)));
                self.bytes -= bytes;
                self.dropped += lines;
            }
        }
        let n = self.next;
        self.next += 1;
        write_private(&self.dir.join(name(n)), body)?;
        write_private(&self.dir.join(NEXT), self.next.to_string().as_bytes())?;
        self.queued.push_back((n, size, lines));
        self.bytes += size;
        Ok(n)
    }

    /// The oldest batch: its number and body.
    pub fn oldest(&self) -> std::io::Result<Option<(u64, Vec<u8>)>> {
        match self.queued.front() {
            Some(&(n, _, _)) => Ok(Some((n, std::fs::read(self.dir.join(name(n)))?))),
            None => Ok(None),
        }
    }

    /// The service stored batch `n` (or refused it for good): it goes.
    pub fn done(&mut self, n: u64) {
        if let Some(i) = self.queued.iter().position(|q| q.0 == n) {
            if let Some((_, bytes, _)) = self.queued.remove(i) {
                self.bytes -= bytes;
            }
            let _ = std::fs::remove_file(self.dir.join(name(n)));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fa-spool-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn batches_come_back_in_order_after_a_restart() {
        let d = dir("restart");
        let mut s = Spool::open(&d, 1 << 20).unwrap();
        assert_eq!(s.push(b"a\n", 1).unwrap(), 1);
        assert_eq!(s.push(b"b\n", 1).unwrap(), 2);
        s.done(1);
        drop(s);
        let mut s = Spool::open(&d, 1 << 20).unwrap();
        assert_eq!(s.oldest().unwrap(), Some((2, b"b\n".to_vec())));
        // Numbers go on rising past what was left, and past what was sent.
        assert_eq!(s.push(b"c\n", 1).unwrap(), 3);
        s.done(2);
        s.done(3);
        drop(s);
        let mut s = Spool::open(&d, 1 << 20).unwrap();
        assert!(s.is_empty());
        assert_eq!(s.push(b"d\n", 1).unwrap(), 4);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn past_its_bound_the_oldest_batches_go_and_are_counted() {
        let d = dir("bound");
        let mut s = Spool::open(&d, 10).unwrap();
        s.push(b"1234\n", 1).unwrap();
        s.push(b"5678\n", 1).unwrap();
        s.push(b"9abc\n", 1).unwrap();
        assert_eq!(s.dropped, 1);
        assert_eq!(s.bytes(), 10);
        assert_eq!(s.oldest().unwrap().unwrap().0, 2);
        let _ = std::fs::remove_dir_all(d);
    }
}
