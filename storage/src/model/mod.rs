//! Persisted records. Times are Unix milliseconds (UTC). Field order is part of the postcard
//! format: append new fields only with a format bump in `codec`.
//! One file per family: `accounts`, `devices`, `sessions`, `pipeline`, `webhooks`, `alerts`, and `uploads` (shared by artifacts and
//! packages' blobs).

mod accounts;
mod alerts;
mod devices;
mod pipeline;
mod sessions;
mod uploads;
mod webhooks;

pub use accounts::*;
pub use alerts::*;
pub use devices::*;
pub use pipeline::*;
pub use sessions::*;
pub use uploads::*;
pub use webhooks::*;

#[cfg(test)]
mod tests {
    use super::*;

    /// The galloping search finds, from every admissible start, the entry a bisection of the
    /// whole chunk finds, for every byte of the text and one past it (empty messages too).
    #[test]
    fn entry_at_text_gallops_to_the_bisected_entry() {
        let lens = [0usize, 3, 1, 0, 0, 7, 2, 0, 11, 1, 1, 1, 5, 0];
        let mut ends = Vec::new();
        let mut end = 0u32;
        for l in lens {
            end += l as u32;
            ends.extend_from_slice(&end.to_le_bytes());
        }
        let c = LogChunk {
            levels: vec![0; lens.len()],
            text: "x".repeat(end as usize),
            text_ends: ends,
            ..Default::default()
        };
        let bisect = |at: usize| {
            (0..c.len())
                .find(|&i| c.text_end(i).is_some_and(|e| e > at))
                .unwrap_or(c.len())
        };
        for at in 0..=end as usize + 1 {
            let want = bisect(at);
            for from in 0..=want {
                assert_eq!(c.entry_at_text(at, from), want, "at {at} from {from}");
            }
        }
    }
}
