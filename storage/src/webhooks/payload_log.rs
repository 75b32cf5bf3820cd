//! The payload log: webhook payloads, kept out of sled in append-only segment files.
//!
//! A 23 KB payload written into a sled tree is copied into its node and rewritten whenever the
//! node is, and nodes full of payloads exceed sled's blob threshold, so every consolidation
//! creates and deletes a file: about half of the intake's cost. Here a batch of payloads is
//! one `write` and one `fdatasync`, done before the sled batch that refers to them, so a
//! stored delivery never points at bytes that are not on disk.
//!
//! A segment is named by the first seq it holds (`{seq:020}.log`), so segment `k` holds the
//! seqs below the next segment's name, and the housekeeper deletes a whole segment once the
//! oldest delivery still in the log is past it. Each record is `len: u32 LE`, `crc32: u32 LE`,
//! then the bytes; the delivery keeps `(segment, offset)` and the length.
//!
//! The log is also the intake's write-ahead journal: each batch's payloads are followed, in
//! the same write and under the same `fdatasync`, by one journal record (its length carries
//! [`JOURNAL`]) holding the batch's deliveries. The intake answers 202 once that is on disk,
//! before sled has flushed the deliveries; on open, the store reads the journal records past
//! the last batch sled holds and writes them again (`Store::recover_deliveries`). A segment
//! is only ever appended to after whole records: when the last one ends in a torn record, the
//! next batch starts a new segment, so a journal record never follows garbage.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::{Result, StorageError};

/// A segment is closed once it reaches this size.
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const HEADER: usize = 8;
/// Set in a record's length when the record is a batch's journal, not a payload: a payload
/// read (which checks the length it expects) can never return one, and a scan tells them
/// apart without reading payloads. Payloads are far below 2 GiB (the body limit).
const JOURNAL: u32 = 1 << 31;

/// Where a payload is: its segment (named by the segment's first seq) and byte offset.
pub type PayloadAt = (u64, u64);

pub(crate) struct PayloadLog {
    dir: PathBuf,
    /// [`SEGMENT_BYTES`]; smaller in tests.
    pub(crate) segment_bytes: std::sync::atomic::AtomicU64,
    writer: Mutex<Option<Writer>>,
    /// The segment read last, kept open: the worker reads in arrival order.
    reader: Mutex<Option<(u64, Arc<File>)>>,
}

/// Where a batch was written: its segment and the byte range it took.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    segment: u64,
    start: u64,
    end: u64,
}

struct Writer {
    segment: u64,
    file: File,
    len: u64,
}

