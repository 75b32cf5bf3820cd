//! What makes a bus message the nodes' own: every message is sealed with AES-256-GCM under a
//! key only the nodes hold, its subject and header authenticated with it, so a client that
//! reaches the NATS server can neither read what the nodes send nor make a node accept
//! anything it sends, or a captured message on another subject.
//!
//! A message on the wire:
//!
//! ```text
//! version (1) ‖ sender (16) ‖ sent at, ms (8) ‖ counter (8) ‖ ciphertext ‖ tag (16)
//! ```
//!
//! - **Keys.** The bus key (32 bytes, generated once and kept in the shared database beside
//!   the JWT secret) never seals anything itself: each run of a node (its sender id, fresh
//!   at every start) seals with its own key, HKDF-SHA256 of the bus key and the sender id.
//! - **Nonces.** A run's nonce is its message counter, so no nonce is ever used twice under
//!   one key (a random 96-bit nonce under one key shared by every node would be safe for
//!   about 2³² messages in all; a counter has no such bound).
//! - **Associated data.** The header and the subject: a message published again on another
//!   subject, or with its sender, time or counter changed, does not open.
//! - **Replays.** A message older than [`WINDOW_MS`] (or as far ahead) is refused, and each
//!   subscription refuses a sender's counter at or below the last one it accepted from that
//!   sender (NATS delivers one connection's messages in order). What remains: a message
//!   published again on its own subject within the window, to a subscription made after it
//!   was sent.
//!
//! Imports nothing of NATS.

use std::collections::HashMap;

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf::{HKDF_SHA256, Salt};
use bytes::Bytes;

/// Length of the bus key.
pub const KEY_LEN: usize = 32;
/// Length of a sender's id.
pub(super) const ORIGIN: usize = 16;
const VERSION: u8 = 1;
const TAG_LEN: usize = 16;
const HEADER: usize = 1 + ORIGIN + 8 + 8;
/// Bytes a sealed message adds to its payload.
pub(super) const OVERHEAD: usize = HEADER + TAG_LEN;
/// How far a message's time may be from the receiver's clock.
pub(super) const WINDOW_MS: i64 = 60_000;
/// Senders a subscription remembers before it forgets those silent past the window.
const SENDERS: usize = 64;

/// A run's key: HKDF-SHA256 of the bus key, with the sender's id as the info.
fn derive(bus_key: &[u8; KEY_LEN], sender: &[u8; ORIGIN]) -> LessSafeKey {
    let info = [b"fleetops bus v1 ".as_slice(), sender.as_slice()];
    let prk = Salt::new(HKDF_SHA256, &[]).extract(bus_key);
    let okm = prk
        .expand(&info, &AES_256_GCM)
        // Only fails for an output longer than 255 hashes; ours is one key.
        .unwrap_or_else(|_| unreachable!("HKDF-SHA256 expands to 32 bytes"));
    LessSafeKey::new(UnboundKey::from(okm))
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[NONCE_LEN - 8..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aad(header: &[u8], subject: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(header.len() + subject.len());
    a.extend_from_slice(header);
    a.extend_from_slice(subject.as_bytes());
    a
}

/// Seals what one run of a node sends; used by the one task that sends, in order.
pub(super) struct Sealer {
    key: LessSafeKey,
    node: [u8; ORIGIN],
    /// The last counter used (the next message takes the one after it).
    counter: u64,
    /// The last time stamped: never goes back, so a sender's counters and times rise together.
    last_ms: i64,
}

impl Sealer {
    pub(super) fn new(bus_key: &[u8; KEY_LEN], node: [u8; ORIGIN]) -> Self {
        Self {
            key: derive(bus_key, &node),
            node,
            counter: 0,
            last_ms: 0,
        }
    }

    /// The message to publish on `subject`.
    pub(super) fn seal(&mut self, subject: &str, payload: &[u8], now_ms: i64) -> Bytes {
        self.counter += 1;
        self.last_ms = self.last_ms.max(now_ms);
        let mut out = Vec::with_capacity(OVERHEAD + payload.len());
        out.push(VERSION);
        out.extend_from_slice(&self.node);
        out.extend_from_slice(&self.last_ms.to_be_bytes());
        out.extend_from_slice(&self.counter.to_be_bytes());
        let mut body = payload.to_vec();
        self.key
            .seal_in_place_append_tag(
                nonce(self.counter),
                Aad::from(aad(&out, subject)),
                &mut body,
            )
            // Only fails past the cipher's message size limit (about 64 GiB).
            .unwrap_or_else(|_| unreachable!("AES-256-GCM seals a NATS-sized message"));
        out.extend_from_slice(&body);
        Bytes::from(out)
    }
}

/// What [`Opener::open`] made of a message.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Opened {
    /// A node's message, its payload opened.
    Payload(Bytes),
    /// Not the nodes' (forged, altered, moved to another subject, replayed, too old): dropped.
    Refused,
}

struct Sender {
    key: LessSafeKey,
    /// The highest counter accepted from it.
    last: u64,
    /// The latest time it stamped.
    last_ms: i64,
}

/// Opens what one subscription receives.
pub(super) struct Opener {
    bus_key: std::sync::Arc<[u8; KEY_LEN]>,
    me: [u8; ORIGIN],
    /// The senders heard from, each with what it last sent.
    senders: HashMap<[u8; ORIGIN], Sender>,
}

impl Opener {
    pub(super) fn new(bus_key: std::sync::Arc<[u8; KEY_LEN]>, me: [u8; ORIGIN]) -> Self {
        Self {
            bus_key,
            me,
            senders: HashMap::new(),
        }
    }

    pub(super) fn open(&mut self, subject: &str, wire: &[u8], now_ms: i64) -> Opened {
        let (Some(header), Some(body)) = (wire.get(..HEADER), wire.get(HEADER..)) else {
            return Opened::Refused;
        };
        if body.len() < TAG_LEN || header[0] != VERSION {
            return Opened::Refused;
        }
        let field = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[at..at + 8]);
            b
        };
        let mut sender = [0u8; ORIGIN];
        sender.copy_from_slice(&header[1..=ORIGIN]);
        if sender == self.me {
            // The client asks the server not to echo a node's own messages back, so one
            // naming this node came from someone else.
            return Opened::Refused;
        }
        let sent_ms = i64::from_be_bytes(field(1 + ORIGIN));
        let counter = u64::from_be_bytes(field(1 + ORIGIN + 8));
        if sent_ms.abs_diff(now_ms) > WINDOW_MS.unsigned_abs() {
            return Opened::Refused;
        }
        let known = self.senders.get(&sender);
        if known.is_some_and(|s| counter <= s.last) {
            return Opened::Refused;
        }
        let fresh;
        let key = match known {
            Some(s) => &s.key,
            None => {
                fresh = derive(&self.bus_key, &sender);
                &fresh
            }
        };
        let mut plain = body.to_vec();
        let Ok(opened) =
            key.open_in_place(nonce(counter), Aad::from(aad(header, subject)), &mut plain)
        else {
            return Opened::Refused;
        };
        let len = opened.len();
        plain.truncate(len);
        match self.senders.get_mut(&sender) {
            Some(s) => {
                s.last = counter;
                s.last_ms = s.last_ms.max(sent_ms);
            }
            None => {
                if self.senders.len() >= SENDERS {
                    // A sender silent past the window: everything it sent is refused by its
                    // time already, so forgetting its counter lets no replay in.
                    self.senders
                        .retain(|_, s| s.last_ms.saturating_add(WINDOW_MS) >= now_ms);
                }
                self.senders.insert(
                    sender,
                    Sender {
                        key: derive(&self.bus_key, &sender),
                        last: counter,
                        last_ms: sent_ms,
                    },
                );
            }
        }
        Opened::Payload(Bytes::from(plain))
    }
}

