//! `fleetops-agent run [--tag T]... -- CMD ARGS`: a session around one run of a command.
//!
//! The command's stdout and stderr are passed through to the agent's own, and each line is
//! also a log entry of the session (module: the program's name; level read from the line,
//! else `info` for stdout and `error` for stderr). Lines are batched (`[logs] batch_lines`, or
//! `flush_ms` after a batch's first line), kept in the spool on disk, and shipped in order,
//! each batch numbered, so every line is stored once even when the service is out of reach
//! for a while or answers are lost. The session is created when the service is first
//! reachable; the command never waits for the service.
//!
//! When the command ends, the agent ships what is left, uploads the files matching
//! `[run] artifacts` as the session's artifacts, completes the session as `completed` (exit
//! status 0) or `failed`, and exits with the command's status (128 + the signal when a
//! signal ended it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Notify, mpsc};

use crate::client::{self, CallError};
use crate::config::Config;
use crate::files::hold_file;
use crate::identity::Identity;
use crate::lines::{self, Entry};
use crate::spool::Spool;

/// Runs `cmd` inside a session; the exit status.
pub async fn run(cfg: &Config, tags: Vec<String>, cmd: Vec<String>) -> Result<i32, String> {
    let http = client::http_client(cfg)?;
    let id = crate::identity::load_or_enroll(cfg, &http).await?;
    let (program, args) = cmd.split_first().ok_or("run: no command given after --")?;
    let module = Path::new(program)
        .file_name()
        .map_or_else(|| program.clone(), |n| n.to_string_lossy().into_owned());
    // The spool is made under a hidden name, locked, then given its name: an agent
    // recovering what dead runs left never sees it unlocked.
    let name = format!("run-{}-{}", lines::now_ms(), std::process::id());
    let spools = cfg.state_dir.join("spool");
    let (hidden, spool_dir) = (spools.join(format!(".{name}")), spools.join(&name));
    crate::files::private_dir(&hidden).map_err(|e| format!("{}: {e}", hidden.display()))?;
    // Held while this run lives: another agent never takes its spool for a dead run's.
    let _held = hold(&hidden)
        .map_err(|e| format!("{}: {e}", hidden.display()))?
        .ok_or("run: a new spool is held by another process")?;
    std::fs::rename(&hidden, &spool_dir).map_err(|e| format!("{}: {e}", spool_dir.display()))?;
    let spool = Arc::new(Mutex::new(
        Spool::open(&spool_dir, cfg.logs.max_buffer_bytes)
            .map_err(|e| format!("{}: {e}", spool_dir.display()))?,
    ));
    // What earlier runs left behind (the agent was killed), shipped meanwhile.
    let recovering = tokio::spawn(recover(cfg.clone(), http.clone(), id.clone()));
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    // Ctrl-C and SIGTERM are the command's to act on, so the agent lives on to ship its last
    // lines and end its session: Ctrl-C reaches the command from the terminal already (one
    // process group); SIGTERM is passed on to it.
    if let Some(pid) = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(p as i32))
    {
        tokio::spawn(pass_signals(pid));
    }
    let (tx, rx) = mpsc::channel::<Entry>(4096);
    let max_line = cfg.logs.max_line_bytes;
    let readers = [
        child.stdout.take().map(|out| {
            tokio::spawn(read_lines(
                out,
                Echo::Stdout,
                module.clone(),
                "info",
                max_line,
                tx.clone(),
            ))
        }),
        child.stderr.take().map(|err| {
            tokio::spawn(read_lines(
                err,
                Echo::Stderr,
                module.clone(),
                "error",
                max_line,
                tx.clone(),
            ))
        }),
    ];
    drop(tx);
    let offered = Arc::new(Notify::new());
    let batcher = tokio::spawn(batch(
        rx,
        spool.clone(),
        offered.clone(),
        cfg.logs.batch_lines,
        Duration::from_millis(cfg.logs.flush_ms),
        Arc::default(),
    ));
    let shipping = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let shipper = {
        let (http, id, spool, offered, shipping) = (
            http.clone(),
            id.clone(),
            spool.clone(),
            offered.clone(),
            shipping.clone(),
        );
        let compress = cfg.logs.compress;
        let session_file = spool_dir.join(SESSION);
        tokio::spawn(async move {
            let session = create_session(&http, &id, &tags).await?;
            crate::files::write_private(&session_file, session.to_string().as_bytes())
                .map_err(|e| format!("{}: {e}", session_file.display()))?;
            ship(&http, &id, session, spool, offered, shipping, compress)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<u64, String>(session)
        })
    };
    let status = child
        .wait()
        .await
        .map_err(|e| format!("waiting for {program}: {e}"))?;
    // What the command wrote is read to its end; a process it left behind that still holds
    // its output is not waited for past a moment.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    for mut r in readers.into_iter().flatten() {
        if tokio::time::timeout_at(until, &mut r).await.is_err() {
            r.abort();
        }
    }
    let _ = batcher.await;
    shipping.store(false, std::sync::atomic::Ordering::SeqCst);
    offered.notify_one();
    let code = exit_code(&status);
    // Whatever became of the session, the agent answers with the command's status.
    let session = match shipper.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            eprintln!("fleetops-agent: {e}");
            let _ = recovering.await;
            return Ok(code);
        }
        Err(e) => {
            eprintln!("fleetops-agent: log shipping stopped: {e}");
            let _ = recovering.await;
            return Ok(code);
        }
    };
    for file in matching(&cfg.run.artifacts) {
        upload(&http, &id, session, &file).await;
    }
    let done = if code == 0 { "completed" } else { "failed" };
    let url = id.project_url(&format!("/sessions/{session}/complete"));
    let body = serde_json::json!({"status": done});
    if let Err(e) = client::call(
        || Ok(http.post(&url).bearer_auth(&id.device_token).json(&body)),
        None,
    )
    .await
    {
        eprintln!("fleetops-agent: could not complete session {session}: {e}");
    }
    let _ = std::fs::remove_dir_all(&spool_dir);
    let _ = recovering.await;
    Ok(code)
}