impl PayloadLog {
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        // The directory's own entry must be durable too (power loss, not only kill -9).
        crate::create_dir_durable(dir)?;
        let writer = match segments(dir)?.last() {
            Some(&segment) => {
                let file = OpenOptions::new()
                    .append(true)
                    .open(dir.join(name(segment)))?;
                // A torn tail (a write the crash cut short) is never referenced: its sled
                // batch comes after the fdatasync. Appending after it is safe.
                let len = file.metadata()?.len();
                Some(Writer { segment, file, len })
            }
            None => None,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            segment_bytes: SEGMENT_BYTES.into(),
            writer: Mutex::new(writer),
            reader: Mutex::new(None),
        })
    }

    /// Appends `(seq, payload)` pairs, in rising seq order, and makes them durable; returns
    /// where each one is. On failure nothing written here is referenced, and the segment is
    /// cut back to where it was.
    #[cfg(test)]
    pub(crate) fn append(&self, items: &[(u64, &[u8])]) -> Result<Vec<PayloadAt>> {
        let Some(&(first_seq, _)) = items.first() else {
            return Ok(Vec::new());
        };
        Ok(self.append_journaled(first_seq, items, |_| Ok(None))?.0)
    }

    /// As `append`, followed in the same write and `fdatasync` by the journal record
    /// `journal` makes from the payloads' places (none when it returns `None`). `first_seq`
    /// is the batch's lowest seq (it names a new segment); a batch may carry a journal and no
    /// payloads.
    pub(crate) fn append_journaled(
        &self,
        first_seq: u64,
        items: &[(u64, &[u8])],
        journal: impl FnOnce(&[PayloadAt]) -> Result<Option<Vec<u8>>>,
    ) -> Result<(Vec<PayloadAt>, Mark)> {
        let mut guard = self.writer.lock().map_err(|_| poisoned())?;
        // A segment is named by the lowest seq it may hold, so a new one is started only for a
        // seq above the open one's name (after a crash lost a batch, the seq counter may
        // hand out seqs again; they go on into the open segment).
        let limit = self
            .segment_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        let rotate = match guard.as_ref() {
            None => true,
            Some(w) => w.len >= limit && first_seq > w.segment,
        };
        if rotate {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(name(first_seq)))?;
            let len = file.metadata()?.len();
            // The new file's directory entry must be durable before anything points into it.
            File::open(&self.dir)?.sync_all()?;
            *guard = Some(Writer {
                segment: first_seq,
                file,
                len,
            });
        }
        let w = guard.as_mut().ok_or_else(poisoned)?;
        // Where each payload will be, known before writing: the journal names them.
        let mut out = Vec::with_capacity(items.len());
        let mut at = w.len;
        for (_, p) in items {
            out.push((w.segment, at));
            at += (HEADER + p.len()) as u64;
        }
        let journal = journal(&out)?;
        if journal
            .as_ref()
            .is_some_and(|j| u32::try_from(j.len()).map_or(true, |l| l & JOURNAL != 0))
        {
            return Err(StorageError::Config(
                "a webhook batch's journal over 2 GiB".into(),
            ));
        }
        let written = write_records(&mut w.file, w.len, items, journal.as_deref())
            .and_then(|end| w.file.sync_data().map(|()| end));
        match written {
            Ok(end) => {
                debug_assert!(journal.is_some() || end == at);
                let mark = Mark {
                    segment: w.segment,
                    start: w.len,
                    end,
                };
                w.len = end;
                Ok((out, mark))
            }
            Err(e) => {
                // Cut back; if even that fails, the file may end in a torn record, so the
                // next batch starts a new segment (a journal never follows bytes a scan
                // cannot cross).
                if w.file.set_len(w.len).is_err() {
                    *guard = None;
                }
                Err(e.into())
            }
        }
    }

    /// Takes back the batch `mark` names, which must be the last one written (the caller
    /// could not store what it describes, and answered that it was not taken): its journal
    /// must not bring it back at the next start. If the cut fails, the next batch starts a
    /// new segment and the error says the batch may come back.
    pub(crate) fn cut_back(&self, mark: Mark) -> Result<()> {
        let mut guard = self.writer.lock().map_err(|_| poisoned())?;
        let Some(w) = guard.as_mut() else {
            return Err(StorageError::Config(
                "the payload log's batch to cut is gone".into(),
            ));
        };
        if w.segment != mark.segment || w.len != mark.end {
            return Err(StorageError::Config(
                "the payload log moved past the batch to cut".into(),
            ));
        }
        match w.file.set_len(mark.start).and_then(|()| w.file.sync_data()) {
            Ok(()) => {
                w.len = mark.start;
                Ok(())
            }
            Err(e) => {
                *guard = None;
                Err(e.into())
            }
        }
    }

    /// The payload at `at`, `len` bytes long; `None` when its segment was deleted.
    pub(crate) fn read(&self, at: PayloadAt, len: u64) -> Result<Option<Vec<u8>>> {
        let (segment, offset) = at;
        let file = {
            let mut r = self.reader.lock().map_err(|_| poisoned())?;
            match r.as_ref() {
                Some((s, f)) if *s == segment => f.clone(),
                _ => {
                    let f = match File::open(self.dir.join(name(segment))) {
                        Ok(f) => Arc::new(f),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                        Err(e) => return Err(e.into()),
                    };
                    *r = Some((segment, f.clone()));
                    f
                }
            }
        };
        let mut head = [0u8; HEADER];
        file.read_exact_at(&mut head, offset)?;
        let [a, b, c, d, e, f, g, h] = head;
        let stored_len = u32::from_le_bytes([a, b, c, d]);
        let crc = u32::from_le_bytes([e, f, g, h]);
        if u64::from(stored_len) != len {
            return Err(corrupt(segment, offset));
        }
        let mut body = vec![0u8; stored_len as usize];
        file.read_exact_at(&mut body, offset + HEADER as u64)?;
        if crc32fast::hash(&body) != crc {
            return Err(corrupt(segment, offset));
        }
        Ok(Some(body))
    }

    /// The segment being written, if any. Read it *before* looking for the oldest delivery
    /// still needed: a batch the intake is writing meanwhile is in this segment or a later one.
    pub(crate) fn current(&self) -> Result<Option<u64>> {
        Ok(self
            .writer
            .lock()
            .map_err(|_| poisoned())?
            .as_ref()
            .map(|w| w.segment))
    }

    /// Deletes the segments whose every seq is below `oldest_kept` (the oldest delivery still
    /// in the log) and that come before `current` (as [`PayloadLog::current`] gave it before the
    /// caller's scan): never a segment a batch may be being written into.
    pub(crate) fn release_before(&self, oldest_kept: u64, current: Option<u64>) -> Result<usize> {
        let Some(current) = current else {
            return Ok(0);
        };
        let oldest_kept = oldest_kept.min(current);
        let all = segments(&self.dir)?;
        let mut removed = 0;
        for pair in all.windows(2) {
            let [seg, next] = pair else { continue };
            if *next <= oldest_kept && *seg < current {
                std::fs::remove_file(self.dir.join(name(*seg)))?;
                removed += 1;
            }
        }
        if removed > 0
            && let Ok(mut r) = self.reader.lock()
        {
            *r = None;
        }
        Ok(removed)
    }

    /// The newest segment's name, if any.
    pub(crate) fn last_segment(&self) -> Result<Option<u64>> {
        Ok(segments(&self.dir)?.last().copied())
    }

    /// The next batch starts a new segment (after a torn tail, or on the first open of a
    /// log written before the journal: never append a journal after bytes no scan can cross).
    pub(crate) fn start_new_segment(&self) -> Result<()> {
        *self.writer.lock().map_err(|_| poisoned())? = None;
        Ok(())
    }

    /// The journal records of every segment that may hold a seq above `after`, oldest first,
    /// and whether the newest segment ends in a torn record. A segment's scan stops at its
    /// first record that runs past the file's end or, for a journal, fails its checksum
    /// (payloads are stepped over by their length, not read).
    pub(crate) fn journals_after(&self, after: u64) -> Result<(Vec<Vec<u8>>, bool)> {
        let all = segments(&self.dir)?;
        let first = all
            .iter()
            .rposition(|&s| s <= after.saturating_add(1))
            .unwrap_or(0);
        let mut out = Vec::new();
        let mut torn = false;
        for (i, &segment) in all.iter().enumerate().skip(first) {
            let file = File::open(self.dir.join(name(segment)))?;
            let size = file.metadata()?.len();
            let mut offset = 0u64;
            let whole = loop {
                if offset == size {
                    break true;
                }
                if offset + HEADER as u64 > size {
                    break false;
                }
                let mut head = [0u8; HEADER];
                file.read_exact_at(&mut head, offset)?;
                let [a, b, c, d, e, f, g, h] = head;
                let raw = u32::from_le_bytes([a, b, c, d]);
                let crc = u32::from_le_bytes([e, f, g, h]);
                let len = u64::from(raw & !JOURNAL);
                let end = offset + HEADER as u64 + len;
                if end > size {
                    break false;
                }
                if raw & JOURNAL != 0 {
                    // At most the file's own bytes (checked above).
                    let mut body = vec![0u8; len as usize];
                    file.read_exact_at(&mut body, offset + HEADER as u64)?;
                    if crc32fast::hash(&body) != crc {
                        break false;
                    }
                    out.push(body);
                }
                offset = end;
            };
            if !whole {
                if i + 1 == all.len() {
                    torn = true;
                } else {
                    tracing::warn!(
                        segment = %name(segment),
                        offset,
                        "the payload log ends early in a closed segment (a crash cut a write)"
                    );
                }
            }
        }
        Ok((out, torn))
    }
}

