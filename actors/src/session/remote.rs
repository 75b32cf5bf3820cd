//! What a session's actor tells the same session's actors on the other nodes, over the bus
//! (`fleetops.live.{session}`): each batch it stored, with its arrival index and chunk number,
//! and the session's end. A node whose actor has live subscribers fans the other nodes'
//! batches out as its own, in arrival order; a batch the bus lost is read back from the store
//! when the next one arrives (`SessionState::deliver`).
//!
//! A message is one tag byte and big-endian numbers, then the chunk as the store keeps it.
//! A chunk too large for one bus message travels as a notice without its entries, and the
//! receiver reads it from the store.

use bytes::Bytes;
use fleetops_storage::{Columns, LogChunk};

/// Chunks up to this many bytes travel whole (NATS's default largest message is 1 MiB).
const MAX_INLINE: usize = 512 << 10;

const BATCH: u8 = 0;
const NOTICE: u8 = 1;
const END: u8 = 2;

pub(crate) fn subject(session: u64) -> String {
    format!("fleetops.live.{session}")
}

/// One message about a session.
pub(crate) enum Remote {
    /// A stored batch: its first entry's arrival index, its chunk number, the chunk.
    Batch(u64, u64, Box<LogChunk>),
    /// A stored batch too large to send: its first arrival index, entries, chunk number.
    Notice(u64, u64, u64),
    /// The session ended with this status (`None`: deleted).
    End(Option<String>),
}

pub(crate) fn batch(first_seq: u64, chunk_seq: u64, chunk: &LogChunk) -> Vec<u8> {
    let body = chunk.to_bytes().unwrap_or_default();
    if body.is_empty() || body.len() > MAX_INLINE {
        let mut m = vec![NOTICE];
        m.extend_from_slice(&first_seq.to_be_bytes());
        m.extend_from_slice(&(chunk.len() as u64).to_be_bytes());
        m.extend_from_slice(&chunk_seq.to_be_bytes());
        return m;
    }
    let mut m = Vec::with_capacity(17 + body.len());
    m.push(BATCH);
    m.extend_from_slice(&first_seq.to_be_bytes());
    m.extend_from_slice(&chunk_seq.to_be_bytes());
    m.extend_from_slice(&body);
    m
}

pub(crate) fn end(status: Option<&str>) -> Vec<u8> {
    let mut m = vec![END];
    if let Some(s) = status {
        m.extend_from_slice(s.as_bytes());
    } else {
        m.push(0);
    }
    m
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The message, or `None` for one this build does not read.
pub(crate) fn parse(b: &Bytes) -> Option<Remote> {
    match *b.first()? {
        BATCH => Some(Remote::Batch(
            u64_at(b, 1)?,
            u64_at(b, 9)?,
            Box::new(LogChunk::from_bytes(b.get(17..)?).ok()?),
        )),
        NOTICE => Some(Remote::Notice(u64_at(b, 1)?, u64_at(b, 9)?, u64_at(b, 17)?)),
        END => {
            let rest = b.get(1..)?;
            Some(Remote::End(if rest == [0] {
                None
            } else {
                Some(String::from_utf8(rest.to_vec()).ok()?)
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn each_message_reads_back_as_sent_and_garbage_reads_as_nothing() {
        let mut c = LogChunk::default();
        c.push(5, 2, 0, "hello", b"").unwrap();
        let Some(Remote::Batch(7, 3, back)) = parse(&Bytes::from(batch(7, 3, &c))) else {
            panic!("not a batch")
        };
        assert_eq!(back.len(), 1);
        assert!(matches!(
            parse(&Bytes::from(end(Some("completed")))),
            Some(Remote::End(Some(s))) if s == "completed"
        ));
        assert!(matches!(
            parse(&Bytes::from(end(None))),
            Some(Remote::End(None))
        ));
        assert!(parse(&Bytes::from_static(&[BATCH, 1, 2])).is_none());
        assert!(parse(&Bytes::from_static(&[9])).is_none());
        assert!(parse(&Bytes::new()).is_none());
    }
}
