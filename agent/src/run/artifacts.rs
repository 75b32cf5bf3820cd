//! Recordings a run uploads: the files matching `[run] artifacts`, streamed.

use super::*;

/// The files `patterns` match (`*` and `?` in the file name), each once, in order.
pub fn matching(patterns: &[String]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in patterns {
        let path = Path::new(p);
        let (dir, pat) = match (path.parent(), path.file_name()) {
            (Some(d), Some(f)) if !d.as_os_str().is_empty() => (d.to_path_buf(), f),
            (_, Some(f)) => (PathBuf::from("."), f),
            _ => continue,
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter(|e| wildcard(&pat.to_string_lossy(), &e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        found.sort();
        for f in found {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// Whether `name` matches `pat`, where `*` is any run of characters and `?` one.
pub fn wildcard(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    while i < p.len() && p[i] == '*' {
        i += 1;
    }
    i == p.len()
}

/// Uploads `file` as an artifact of `session`, streamed, tried again while the service is out
/// of reach; a refusal (too large, say) is said and skipped.
pub(super) async fn upload(http: &reqwest::Client, id: &Identity, session: u64, file: &Path) {
    let Some(name) = file.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let url = id.project_url(&format!("/sessions/{session}/files/{}", percent(&name)));
    let sent = client::call(
        || {
            let f = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
            let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(f));
            Ok(http
                .put(&url)
                .bearer_auth(&id.device_token)
                .body(reqwest::Body::wrap_stream(stream)))
        },
        Some(20),
    )
    .await;
    if let Err(e) = sent {
        eprintln!("fleetops-agent: {} was not uploaded: {e}", file.display());
    }
}

/// `name` with every byte outside the unreserved set percent-encoded.
pub(super) fn percent(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn wildcards_match_file_names() {
        assert!(wildcard("*.mcap", "run-1.mcap"));
        assert!(wildcard("core*", "core"));
        assert!(wildcard("core.*", "core.1234"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("*.mcap", "run.mcap.tmp"));
        assert!(!wildcard("core.*", "core"));
        assert!(wildcard("*", ""));
    }

    #[test]
    pub(super) fn names_are_percent_encoded_for_the_path() {
        assert_eq!(percent("a b/c.mcap"), "a%20b%2Fc.mcap");
    }
}
