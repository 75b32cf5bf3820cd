//! Does a capsule's file really parse as its declared format? gzip+tar for `.tar.gz`/`.tgz`,
//! tar, zip. Every entry is read through (a truncated or corrupt archive fails on the way),
//! on a blocking thread by the caller. Returns a short note for `validation_notes`.

use std::io::{Read, Seek};

/// The archive formats a capsule may declare.
pub const FORMATS: [&str; 4] = [".tar.gz", ".tgz", ".tar", ".zip"];

/// Reads the whole archive; `Ok(entries)` or `Err(why)`.
pub fn validate<R: Read + Seek>(format: &str, file: R) -> Result<usize, String> {
    match format {
        ".tar.gz" | ".tgz" => read_tar(flate2::read::GzDecoder::new(file)),
        ".tar" => read_tar(file),
        ".zip" => read_zip(file),
        other => Err(format!("unknown file format {other}")),
    }
}

fn read_tar<R: Read>(r: R) -> Result<usize, String> {
    let mut a = tar::Archive::new(r);
    let mut n = 0;
    for e in a
        .entries()
        .map_err(|e| format!("not a valid tar archive: {e}"))?
    {
        let mut e = e.map_err(|e| format!("not a valid tar archive: {e}"))?;
        std::io::copy(&mut e, &mut std::io::sink())
            .map_err(|e| format!("corrupt archive entry: {e}"))?;
        n += 1;
    }
    if n == 0 {
        return Err("the archive holds no entries".into());
    }
    Ok(n)
}

fn read_zip<R: Read + Seek>(r: R) -> Result<usize, String> {
    let mut z = zip::ZipArchive::new(r).map_err(|e| format!("not a valid zip archive: {e}"))?;
    if z.is_empty() {
        return Err("the archive holds no entries".into());
    }
    for i in 0..z.len() {
        let mut f = z
            .by_index(i)
            .map_err(|e| format!("corrupt zip entry: {e}"))?;
        std::io::copy(&mut f, &mut std::io::sink())
            .map_err(|e| format!("corrupt zip entry: {e}"))?;
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

    #[test]
    fn real_archives_pass_and_corrupt_ones_fail() {
        let tar = tar_bytes();
        assert_eq!(validate(".tar", Cursor::new(tar.clone())), Ok(1));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&tar).unwrap();
        let gz = gz.finish().unwrap();
        assert_eq!(validate(".tar.gz", Cursor::new(gz.clone())), Ok(1));
        assert_eq!(validate(".tgz", Cursor::new(gz.clone())), Ok(1));
        let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
        z.start_file("a.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(b"hello").unwrap();
        let zip = z.finish().unwrap().into_inner();
        assert_eq!(validate(".zip", Cursor::new(zip.clone())), Ok(1));

        // Wrong format, truncation, garbage.
        assert!(validate(".zip", Cursor::new(tar.clone())).is_err());
        assert!(validate(".tar.gz", Cursor::new(tar.clone())).is_err());
        assert!(validate(".tar.gz", Cursor::new(gz[..gz.len() / 2].to_vec())).is_err());
        assert!(validate(".zip", Cursor::new(zip[..zip.len() - 10].to_vec())).is_err());
        assert!(validate(".tar", Cursor::new(b"not an archive at all".repeat(40))).is_err());
        assert!(validate(".tar", Cursor::new(Vec::new())).is_err());
        assert!(validate(".rar", Cursor::new(Vec::new())).is_err());
    }
}
