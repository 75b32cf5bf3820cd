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

mod artifacts;
mod shipping;

pub use artifacts::*;
pub use shipping::*;
