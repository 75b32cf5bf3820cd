//! Shipping the spool: batches numbered and gzip-compressed, the session created when the
//! service is first reachable, each batch sent until it is stored.

use super::*;

/// A batch is cut once its body reaches this many bytes.
pub(super) const MAX_BATCH_BODY: usize = 4 << 20;

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

pub(super) fn keep(
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
pub(super) fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing to memory does not fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}
