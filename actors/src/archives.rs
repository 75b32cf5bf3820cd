//! Does a capsule's file really parse as its declared format? gzip+tar for `.tar.gz`/`.tgz`,
//! tar, zip. Every entry is read through (a truncated or corrupt archive fails on the way),
//! on a blocking thread by the caller. Returns a short note for `validation_notes`.

use std::io::{Read, Seek};

/// The archive formats a capsule may declare.
pub const FORMATS: [&str; 4] = [".tar.gz", ".tgz", ".tar", ".zip"];

/// How much an archive may expand to and hold, so a decompression bomb fails its check with a
/// note instead of pinning a thread for minutes.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Decompressed bytes, in all.
    pub max_bytes: u64,
    pub max_entries: usize,
}

impl Caps {
    /// 16 times the archive's size (at least 1 MiB) and 100,000 entries.
    pub fn for_archive(size: u64) -> Self {
        Self {
            max_bytes: size.saturating_mul(16).max(1 << 20),
            max_entries: 100_000,
        }
    }
}

/// Reads the whole archive within `caps`; `Ok(entries)` or `Err(why)`.
pub fn validate<R: Read + Seek>(format: &str, file: R, caps: Caps) -> Result<usize, String> {
    match format {
        ".tar.gz" | ".tgz" => read_tar(flate2::read::GzDecoder::new(file), caps),
        ".tar" => read_tar(file, caps),
        ".zip" => read_zip(file, caps),
        other => Err(format!("unknown file format {other}")),
    }
}

/// Counts every byte the tar reader takes (headers and the long-name and PAX extensions it
/// reads whole, not only entry data) against the cap.
struct Capped<R> {
    inner: R,
    left: u64,
    over: std::rc::Rc<std::cell::Cell<bool>>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more tells a stream that ends exactly at the cap from a bomb.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.over.set(true);
                    Err(std::io::Error::other("over the decompression cap"))
                }
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

fn bomb(caps: Caps) -> String {
    format!(
        "the archive expands to more than {} bytes (16 times its size); refused as a decompression bomb",
        caps.max_bytes
    )
}

/// Copies one entry to nowhere, counting against the remaining byte cap.
fn drain(r: &mut impl Read, left: &mut u64, caps: Caps) -> Result<(), String> {
    let n = std::io::copy(&mut r.take(*left + 1), &mut std::io::sink())
        .map_err(|e| format!("corrupt archive entry: {e}"))?;
    if n > *left {
        return Err(bomb(caps));
    }
    *left -= n;
    Ok(())
}

fn too_many(caps: Caps) -> String {
    format!("the archive holds more than {} entries", caps.max_entries)
}

fn read_tar<R: Read>(r: R, caps: Caps) -> Result<usize, String> {
    let over = std::rc::Rc::new(std::cell::Cell::new(false));
    let capped = Capped {
        inner: r,
        left: caps.max_bytes,
        over: over.clone(),
    };
    let counted = || over.get();
    let mut a = tar::Archive::new(capped);
    let mut n = 0;
    let entries = a.entries().map_err(|e| {
        if counted() {
            bomb(caps)
        } else {
            format!("not a valid tar archive: {e}")
        }
    })?;
    for e in entries {
        let mut e = e.map_err(|e| {
            if counted() {
                bomb(caps)
            } else {
                format!("not a valid tar archive: {e}")
            }
        })?;
        if let Err(e) = std::io::copy(&mut e, &mut std::io::sink()) {
            return Err(if counted() {
                bomb(caps)
            } else {
                format!("corrupt archive entry: {e}")
            });
        }
        n += 1;
        if n > caps.max_entries {
            return Err(too_many(caps));
        }
    }
    if counted() {
        return Err(bomb(caps));
    }
    if n == 0 {
        return Err("the archive holds no entries".into());
    }
    Ok(n)
}

