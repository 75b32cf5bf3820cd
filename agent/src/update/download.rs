//! Downloading a capsule: resumed from the bytes already on disk (a range request), then its
//! digest checked.

use super::*;

/// Downloads `url` into `part`, going on from the bytes already there, at most `size`
/// bytes in all (what the checksum then judges).
pub(super) async fn download(
    http: &reqwest::Client,
    url: &str,
    part: &Path,
    size: u64,
) -> Result<(), String> {
    for attempt in 0u32.. {
        let have = std::fs::metadata(part).map_or(0, |m| m.len());
        if have >= size {
            return Ok(());
        }
        let mut req = http.get(url);
        if have > 0 {
            req = req.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) if e.is_builder() => return Err(format!("the capsule's link: {e}")),
            Err(_) => {
                tokio::time::sleep(client::backoff(attempt)).await;
                continue;
            }
        };
        let status = resp.status();
        // A part that does not start where this file ends is not the rest of it.
        let starts_here = resp
            .headers()
            .get(reqwest::header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.parse::<u64>().ok())
            == Some(have);
        let append = match status {
            reqwest::StatusCode::PARTIAL_CONTENT if starts_here => true,
            reqwest::StatusCode::PARTIAL_CONTENT => {
                let _ = std::fs::remove_file(part);
                continue;
            }
            reqwest::StatusCode::OK => false,
            // Nothing past what is here (or the file shrank): start again.
            reqwest::StatusCode::RANGE_NOT_SATISFIABLE => {
                let _ = std::fs::remove_file(part);
                continue;
            }
            s if s.is_server_error() || s == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                tokio::time::sleep(client::backoff(attempt)).await;
                continue;
            }
            s => return Err(format!("downloading the capsule: the link answered {s}")),
        };
        let mut f = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(part)
            .await
            .map_err(|e| format!("{}: {e}", part.display()))?;
        let mut resp = resp;
        let mut broken = false;
        let mut written = if append { have } else { 0 };
        loop {
            match resp.chunk().await {
                Ok(Some(bytes)) => {
                    // Never past the package's size, whatever the link sends.
                    let room = size.saturating_sub(written);
                    let take = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
                    f.write_all(&bytes[..take])
                        .await
                        .map_err(|e| format!("{}: {e}", part.display()))?;
                    written += take as u64;
                    if written >= size {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        f.sync_all()
            .await
            .map_err(|e| format!("{}: {e}", part.display()))?;
        if !broken {
            return Ok(());
        }
        tokio::time::sleep(client::backoff(attempt)).await;
    }
    Ok(())
}

/// A file's SHA-256 (hex) and size.
pub(super) fn digest(path: &Path) -> Result<(String, u64), String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        let k = f
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex::encode(h.finalize()), n))
}