/// Small records are gathered into one write of up to this many bytes; a larger payload is
/// written from the caller's buffer, so a batch never holds a second copy of its bodies.
const GATHER_BYTES: usize = 1024 * 1024;

/// Appends `items` at `start` (the segment's current end), then the journal record if any;
/// returns the new end.
fn write_records(
    file: &mut File,
    start: u64,
    items: &[(u64, &[u8])],
    journal: Option<&[u8]>,
) -> std::io::Result<u64> {
    let mut end = start;
    let mut buf = Vec::with_capacity(GATHER_BYTES.min(
        items.iter().map(|(_, p)| HEADER + p.len()).sum::<usize>()
            + journal.map_or(0, |j| HEADER + j.len()),
    ));
    let records = items
        .iter()
        .map(|(_, p)| (*p, 0u32))
        .chain(journal.map(|j| (j, JOURNAL)));
    for (p, flag) in records {
        let len = u32::try_from(p.len())
            .ok()
            .filter(|l| l & JOURNAL == 0)
            .ok_or_else(|| std::io::Error::other("a webhook payload over 2 GiB"))?;
        buf.extend_from_slice(&(len | flag).to_le_bytes());
        buf.extend_from_slice(&crc32fast::hash(p).to_le_bytes());
        if p.len() >= GATHER_BYTES {
            file.write_all(&buf)?;
            end += buf.len() as u64;
            buf.clear();
            file.write_all(p)?;
            end += p.len() as u64;
        } else {
            buf.extend_from_slice(p);
            if buf.len() >= GATHER_BYTES {
                file.write_all(&buf)?;
                end += buf.len() as u64;
                buf.clear();
            }
        }
    }
    file.write_all(&buf)?;
    Ok(end + buf.len() as u64)
}