fn read_zip<R: Read + Seek>(r: R, caps: Caps) -> Result<usize, String> {
    let mut z = zip::ZipArchive::new(r).map_err(|e| format!("not a valid zip archive: {e}"))?;
    if z.is_empty() {
        return Err("the archive holds no entries".into());
    }
    if z.len() > caps.max_entries {
        return Err(too_many(caps));
    }
    let mut left = caps.max_bytes;
    for i in 0..z.len() {
        let mut f = z
            .by_index(i)
            .map_err(|e| format!("corrupt zip entry: {e}"))?;
        drain(&mut f, &mut left, caps)?;
    }
    Ok(z.len())
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;

    fn tar_bytes() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let data = b"#!/bin/sh\necho hi\n";
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append_data(&mut h, "bin/run.sh", &data[..]).unwrap();
        b.into_inner().unwrap()
    }

    const CAPS: Caps = Caps {
        max_bytes: 1 << 20,
        max_entries: 1000,
    };

    #[test]
    fn decompression_bombs_and_entry_floods_fail_with_a_note() {
        // 64 MiB of zeros compress to about 64 KiB: over 16 times the archive.
        let mut b = tar::Builder::new(Vec::new());
        let big = vec![0u8; 64 << 20];
        let mut h = tar::Header::new_gnu();
        h.set_size(big.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, "zeros", &big[..]).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&b.into_inner().unwrap()).unwrap();
        let bomb = gz.finish().unwrap();
        let caps = Caps::for_archive(bomb.len() as u64);
        let why = validate(".tar.gz", Cursor::new(bomb), caps).unwrap_err();
        assert!(why.contains("decompression bomb"), "{why}");
        // The same through a GNU long-name extension, which the tar reader reads whole.
        let mut raw = Vec::new();
        let name = vec![b'a'; 32 << 20];
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(name.len() as u64 + 1);
        h.set_cksum();
        raw.extend_from_slice(h.as_bytes());
        raw.extend_from_slice(&name);
        raw.extend(std::iter::repeat_n(0u8, 512 - (name.len() % 512)));
        let mut f = tar::Header::new_gnu();
        f.set_size(0);
        f.set_cksum();
        raw.extend_from_slice(f.as_bytes());
        raw.extend(std::iter::repeat_n(0u8, 1024));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&raw).unwrap();
        let long = gz.finish().unwrap();
        let caps = Caps::for_archive(long.len() as u64);
        let why = validate(".tar.gz", Cursor::new(long), caps).unwrap_err();
        assert!(why.contains("decompression bomb"), "{why}");
        // Entries over the cap.
        let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for i in 0..1001 {
            z.start_file(format!("f{i}"), zip::write::SimpleFileOptions::default())
                .unwrap();
        }
        let zip = z.finish().unwrap().into_inner();
        let why = validate(".zip", Cursor::new(zip), CAPS).unwrap_err();
        assert!(why.contains("more than 1000 entries"), "{why}");
    }

    #[test]
    fn real_archives_pass_and_corrupt_ones_fail() {
        let tar = tar_bytes();
        assert_eq!(validate(".tar", Cursor::new(tar.clone()), CAPS), Ok(1));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(validate(".tar.gz", Cursor::new(gz.clone()), CAPS), Ok(1));
        assert_eq!(validate(".tgz", Cursor::new(gz.clone()), CAPS), Ok(1));
        let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
        z.start_file("a.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(b"hello").unwrap();
        let zip = z.finish().unwrap().into_inner();
        assert_eq!(validate(".zip", Cursor::new(zip.clone()), CAPS), Ok(1));

        // Wrong format, truncation, garbage.
        assert!(validate(".zip", Cursor::new(tar.clone()), CAPS).is_err());
        assert!(validate(".tar.gz", Cursor::new(tar.clone()), CAPS).is_err());
        assert!(validate(".tar.gz", Cursor::new(gz[..gz.len() / 2].to_vec()), CAPS).is_err());
        assert!(validate(".zip", Cursor::new(zip[..zip.len() - 10].to_vec()), CAPS).is_err());
        assert!(
            validate(
                ".tar",
                Cursor::new(b"not an archive at all".repeat(40)),
                CAPS
            )
            .is_err()
        );
        assert!(validate(".tar", Cursor::new(Vec::new()), CAPS).is_err());
        assert!(validate(".rar", Cursor::new(Vec::new()), CAPS).is_err());
    }
}