/// The file of a run's spool naming its session, once created.
const SESSION: &str = "session";
/// The file a run's spool is locked with while the run lives.
const LOCK: &str = "lock";

/// Takes the exclusive lock of spool `dir` without waiting: `None` while another process
/// holds it. Released when the returned file is dropped or the process ends, however.
pub fn hold(dir: &Path) -> std::io::Result<Option<std::fs::File>> {
    hold_file(&dir.join(LOCK))
}

/// Ships what runs killed before they finished left in their spools, each to its session
/// (one tagged `interrupted` when it never got one), and completes those sessions as
/// `failed`. A spool another live run holds is left alone.
pub async fn recover(cfg: Config, http: reqwest::Client, id: Identity) {
    let Ok(entries) = std::fs::read_dir(cfg.state_dir.join("spool")) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.path();
        if !e.file_name().to_string_lossy().starts_with("run-") || !dir.is_dir() {
            continue;
        }
        let Ok(Some(_held)) = hold(&dir) else {
            continue;
        };
        let Ok(spool) = Spool::open(&dir, cfg.logs.max_buffer_bytes) else {
            continue;
        };
        let known = std::fs::read_to_string(dir.join(SESSION))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok());
        if known.is_none() && spool.is_empty() {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        let session = match known {
            Some(s) => s,
            None => match create_session(&http, &id, &["interrupted".to_string()]).await {
                Ok(s) => s,
                Err(_) => continue,
            },
        };
        let shipped = ship(
            &http,
            &id,
            session,
            Arc::new(Mutex::new(spool)),
            Arc::new(Notify::new()),
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
            cfg.logs.compress,
        )
        .await;
        match shipped {
            // Shipped, or its session was ended elsewhere (nothing takes its lines now).
            Ok(()) | Err(ShipEnd::SessionGone(_)) => {}
            Err(e) => {
                eprintln!("fleetops-agent: an interrupted run's logs: {e}");
                continue;
            }
        }
        let url = id.project_url(&format!("/sessions/{session}/complete"));
        let body = serde_json::json!({"status": "failed"});
        // Already ended (409) or gone (404): nothing more to do either way.
        let _ = client::call(
            || Ok(http.post(&url).bearer_auth(&id.device_token).json(&body)),
            Some(10),
        )
        .await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// For as long as the run lasts: SIGINT does not end the agent, and SIGTERM is passed on to
/// the command `pid`.
async fn pass_signals(pid: rustix::process::Pid) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    loop {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
    }
}

