//! `fleetops-agent daemon`: the robot's standing link to the service. It enrolls when it has
//! no identity yet, then sends a heartbeat with the configured metrics every
//! `[heartbeat] interval_seconds`, and, with an install hook configured, keeps the robot on
//! the package the service assigns it (`update`). With `[logs] files` or `[logs] journal`,
//! it ships those logs too (`follow`), through the same on-disk spool as `run`, into one
//! session of the device tagged `agent` (made at its first line, kept in
//! `state_dir/spool/daemon/session` across restarts; a new one once an operator completes or
//! deletes it); the updates' own lines (stages, hooks' output) go there too. A heartbeat
//! that finds the service out of reach is skipped
//! (the next one carries fresh values); a revoked device token (401) stops the agent, since
//! nothing it sends would be taken.

use std::time::Duration;

use crate::client::{self, CallError};
use crate::config::Config;
use crate::files::write_private;
use crate::identity::Identity;
use crate::run::ShipEnd;
use crate::spool::Spool;

pub async fn daemon(cfg: &Config) -> Result<i32, String> {
    let http = client::http_client(cfg)?;
    // One daemon a state directory, decided before anything of it is touched: two would
    // number the same batches, and one opening the spool clears what the other is writing.
    let dir = cfg.state_dir.join("spool").join("daemon");
    crate::files::private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let held = crate::run::hold(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .ok_or_else(|| {
            format!(
                "another fleetops-agent daemon uses the state_dir {}",
                cfg.state_dir.display()
            )
        })?;
    let id = crate::identity::load_or_enroll(cfg, &http).await?;
    let updating = !cfg.update.install_hook.trim().is_empty();
    let to_session = if !cfg.logs.files.is_empty() || cfg.logs.journal || updating {
        start_log_shipping(cfg, &http, &id, held)?
    } else {
        None
    };
    if updating {
        tokio::spawn(crate::update::run_forever(
            cfg.clone(),
            http.clone(),
            id.clone(),
            crate::update::Log::new(to_session, cfg.logs.max_line_bytes),
        ));
    }
    tokio::spawn(crate::run::recover(cfg.clone(), http.clone(), id.clone()));
    let url = id.project_url(&format!("/devices/{}/heartbeat", id.device_id));
    let every = Duration::from_secs(cfg.heartbeat.interval_seconds);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
        let body = serde_json::json!({"metrics": crate::metrics::read(&cfg.heartbeat).await});
        // Tried again within the interval only: a later heartbeat replaces this one.
        let tries = (cfg.heartbeat.interval_seconds.clamp(1, 8)) as u32;
        match client::call(
            || Ok(http.post(&url).bearer_auth(&id.device_token).json(&body)),
            Some(tries),
        )
        .await
        {
            Ok(_) => {}
            Err(CallError::Status(s, _)) if s == reqwest::StatusCode::UNAUTHORIZED => {
                return Err("the device token was refused (the device was deleted?)".into());
            }
            Err(e) => eprintln!("fleetops-agent: heartbeat not sent: {e}"),
        }
    }
}

/// Starts following the configured logs into the daemon's session: with an install hook, also
/// a sender for the updates' own lines into it.
fn start_log_shipping(
    cfg: &Config,
    http: &reqwest::Client,
    id: &Identity,
    held: std::fs::File,
) -> Result<Option<tokio::sync::mpsc::Sender<crate::lines::Entry>>, String> {
    use std::sync::{Arc, Mutex};
    let dir = cfg.state_dir.join("spool").join("daemon");
    let spool = Arc::new(Mutex::new(
        Spool::open(&dir, cfg.logs.max_buffer_bytes)
            .map_err(|e| format!("{}: {e}", dir.display()))?,
    ));
    let offered = Arc::new(tokio::sync::Notify::new());
    // Each source has its own batcher, so each knows when its own lines are in the spool
    // (what it may then mark read).
    let source = || {
        let (tx, rx) = tokio::sync::mpsc::channel(4096);
        let kept = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(crate::run::batch(
            rx,
            spool.clone(),
            offered.clone(),
            cfg.logs.batch_lines,
            Duration::from_millis(cfg.logs.flush_ms),
            kept.clone(),
        ));
        (tx, kept)
    };
    if !cfg.logs.files.is_empty() {
        let (tx, kept) = source();
        tokio::spawn(crate::follow::files(cfg.clone(), tx, kept));
    }
    if cfg.logs.journal {
        let (tx, kept) = source();
        tokio::spawn(crate::follow::journal(cfg.clone(), tx, kept));
    }
    let updates = (!cfg.update.install_hook.trim().is_empty()).then(|| source().0);
    // The session's id lives with the batches numbered for it.
    let (http, id, session_file, compress) = (
        http.clone(),
        id.clone(),
        dir.join("session"),
        cfg.logs.compress,
    );
    tokio::spawn(async move {
        let _held = held;
        let shipping = Arc::new(std::sync::atomic::AtomicBool::new(true));
        loop {
            let known = std::fs::read_to_string(&session_file)
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            let session = match known {
                Some(s) => s,
                // A session is made once there is a line for it.
                None if spool.lock().unwrap_or_else(|e| e.into_inner()).is_empty() => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), offered.notified()).await;
                    continue;
                }
                None => {
                    match crate::run::create_session(&http, &id, &["agent".to_string()]).await {
                        Ok(s) => {
                            let _ = write_private(&session_file, s.to_string().as_bytes());
                            s
                        }
                        Err(e) => {
                            eprintln!("fleetops-agent: {e}");
                            tokio::time::sleep(Duration::from_secs(5)).await;
                            continue;
                        }
                    }
                }
            };
            match crate::run::ship(
                &http,
                &id,
                session,
                spool.clone(),
                offered.clone(),
                shipping.clone(),
                compress,
            )
            .await
            {
                Err(ShipEnd::SessionGone(_)) => {
                    // Ended or deleted by an operator: the next batches go to a new one.
                    let _ = std::fs::remove_file(&session_file);
                }
                Err(e) => {
                    eprintln!("fleetops-agent: {e}");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Ok(()) => return,
            }
        }
    });
    Ok(updates)
}
