//! A chunk's text filter: a Bloom filter of the byte trigrams of its lower-cased messages,
//! stored beside the chunk so a search reads a few hundred bytes per chunk, not the chunk,
//! to learn that the chunk cannot hold its text.
//!
//! Search is a case-insensitive substring of one message (the needle lower-cased as the
//! query does it, `str::to_lowercase`), so every trigram of a matching needle is a trigram of
//! the lower-cased message: the filter never rules out a chunk that holds a match. Needles of
//! fewer than three bytes are not filtered.
//!
//! Value layout: one format byte ([`FORMAT`]), then the bit array, a power of two of at least
//! [`MIN_BITS`] bits. The filter is built at [`MAX_BITS`] and folded in half (OR of the
//! halves, which is the same filter built at half the size, since positions are taken modulo
//! a power of two) while the result stays at most [`MAX_FILL_PERCENT`] full. A chunk whose
//! filter would be fuller than [`SATURATED_PERCENT`] even at the largest size gets none:
//! it would rule nothing out, and an absent filter means "may hold anything".

use crate::{Columns, LogChunk};

const FORMAT: u8 = 1;
const MAX_BITS: usize = 1 << 17;
const MIN_BITS: usize = 1 << 9;
const HASHES: u32 = 3;
/// With three hashes a 40 % full filter lets about 6 % of absent trigrams through; a needle
/// of `n` trigrams passes a chunk lacking all of them about 0.06^n of the time. (At 30 % the
/// bench's 1,000-line chunks kept 2 KiB filters, 2 bytes a line; at 40 %, 1 KiB.)
const MAX_FILL_PERCENT: usize = 40;
const SATURATED_PERCENT: usize = 60;

/// A trigram's bit positions (before reducing modulo the filter's size): double hashing from
/// one 64-bit mix, so trigrams differing in one byte land far apart.
fn positions(t: u32) -> impl Iterator<Item = usize> {
    // splitmix64's finalizer.
    let mut z = u64::from(t).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let (h1, h2) = (z as u32, ((z >> 32) as u32) | 1);
    (0..HASHES).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) as usize)
}

fn trigram(w: &[u8]) -> Option<u32> {
    match *w {
        [a, b, c] => Some(u32::from_le_bytes([a, b, c, 0])),
        _ => None,
    }
}

/// The filter for `chunk`'s messages, or `None` when one would rule nothing out.
pub(crate) fn build(chunk: &LogChunk) -> Option<Vec<u8>> {
    let mut words = vec![0u64; MAX_BITS / 64];
    let mut add = |bytes: &[u8]| {
        for t in bytes.windows(3).filter_map(trigram) {
            for p in positions(t) {
                let p = p & (MAX_BITS - 1);
                if let Some(w) = words.get_mut(p / 64) {
                    *w |= 1 << (p % 64);
                }
            }
        }
    };
    if chunk.text.is_ascii() {
        // ASCII lower-cases byte by byte, the same as each message's `to_lowercase`; the
        // trigrams spanning two messages are extra, which costs precision, not correctness.
        add(chunk.text.to_ascii_lowercase().as_bytes());
    } else {
        // Lower-casing is context-sensitive outside ASCII (a final sigma), so message by
        // message, exactly as the search compares.
        for i in 0..chunk.len() {
            if let Some(m) = chunk.message(i) {
                add(m.to_lowercase().as_bytes());
            }
        }
    }
    let ones = |w: &[u64]| w.iter().map(|x| x.count_ones() as usize).sum::<usize>();
    if ones(&words) * 100 > MAX_BITS * SATURATED_PERCENT {
        return None;
    }
    while words.len() * 64 > MIN_BITS {
        let half = words.len() / 2;
        let folded: Vec<u64> = words
            .iter()
            .take(half)
            .zip(words.iter().skip(half))
            .map(|(a, b)| a | b)
            .collect();
        if ones(&folded) * 100 > folded.len() * 64 * MAX_FILL_PERCENT {
            break;
        }
        words = folded;
    }
    let mut out = Vec::with_capacity(1 + words.len() * 8);
    out.push(FORMAT);
    for w in &words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    Some(out)
}

/// Whether the chunk whose filter is `value` may hold `needle` (lower-case) in a message.
/// Anything this format does not recognise answers "may".
pub(crate) fn may_contain(value: &[u8], needle: &[u8]) -> bool {
    let Some((&FORMAT, bits)) = value.split_first() else {
        return true;
    };
    let nbits = bits.len() * 8;
    if needle.len() < 3 || !nbits.is_power_of_two() || nbits < MIN_BITS {
        return true;
    }
    needle.windows(3).filter_map(trigram).all(|t| {
        positions(t).all(|p| {
            let p = p & (nbits - 1);
            bits.get(p / 8).is_some_and(|b| b & (1 << (p % 8)) != 0)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(messages: &[&str]) -> LogChunk {
        let mut c = LogChunk::default();
        for (i, m) in messages.iter().enumerate() {
            c.push(i as i64, 1, 0, m, b"{}").unwrap();
        }
        c.modules = vec!["m".into()];
        c
    }

    #[test]
    fn never_rules_out_a_chunk_that_holds_the_text() {
        let c = chunk(&[
            "Motor 17 STALLED",
            "gripper jam at step 500017 ",
            "naïve CAFÉ ΟΔΟΣ",
        ]);
        let f = build(&c).unwrap();
        // Every substring of three bytes or more of every lower-cased message passes.
        for i in 0..c.len() {
            let m = c.message(i).unwrap().to_lowercase();
            let b = m.as_bytes();
            for s in 0..b.len() {
                for e in s + 3..=b.len() {
                    assert!(may_contain(&f, &b[s..e]), "{:?}", &b[s..e]);
                }
            }
        }
        assert!(may_contain(&f, "step 500017 ".as_bytes()));
        assert!(may_contain(&f, "café".as_bytes()));
        // Short needles are never filtered.
        assert!(may_contain(&f, b"zq"));
    }

    #[test]
    fn rules_out_what_is_absent_and_stays_small() {
        let lines: Vec<String> = (0..1000)
            .map(|k| format!("step {} completed in 12 ms", 500_000 + k))
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let f = build(&chunk(&refs)).unwrap();
        assert!(f.len() <= 1 + 1024, "{} bytes", f.len());
        assert!(may_contain(&f, b"step 500017 "));
        assert!(!may_contain(&f, b"stalled"));
        assert!(!may_contain(&f, b"step 700017 "));
        let absent = (0..1000)
            .filter(|k| may_contain(&f, format!("motor {k} hot").as_bytes()))
            .count();
        assert!(absent < 20, "{absent} false positives in 1000");
    }

    #[test]
    fn saturated_and_unknown_filters_rule_nothing_out() {
        // High-entropy text (random printable ASCII): no filter is kept.
        let mut x: u64 = 1;
        let lines: Vec<String> = (0..20_000)
            .map(|_| {
                (0..32)
                    .map(|_| {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        char::from(33 + ((x >> 33) % 94) as u8)
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        assert!(build(&chunk(&refs)).is_none());
        assert!(may_contain(&[], b"abc"));
        assert!(may_contain(&[2, 0, 0], b"abc"));
        assert!(may_contain(&[FORMAT, 0, 0, 0], b"abc"));
    }
}
