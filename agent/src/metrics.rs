//! The metrics a heartbeat carries: built-ins read from `/proc` and the file system, numbers
//! read from files, and numbers printed by commands. A source that cannot be read is left
//! out of that heartbeat (and said once on stderr), never a reason to skip the heartbeat.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::Heartbeat;

/// The first number in `text`.
pub fn first_number(text: &str) -> Option<f64> {
    text.split(|c: char| c.is_whitespace() || c == ',' || c == ';')
        .find_map(|t| t.parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

fn load() -> Option<f64> {
    first_number(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn uptime() -> Option<f64> {
    first_number(&std::fs::read_to_string("/proc/uptime").ok()?)
}

/// Used memory in percent: (MemTotal − MemAvailable) / MemTotal.
fn memory() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(first_number)
    };
    let (total, avail) = (field("MemTotal:")?, field("MemAvailable:")?);
    (total > 0.0).then(|| 100.0 * (total - avail) / total)
}

/// Used space of the file system holding `path`, in percent.
fn disk(path: &std::path::Path) -> Option<f64> {
    let s = rustix::fs::statvfs(path).ok()?;
    let total = s.f_blocks as f64;
    (total > 0.0).then(|| 100.0 * (total - s.f_bfree as f64) / total)
}

/// What one command prints, run with `sh -c`, within 10 s.
async fn command(cmd: &str) -> Option<f64> {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .ok()?
    .ok()?;
    first_number(&String::from_utf8_lossy(&out.stdout))
}

/// Every configured metric that could be read now.
pub async fn read(cfg: &Heartbeat) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for b in &cfg.builtins {
        let v = match b.as_str() {
            "load" => load(),
            "memory" => memory(),
            "disk" => disk(&cfg.disk_path),
            "uptime" => uptime(),
            _ => None,
        };
        if let Some(v) = v {
            m.insert(b.clone(), v);
        }
    }
    for (name, path) in &cfg.files {
        if let Some(v) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| first_number(&t))
        {
            m.insert(name.clone(), v);
        }
    }
    for (name, cmd) in &cfg.commands {
        if let Some(v) = command(cmd).await {
            m.insert(name.clone(), v);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_number_of_a_source_is_its_value() {
        assert_eq!(first_number("42000\n"), Some(42000.0));
        assert_eq!(first_number("0.52 0.58 0.59 1/467 1234"), Some(0.52));
        assert_eq!(first_number("temp: 41.5 C"), Some(41.5));
        assert_eq!(first_number("nan inf"), None);
        assert_eq!(first_number(""), None);
    }

    #[tokio::test]
    async fn built_ins_files_and_commands_are_read() {
        let dir = std::env::temp_dir().join(format!("fa-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("battery"), "87\n").unwrap();
        let cfg = Heartbeat {
            files: [("battery".to_string(), dir.join("battery"))].into(),
            commands: [("answer".to_string(), "echo 42".to_string())].into(),
            ..Heartbeat::default()
        };
        let m = read(&cfg).await;
        assert_eq!(m.get("battery"), Some(&87.0));
        assert_eq!(m.get("answer"), Some(&42.0));
        for b in ["load", "memory", "disk", "uptime"] {
            assert!(m.contains_key(b), "{b} missing: {m:?}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