/// The wall clock in ms since the epoch.
pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; KEY_LEN] = [7; KEY_LEN];
    const A: [u8; ORIGIN] = [1; ORIGIN];
    const B: [u8; ORIGIN] = [2; ORIGIN];
    const NOW: i64 = 1_700_000_000_000;

    fn opener(me: [u8; ORIGIN]) -> Opener {
        Opener::new(std::sync::Arc::new(KEY), me)
    }

    #[test]
    fn a_sealed_message_opens_on_its_subject_and_hides_its_payload() {
        let mut s = Sealer::new(&KEY, A);
        let wire = s.seal("fleetops.live.1", b"secret line", NOW);
        assert!(!wire.windows(11).any(|w| w == b"secret line"));
        assert_eq!(
            opener(B).open("fleetops.live.1", &wire, NOW),
            Opened::Payload(Bytes::from_static(b"secret line"))
        );
        assert_eq!(
            opener(A).open("fleetops.live.1", &wire, NOW),
            Opened::Refused
        );
    }

    #[test]
    fn a_message_moved_altered_replayed_stale_or_under_another_key_is_refused() {
        let mut s = Sealer::new(&KEY, A);
        let wire = s.seal("fleetops.live.1", b"END", NOW);
        assert_eq!(
            opener(B).open("fleetops.live.2", &wire, NOW),
            Opened::Refused
        );
        let mut altered = wire.to_vec();
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(
            opener(B).open("fleetops.live.1", &altered, NOW),
            Opened::Refused
        );
        let mut o = opener(B);
        assert!(matches!(
            o.open("fleetops.live.1", &wire, NOW),
            Opened::Payload(_)
        ));
        assert_eq!(o.open("fleetops.live.1", &wire, NOW), Opened::Refused);
        assert_eq!(
            opener(B).open("fleetops.live.1", &wire, NOW + WINDOW_MS + 1),
            Opened::Refused
        );
        let other = Sealer::new(&[8; KEY_LEN], A).seal("fleetops.live.1", b"END", NOW);
        assert_eq!(
            opener(B).open("fleetops.live.1", &other, NOW),
            Opened::Refused
        );
        assert_eq!(opener(B).open("fleetops.live.1", b"", NOW), Opened::Refused);
        assert_eq!(
            opener(B).open("fleetops.live.1", &[1; 80], NOW),
            Opened::Refused
        );
    }

    #[test]
    fn later_messages_of_a_sender_open_in_order_and_a_forgotten_sender_cannot_be_replayed() {
        let mut s = Sealer::new(&KEY, A);
        let first = s.seal("x", b"1", NOW);
        let second = s.seal("x", b"2", NOW - 5);
        let mut o = opener(B);
        assert!(matches!(o.open("x", &first, NOW), Opened::Payload(_)));
        assert!(matches!(o.open("x", &second, NOW), Opened::Payload(_)));
        assert_eq!(o.open("x", &first, NOW), Opened::Refused);
        // Many other senders later, A is forgotten; its messages are past the window.
        let later = NOW + 2 * WINDOW_MS;
        for i in 0..=SENDERS as u8 {
            let m = Sealer::new(&KEY, [i.wrapping_add(10); ORIGIN]).seal("x", b"", later);
            assert!(matches!(o.open("x", &m, later), Opened::Payload(_)));
        }
        assert!(!o.senders.contains_key(&A));
        assert_eq!(o.open("x", &second, later), Opened::Refused);
    }
}
