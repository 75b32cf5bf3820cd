//! What a node tells the others of a project's alert signals, over the bus: every heartbeat,
//! log batch, rollout result and change of devices a node's handles report goes to
//! `fleetops.signals.{project}`, where the node whose evaluator holds the project's lease
//! judges it as its own (the others' evaluators stand by). A change of a project's rules goes
//! to `fleetops.rules`, so every node knows which projects have rules.
//!
//! A message is one tag byte and big-endian numbers, then JSON metrics or the log chunk as
//! the store keeps it. Delivery is at most once: a lost heartbeat is one sample fewer (the
//! next one counts), a lost log batch is one the rules do not see, as when the evaluators'
//! byte budget is full.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use fleetops_storage::{LogChunk, RolloutStatus};

/// The lease of a project's alerting: its evaluator judges and its notifier sends on the node
/// holding it.
pub(crate) fn lease_name(pid: u64) -> String {
    format!("alerts/{pid}")
}

pub(crate) fn subject(pid: u64) -> String {
    format!("fleetops.signals.{pid}")
}

/// The largest signal sent (NATS's default largest message is 1 MiB): a larger log batch is
/// not seen by the other nodes' evaluators.
pub(crate) const MAX_MESSAGE: usize = 512 << 10;

/// Where a change of a project's rules is told (its id, 8 bytes big-endian).
pub(crate) const RULES_SUBJECT: &str = "fleetops.rules";

const HEARTBEAT: u8 = 0;
const LOGS: u8 = 1;
const ROLLOUT: u8 = 2;
const DEVICES: u8 = 3;

/// A signal as it travels.
pub(crate) enum Signal {
    Heartbeat {
        device_id: u64,
        at: i64,
        metrics: Arc<BTreeMap<String, f64>>,
    },
    Logs {
        device_id: u64,
        chunk: Arc<LogChunk>,
    },
    Rollout {
        device_id: u64,
        status: RolloutStatus,
    },
    DevicesChanged,
}

pub(crate) fn encode(s: &Signal) -> Option<Vec<u8>> {
    let mut m = Vec::new();
    match s {
        Signal::Heartbeat {
            device_id,
            at,
            metrics,
        } => {
            m.push(HEARTBEAT);
            m.extend_from_slice(&device_id.to_be_bytes());
            m.extend_from_slice(&at.to_be_bytes());
            m.extend_from_slice(&serde_json::to_vec(metrics.as_ref()).ok()?);
        }
        Signal::Logs { device_id, chunk } => {
            m.push(LOGS);
            m.extend_from_slice(&device_id.to_be_bytes());
            m.extend_from_slice(&chunk.to_bytes().ok()?);
        }
        Signal::Rollout { device_id, status } => {
            m.push(ROLLOUT);
            m.extend_from_slice(&device_id.to_be_bytes());
            m.extend_from_slice(&serde_json::to_vec(status).ok()?);
        }
        Signal::DevicesChanged => m.push(DEVICES),
    }
    Some(m)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The signal, or `None` for a message this build does not read.
pub(crate) fn decode(b: &Bytes) -> Option<Signal> {
    match *b.first()? {
        HEARTBEAT => Some(Signal::Heartbeat {
            device_id: u64_at(b, 1)?,
            at: u64_at(b, 9)? as i64,
            metrics: Arc::new(serde_json::from_slice(b.get(17..)?).ok()?),
        }),
        LOGS => Some(Signal::Logs {
            device_id: u64_at(b, 1)?,
            chunk: Arc::new(LogChunk::from_bytes(b.get(9..)?).ok()?),
        }),
        ROLLOUT => Some(Signal::Rollout {
            device_id: u64_at(b, 1)?,
            status: serde_json::from_slice(b.get(9..)?).ok()?,
        }),
        DEVICES => Some(Signal::DevicesChanged),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn each_signal_reads_back_as_sent_and_garbage_reads_as_nothing() {
        let metrics = Arc::new(BTreeMap::from([("cpu".to_string(), 0.5)]));
        let b = Bytes::from(
            encode(&Signal::Heartbeat {
                device_id: 7,
                at: -3,
                metrics,
            })
            .unwrap(),
        );
        let Some(Signal::Heartbeat {
            device_id: 7,
            at: -3,
            metrics,
        }) = decode(&b)
        else {
            panic!("not the heartbeat")
        };
        assert_eq!(metrics.get("cpu"), Some(&0.5));
        let b = Bytes::from(
            encode(&Signal::Rollout {
                device_id: 2,
                status: RolloutStatus::Failed,
            })
            .unwrap(),
        );
        assert!(matches!(
            decode(&b),
            Some(Signal::Rollout {
                device_id: 2,
                status: RolloutStatus::Failed
            })
        ));
        assert!(matches!(
            decode(&Bytes::from(encode(&Signal::DevicesChanged).unwrap())),
            Some(Signal::DevicesChanged)
        ));
        assert!(decode(&Bytes::from_static(&[HEARTBEAT, 1])).is_none());
        assert!(decode(&Bytes::from_static(&[42])).is_none());
    }
}
