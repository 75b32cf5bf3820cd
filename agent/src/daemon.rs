//! `fleetops-agent daemon`: the robot's standing link to the service. It enrolls when it has
//! no identity yet, then sends a heartbeat with the configured metrics every
//! `[heartbeat] interval_seconds`, and, with an install hook configured, keeps the robot on
//! the package the service assigns it (`update`). A heartbeat that finds the service out of reach is skipped
//! (the next one carries fresh values); a revoked device token (401) stops the agent, since
//! nothing it sends would be taken.

use std::time::Duration;

use crate::client::{self, CallError};
use crate::config::Config;

pub async fn daemon(cfg: &Config) -> Result<i32, String> {
    let http = client::http_client(cfg)?;
    let id = crate::identity::load_or_enroll(cfg, &http).await?;
    if !cfg.update.install_hook.trim().is_empty() {
        tokio::spawn(crate::update::run_forever(
            cfg.clone(),
            http.clone(),
            id.clone(),
        ));
    }
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