fn name(segment: u64) -> String {
    format!("{segment:020}.log")
}

/// The segments present, oldest first.
fn segments(dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(seq) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push(seq);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn poisoned() -> StorageError {
    StorageError::Config("the payload log's lock was poisoned".into())
}

fn corrupt(segment: u64, offset: u64) -> StorageError {
    StorageError::Corrupt(format!(
        "webhook payload at {}:{offset} fails its length or checksum",
        name(segment)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_read_back_survive_reopen_and_release_whole_segments() {
        let dir = tempfile::tempdir().unwrap();
        let s = PayloadLog::open(dir.path()).unwrap();
        let at = s.append(&[(1, b"one"), (2, b"two!")]).unwrap();
        assert_eq!(s.read(at[1], 4).unwrap().unwrap(), b"two!");
        assert!(s.read(at[1], 3).is_err(), "a wrong length is caught");
        drop(s);
        let s = PayloadLog::open(dir.path()).unwrap();
        let more = s.append(&[(3, b"three")]).unwrap();
        assert_eq!(more[0].0, 1, "appends continue the open segment");
        assert_eq!(s.read(at[0], 3).unwrap().unwrap(), b"one");
        assert_eq!(s.read(more[0], 5).unwrap().unwrap(), b"three");
        // Force a second segment, then release the first once seq 4 is the oldest kept.
        s.segment_bytes
            .store(1, std::sync::atomic::Ordering::Relaxed);
        let next = s.append(&[(4, b"four")]).unwrap();
        assert_eq!(next[0], (4, 0));
        let cur = s.current().unwrap();
        assert_eq!(cur, Some(4));
        assert_eq!(
            s.release_before(3, cur).unwrap(),
            0,
            "seq 3 still lives in segment 1"
        );
        assert_eq!(
            s.release_before(u64::MAX, Some(1)).unwrap(),
            0,
            "nor before a batch"
        );
        assert_eq!(s.release_before(4, cur).unwrap(), 1);
        assert!(s.read(at[0], 3).unwrap().is_none());
        assert_eq!(
            s.release_before(u64::MAX, cur).unwrap(),
            0,
            "the open one stays"
        );
        // A seq not above the open segment's name (handed out again after a crash) does not
        // start a segment below it.
        let again = s.append(&[(2, b"re")]).unwrap();
        assert_eq!(again[0].0, 4);
        assert_eq!(s.read(next[0], 4).unwrap().unwrap(), b"four");
    }

    #[test]
    fn large_and_small_payloads_mixed_in_one_batch_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = PayloadLog::open(dir.path()).unwrap();
        let big = vec![7u8; GATHER_BYTES + 5];
        let small = vec![1u8; GATHER_BYTES / 2 + 1];
        let items: Vec<(u64, &[u8])> =
            vec![(1, b"a"), (2, &big), (3, &small), (4, &small), (5, b"z")];
        let at = s.append(&items).unwrap();
        for ((_, p), at) in items.iter().zip(at) {
            assert_eq!(&s.read(at, p.len() as u64).unwrap().unwrap(), p);
        }
        let more = s.append(&[(6, b"next")]).unwrap();
        assert_eq!(s.read(more[0], 4).unwrap().unwrap(), b"next");
    }

    #[test]
    fn a_flipped_byte_is_an_error_not_wrong_data() {
        let dir = tempfile::tempdir().unwrap();
        let s = PayloadLog::open(dir.path()).unwrap();
        let at = s.append(&[(7, b"payload")]).unwrap();
        let path = dir.path().join(name(7));
        let mut bytes = std::fs::read(&path).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let s = PayloadLog::open(dir.path()).unwrap();
        assert!(s.read(at[0], 7).is_err());
    }
}
