//! Wiring: open storage, start the supervision tree, create the first administrator on an
//! empty data directory, bind, serve; and the ordered stop.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use fleetops_actors::views::Bootstrapped;
use fleetops_actors::{BootstrapReq, Runtime};
use fleetops_storage::Store;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Config;

/// A server that is accepting requests.
pub struct Running {
    pub addr: SocketAddr,
    /// What the first start created (only on an empty data directory).
    pub initial: Option<Bootstrapped>,
    pub runtime: Runtime,
    stop_tx: Option<oneshot::Sender<()>>,
    serving: JoinHandle<()>,
}

/// Opens the data directory; a directory held by another process, or one other accounts can
/// read or write (unless `[storage] allow_shared_data_dir`), is a clear error.
pub async fn open_store(cfg: &Config) -> anyhow::Result<Store> {
    let dir = cfg.data_dir.clone();
    let delay = std::time::Duration::from_micros(cfg.storage.commit_delay_us);
    let allow = cfg.storage.allow_shared_data_dir;
    let mut database = cfg.database.clone();
    // A bus means several nodes: each opens the database shared.
    database.shared |= !cfg.bus.url.is_empty();
    tokio::task::spawn_blocking(move || {
        fleetops_storage::perms::check_private(&dir, allow)?;
        Store::open_on(&dir, delay, &database)
    })
    .await?
    .map_err(anyhow::Error::from)
}

pub async fn start_runtime(cfg: &Config) -> anyhow::Result<Runtime> {
    cfg.validate()?;
    let store = open_store(cfg).await?;
    let blobs = fleetops_storage::BlobStore::from_config(&cfg.storage, &cfg.data_dir)?;
    Runtime::start(store, blobs, cfg.runtime()).await
}

pub async fn start(cfg: Config) -> anyhow::Result<Running> {
    let runtime = start_runtime(&cfg).await?;
    let initial = first_start(&runtime, &cfg).await?;
    let listener = TcpListener::bind(&cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    runtime.set_public_url(&format!("http://{addr}"));
    let app = Arc::new(fleetops_http::App::new(
        runtime.clone(),
        cfg.node_http(),
        cfg.node_tiers(),
    )?);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let serving = tokio::spawn(fleetops_http::serve(listener, app.clone(), async {
        let _ = stop_rx.await;
    }));
    // The housekeeper (a supervised actor) also prunes the edge's rate-limit buckets.
    // (Weak: the app holds the runtime, which holds its pruners.)
    let edge = Arc::downgrade(&app);
    runtime.on_housekeeping(move || {
        if let Some(app) = edge.upgrade() {
            app.limits.prune();
        }
    });
    Ok(Running {
        addr,
        initial,
        runtime,
        stop_tx: Some(stop_tx),
        serving,
    })
}

/// On a data directory without users: organization `default`, project `default`, a
/// superuser, a project secret and an API key. Of several nodes starting at once on one empty
/// database, one makes them (the others find the e-mail or slug taken and print nothing).
async fn first_start(rt: &Runtime, cfg: &Config) -> anyhow::Result<Option<Bootstrapped>> {
    if rt.has_users()? {
        return Ok(None);
    }
    let (password, generated) = if cfg.admin.password.is_empty() {
        (fleetops_actors::secrets::random_token(18)?, true)
    } else {
        (cfg.admin.password.clone(), false)
    };
    let made = rt
        .directory
        .bootstrap(BootstrapReq {
            email: cfg.admin.email.trim().to_string(),
            password: password.clone(),
            org: "default".into(),
            project: "default".into(),
            tier: cfg.admin.tier.clone(),
        })
        .await;
    let mut b = match made {
        // Another node on the same database made them first (several nodes starting at once).
        Err(fleetops_actors::Error::Conflict(_)) if rt.has_users()? => return Ok(None),
        other => other.context("creating the initial administrator")?,
    };
    if generated {
        b.generated_password = Some(password);
    }
    Ok(Some(b))
}

impl Running {
    /// Stop accepting, drain in-flight requests, stop the actors (children first), flush.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.serving).await;
        self.runtime.shutdown().await;
    }
}