fn exit_code(s: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

/// Where the command's output is passed through to.
#[derive(Clone, Copy)]
enum Echo {
    Stdout,
    Stderr,
}

impl Echo {
    /// Writes `bytes` at once (one write for what one read brought, not one a line).
    fn write(self, bytes: &[u8]) {
        use std::io::Write;
        let _ = match self {
            Echo::Stdout => {
                let mut o = std::io::stdout().lock();
                o.write_all(bytes).and_then(|()| o.flush())
            }
            Echo::Stderr => std::io::stderr().lock().write_all(bytes),
        };
    }
}

/// Copies `from` to `echo` and sends each line on as an entry; a line longer than
/// `max_line` is sent cut, and a last line without its newline is sent at the end.
async fn read_lines(
    mut from: impl AsyncRead + Unpin,
    echo: Echo,
    module: String,
    otherwise: &'static str,
    max_line: usize,
    tx: mpsc::Sender<Entry>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let read = &buf[..n];
        echo.write(read);
        pending.extend_from_slice(read);
        let at = lines::rfc3339(lines::now_ms());
        let mut start = 0;
        while let Some(i) = pending[start..].iter().position(|b| *b == b'\n') {
            let line = &pending[start..start + i];
            start += i + 1;
            if tx
                .send(lines::entry_at(
                    line,
                    &module,
                    otherwise,
                    max_line,
                    at.clone(),
                ))
                .await
                .is_err()
            {
                return;
            }
        }
        pending.drain(..start);
        if pending.len() > max_line {
            let line = std::mem::take(&mut pending);
            if tx
                .send(lines::entry(&line, &module, otherwise, max_line))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    if !pending.is_empty() {
        let _ = tx
            .send(lines::entry(&pending, &module, otherwise, max_line))
            .await;
    }
}

/// A batch is cut once its body reaches this many bytes.
const MAX_BATCH_BODY: usize = 4 << 20;

/// Cuts entries into batches in the spool: at `max_lines`, or `flush` after a batch's first
/// entry, and when the readers are done.
/// `kept` counts the entries put in the spool.
pub async fn batch(
    mut rx: mpsc::Receiver<Entry>,
    spool: Arc<Mutex<Spool>>,
    offered: Arc<Notify>,
    max_lines: usize,
    flush: Duration,
    kept: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut body = Vec::new();
    let mut n = 0u64;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let next = match deadline {
            Some(d) => tokio::select! {
                e = rx.recv() => e,
                () = tokio::time::sleep_until(d) => {
                    keep(&spool, &offered, &mut body, &mut n, &kept);
                    deadline = None;
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(e) = next else {
            keep(&spool, &offered, &mut body, &mut n, &kept);
            return;
        };
        if serde_json::to_writer(&mut body, &e).is_ok() {
            body.push(b'\n');
            n += 1;
        }
        deadline.get_or_insert_with(|| tokio::time::Instant::now() + flush);
        // Well inside the service's 8 MiB a batch, whatever the lines' length.
        if n as usize >= max_lines || body.len() >= MAX_BATCH_BODY {
            keep(&spool, &offered, &mut body, &mut n, &kept);
            deadline = None;
        }
    }
}

fn keep(
    spool: &Mutex<Spool>,
    offered: &Notify,
    body: &mut Vec<u8>,
    n: &mut u64,
    kept: &std::sync::atomic::AtomicU64,
) {
    if *n == 0 {
        return;
    }
    let mut s = spool.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = s.push(body, *n) {
        eprintln!("fleetops-agent: could not keep a log batch on disk ({e}): {n} lines lost");
    }
    kept.fetch_add(*n, std::sync::atomic::Ordering::SeqCst);
    drop(s);
    body.clear();
    *n = 0;
    offered.notify_one();
}

/// Creates a session of this device with `tags`, once the service is reachable: its id.
pub async fn create_session(
    http: &reqwest::Client,
    id: &Identity,
    tags: &[String],
) -> Result<u64, String> {
    let url = id.project_url("/sessions");
    let body = serde_json::json!({"device_id": id.device_id, "tags": tags});
    let r = client::call(
        || Ok(http.post(&url).bearer_auth(&id.device_token).json(&body)),
        None,
    )
    .await
    .map_err(|e| format!("creating the session: {e}"))?;
    r.json::<serde_json::Value>()
        .await
        .ok()
        .and_then(|v| v["id"].as_u64())
        .ok_or_else(|| "creating the session: no id in the answer".to_string())
}

/// Why shipping stopped before the spool was empty.
#[derive(Debug)]
pub enum ShipEnd {
    /// The session was completed or deleted elsewhere (409, 404); the batches stay.
    SessionGone(String),
    /// The spool could not be read.
    Spool(String),
    /// The device's token was refused (401, 403); the batches stay.
    Refused(String),
}

impl std::fmt::Display for ShipEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShipEnd::SessionGone(why) => {
                write!(f, "the session was ended or deleted elsewhere: {why}")
            }
            ShipEnd::Spool(why) => write!(f, "reading the log spool: {why}"),
            ShipEnd::Refused(why) => write!(f, "the device's token was refused: {why}"),
        }
    }
}

/// Ships the spool's batches to `session` in order, until `shipping` is off and the spool is
/// empty.
pub async fn ship(
    http: &reqwest::Client,
    id: &Identity,
    session: u64,
    spool: Arc<Mutex<Spool>>,
    offered: Arc<Notify>,
    shipping: Arc<std::sync::atomic::AtomicBool>,
    compress: bool,
) -> Result<(), ShipEnd> {
    let logs = id.project_url(&format!("/sessions/{session}/logs"));
    loop {
        let next = spool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .oldest()
            .map_err(|e| ShipEnd::Spool(e.to_string()))?;
        let Some((n, body)) = next else {
            if !shipping.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), offered.notified()).await;
            continue;
        };
        let (body, coding) = if compress {
            (gzip(&body), "gzip")
        } else {
            (body, "identity")
        };
        let sent = client::call(
            || {
                Ok(http
                    .post(&logs)
                    .bearer_auth(&id.device_token)
                    .header("Content-Type", "application/x-ndjson")
                    .header("Content-Encoding", coding)
                    .header("X-Batch-Sequence", n)
                    .body(body.clone()))
            },
            None,
        )
        .await;
        match sent {
            Ok(_) => {}
            Err(CallError::Status(s, why))
                if s == StatusCode::CONFLICT || s == StatusCode::NOT_FOUND =>
            {
                return Err(ShipEnd::SessionGone(why));
            }
            // The device's token is refused: nothing will be taken; the batches stay.
            Err(CallError::Status(s, why))
                if s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN =>
            {
                return Err(ShipEnd::Refused(format!("{s}: {why}")));
            }
            Err(e) => eprintln!("fleetops-agent: a log batch was refused and dropped: {e}"),
        }
        let mut s = spool.lock().unwrap_or_else(|e| e.into_inner());
        s.done(n);
        if s.dropped > 0 {
            let e = Entry {
                timestamp: lines::rfc3339(lines::now_ms()),
                level: "warn",
                module: "fleetops-agent".into(),
                message: format!(
                    "{} lines were dropped while the service was out of reach (the log buffer was full)",
                    s.dropped
                ),
            };
            let mut line = serde_json::to_vec(&e).unwrap_or_default();
            line.push(b'\n');
            s.dropped = 0;
            let _ = s.push(&line, 1);
        }
    }
}

/// `body` gzip-compressed (fast level: a robot's CPU is for the robot).
fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing to memory does not fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

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
async fn upload(http: &reqwest::Client, id: &Identity, session: u64, file: &Path) {
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
fn percent(name: &str) -> String {
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
    fn wildcards_match_file_names() {
        assert!(wildcard("*.mcap", "run-1.mcap"));
        assert!(wildcard("core*", "core"));
        assert!(wildcard("core.*", "core.1234"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("*.mcap", "run.mcap.tmp"));
        assert!(!wildcard("core.*", "core"));
        assert!(wildcard("*", ""));
    }

    #[test]
    fn names_are_percent_encoded_for_the_path() {
        assert_eq!(percent("a b/c.mcap"), "a%20b%2Fc.mcap");
    }
}
