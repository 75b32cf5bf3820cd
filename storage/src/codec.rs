//! One versioned value envelope for every record: a format byte, then postcard.
//!
//! Free-form JSON never goes through postcard as `serde_json::Value` (it cannot be decoded
//! again); records hold it as JSON bytes instead.

use crate::{Result, StorageError};

/// Bumped when a record layout changes incompatibly. 2: capsules and configurations hold
/// their file in one `UploadState`. Records of format 1 are refused rather than misread: no
/// release wrote them, so there is nothing to migrate.
const FORMAT: u8 = 2;

pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = vec![FORMAT];
    let body = postcard::to_stdvec(value).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    out.extend_from_slice(&body);
    Ok(out)
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    decode_borrowed(bytes)
}

/// As [`decode`], borrowing strings and byte arrays from `bytes` instead of copying them.
pub(crate) fn decode_borrowed<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    match bytes.split_first() {
        Some((&FORMAT, body)) => {
            postcard::from_bytes(body).map_err(|e| StorageError::Corrupt(e.to_string()))
        }
        Some((v, _)) => Err(StorageError::Corrupt(format!("unknown record format {v}"))),
        None => Err(StorageError::Corrupt("empty record".into())),
    }
}

/// The leading fields of a record (postcard reads fields in order and leaves the rest), so
/// a scan that needs two numbers does not decode a whole log chunk.
pub(crate) fn decode_head<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    decode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct R {
        a: u64,
        s: String,
        json: Vec<u8>,
    }

    #[test]
    fn round_trip_and_reject_unknown_format() {
        let r = R {
            a: 7,
            s: "x".into(),
            json: br#"{"k":[1,2]}"#.to_vec(),
        };
        let bytes = encode(&r).unwrap();
        assert_eq!(decode::<R>(&bytes).unwrap(), r);
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(decode::<R>(&bad).is_err());
        // Format 1 (before capsules and configurations shared `UploadState`) is refused, not
        // misread.
        bad[0] = 1;
        assert!(decode::<R>(&bad).is_err());
        assert!(decode::<R>(&[]).is_err());
    }

    #[test]
    fn a_chunk_view_reads_what_the_chunk_wrote() {
        use crate::{Columns, LogChunk, LogChunkView};
        let mut c = LogChunk {
            modules: vec!["nav".into(), "arm".into()],
            ..LogChunk::default()
        };
        c.push(30, 2, 1, "Motor hot", br#"{"t":1}"#).unwrap();
        c.push(10, 0, 0, "café ΟΔΟΣ", b"{}").unwrap();
        let bytes = encode(&c).unwrap();
        let v: LogChunkView<'_> = decode_borrowed(&bytes).unwrap();
        assert_eq!(
            (v.cols().min_ts, v.cols().max_ts, v.cols().level_mask),
            (10, 30, 0b101)
        );
        assert_eq!(v.len(), 2);
        for i in 0..3 {
            assert_eq!(v.ts_at(i), c.ts_at(i));
            assert_eq!(v.level_at(i), c.level_at(i));
            assert_eq!(v.module_at(i), c.module_at(i));
            assert_eq!(v.message(i), c.message(i));
            assert_eq!(v.metadata(i), c.metadata(i));
        }
        assert_eq!(v.module_name(1), Some("arm"));
        assert_eq!(v.module_index("arm"), Some(1));
        assert_eq!(v.module_index("drive"), None);
        assert_eq!(v.message(1), Some("café ΟΔΟΣ"));
        let summary = crate::LogSummary::of(&c);
        let bytes = encode(&summary).unwrap();
        let s: crate::LogSummaryView<'_> = decode_borrowed(&bytes).unwrap();
        assert_eq!((s.min_ts, s.max_ts, s.len()), (10, 30, 2));
        for (levels, module) in [
            (0, None),
            (1 << 2, Some("arm")),
            (1, Some("arm")),
            (1, None),
        ] {
            assert_eq!(s.count(levels, module), summary.count(levels, module));
        }
        assert_eq!(s.count(1 << 2, Some("arm")), 1);
    }
}
