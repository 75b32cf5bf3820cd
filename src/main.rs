//! `fleetops`: the server (`serve`) and its admin commands (`admin bootstrap`, `admin backup`,
//! `admin restore`, `admin org`). This file holds the command line and what each command prints;
//! configuration and wiring are the library half (`fleetops::config`, `fleetops::startup`).
//!
//! What a change must keep:
//! - Standard output carries only what the operator must read: the first start's credentials
//!   and a generated webhook secret (each shown once), and each admin command's JSON. The log
//!   goes to standard error and never holds a credential.
//! - Exit status 0 on success; 2 when the command line or the configuration does not parse;
//!   1 for any other failure, with the reason on standard error.
//! - `admin backup` copies the data directory itself when no server holds it, and otherwise
//!   asks the running server (`POST /api/v1/admin/backup` with a superuser's token), which
//!   writes the copy on its own host; `admin restore` fills only an absent or empty data
//!   directory. `admin org` works the same way: here when no server holds the directory,
//!   else through the running server's API.
//! - SIGTERM and Ctrl-C stop the server in order (`startup::Running::stop`), exiting 0.
//!
//! Tested through the built binary (`tests/api/cli/`): first-start credentials, bootstrap,
//! a locked data directory, kill -9 and restart, SIGTERM, backup and restore.

mod admin_org;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fleetops::config::Config;
use fleetops::startup;
use fleetops_actors::BootstrapReq;

#[derive(Parser)]
#[command(name = "fleetops", version, about = "Operate fleets of robots")]
struct Cli {
    /// Configuration file (default: ./config.toml when present).
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server.
    Serve,
    /// Offline administration against the data directory.
    Admin {
        #[command(subcommand)]
        cmd: AdminCmd,
    },
}

#[derive(Subcommand)]
enum AdminCmd {
    /// Create a superuser, an organization, a project, its secret and an API key; prints
    /// them as one JSON object.
    Bootstrap {
        #[arg(long)]
        email: String,
        #[arg(long)]
        password: String,
        #[arg(long)]
        org: String,
        #[arg(long)]
        project: String,
        #[arg(long, default_value = "free", value_parser = ["free", "personal", "team", "enterprise"])]
        tier: String,
    },
    /// A consistent copy of the data directory in DIR (absent or empty; prints a JSON report).
    /// With the server stopped the copy is made here; while it serves (the directory is
    /// locked), the running server makes it, on its own host: give its URL and a superuser's
    /// API key or token. Writes wait while the copy is made.
    Backup {
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// The running server (default: the configured listening address).
        #[arg(long)]
        url: Option<String>,
        /// A superuser's API key or token, for a server that is running.
        #[arg(long, env = "FLEETOPS_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Copies a backup into the data directory, which must be absent or empty (the server
    /// stopped).
    Restore {
        #[arg(long, value_name = "DIR")]
        from: PathBuf,
    },
    /// Copies the data directory's embedded store into an empty PostgreSQL database (the
    /// server stopped); then set `[database] url` (or FLEETOPS_DATABASE_URL) to it and start.
    Migrate {
        /// The database: postgres://user:password@host:port/dbname.
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Organizations: list, show, rename, set-tier, delete. With the server stopped the data
    /// directory is changed here; while it serves, the running server makes the change: give
    /// its URL and a superuser's API key or token.
    Org {
        #[command(subcommand)]
        cmd: admin_org::OrgCmd,
        /// The running server (default: the configured listening address).
        #[arg(long, global = true)]
        url: Option<String>,
        /// A superuser's API key or token, for a server that is running.
        #[arg(long, global = true, env = "FLEETOPS_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let cfg = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleetops: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    init_tracing(&cfg.log, cfg.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleetops: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        match cli.cmd {
            Cmd::Serve => serve(cfg).await,
            Cmd::Admin {
                cmd:
                    AdminCmd::Bootstrap {
                        email,
                        password,
                        org,
                        project,
                        tier,
                    },
            } => {
                bootstrap(
                    cfg,
                    BootstrapReq {
                        email: email.trim().to_string(),
                        password,
                        org,
                        project,
                        tier,
                    },
                )
                .await
            }
            Cmd::Admin {
                cmd: AdminCmd::Backup { to, url, token },
            } => backup(cfg, to, url, token).await,
            Cmd::Admin {
                cmd: AdminCmd::Restore { from },
            } => restore(cfg, from),
            Cmd::Admin {
                cmd: AdminCmd::Migrate { to },
            } => migrate(cfg, to).await,
            Cmd::Admin {
                cmd: AdminCmd::Org { cmd, url, token },
            } => admin_org::run(cfg, cmd, admin_org::Remote { url, token }).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetops: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_tracing(filter: &str, format: fleetops::config::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        fleetops::config::LogFormat::Text => log.init(),
        fleetops::config::LogFormat::Json => log.json().init(),
    }
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    let running = startup::start(cfg).await?;
    if let Some(b) = &running.initial {
        // Standard output only, once; the tracing log (standard error) never holds these.
        println!(
            "fleetops: first start on an empty data directory. These credentials are shown once:"
        );
        println!("  admin email:    {}", b.email);
        if let Some(p) = &b.generated_password {
            println!("  admin password: {p}");
        }
        println!("  organization:   {}", b.org);
        println!("  project:        {}", b.project);
        println!("  project secret: {}", b.project_secret);
        println!("  API key:        {}", b.api_key);
    }
    if let Some(secret) = running.runtime.webhooks.take_generated_secret()? {
        println!(
            "fleetops: no [scm] webhook_secret was configured, so one was generated and kept in the data directory. Give it to the source host; it is shown once:"
        );
        println!("  webhook secret: {secret}");
    }
    println!("fleetops: listening on http://{}", running.addr);
    tracing::info!(addr = %running.addr, "listening");
    shutdown_signal().await;
    tracing::info!("shutting down");
    running.stop().await;
    Ok(())
}

async fn bootstrap(cfg: Config, req: BootstrapReq) -> anyhow::Result<()> {
    let rt = startup::start_runtime(&cfg).await?;
    let result = rt.directory.bootstrap(req).await;
    rt.shutdown().await;
    let b = result?;
    println!("{}", serde_json::to_string(&b)?);
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn backup(
    cfg: Config,
    to: PathBuf,
    url: Option<String>,
    token: Option<String>,
) -> anyhow::Result<()> {
    let to = std::path::absolute(&to)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    // With --url the running server makes the copy; offline, only a data directory that holds
    // a store is copied (opening a missing one would create it, and back up nothing).
    if url.is_none() && cfg.database.is_postgres() {
        anyhow::bail!("{}", fleetops_actors::backup::POSTGRES_BACKUP);
    }
    let offline = match url {
        Some(_) => Err(fleetops_storage::StorageError::Locked(String::new())),
        None if !cfg.data_dir.join("db").exists() => {
            anyhow::bail!(
                "{} holds no fleetops store: check data_dir (or FLEETOPS_DATA_DIR)",
                cfg.data_dir.display()
            )
        }
        None => {
            fleetops_storage::perms::check_private(&cfg.data_dir, cfg.storage.allow_shared_data_dir)
                .and_then(|()| fleetops_storage::Store::open(&cfg.data_dir))
        }
    };
    match offline {
        Ok(store) => {
            let blobs =
                fleetops_storage::blobs::BlobStore::from_config(&cfg.storage, &cfg.data_dir)?;
            let root = blobs.local_root().map(std::path::Path::to_path_buf);
            let report =
                tokio::task::spawn_blocking(move || store.backup_to(&to, root.as_deref(), now_ms))
                    .await??;
            println!("{}", serde_json::to_string(&report)?);
            Ok(())
        }
        Err(fleetops_storage::StorageError::Locked(_)) => {
            let token = token.ok_or_else(|| {
                anyhow::anyhow!(
                    "the data directory is in use by a running server: give a superuser's API key with --token or FLEETOPS_TOKEN, and the server takes the backup"
                )
            })?;
            let base = server_base(&cfg, url)?;
            let r = reqwest::Client::new()
                .post(format!("{base}/api/v1/admin/backup"))
                .bearer_auth(token)
                .json(&serde_json::json!({"to": to}))
                .send()
                .await?;
            let status = r.status();
            let text = r.text().await?;
            if !status.is_success() {
                anyhow::bail!("the server refused the backup ({status}): {text}");
            }
            println!("{text}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The running server's base URL: `url`, else the configured listening address.
fn server_base(cfg: &Config, url: Option<String>) -> anyhow::Result<String> {
    Ok(match url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => {
            let mut addr: std::net::SocketAddr = cfg.listen.parse()?;
            if addr.ip().is_unspecified() {
                addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            format!("http://{addr}")
        }
    })
}

/// `admin migrate`: the embedded store under the data directory, copied into PostgreSQL.
async fn migrate(cfg: Config, to: String) -> anyhow::Result<()> {
    if !cfg.data_dir.join("db").exists() {
        anyhow::bail!(
            "{} holds no embedded fleetops store to migrate: check data_dir (or FLEETOPS_DATA_DIR)",
            cfg.data_dir.display()
        );
    }
    if !to.starts_with("postgres://") && !to.starts_with("postgresql://") {
        anyhow::bail!("--to must be a postgres:// URL");
    }
    let dir = cfg.data_dir.clone();
    let allow = cfg.storage.allow_shared_data_dir;
    let report = tokio::task::spawn_blocking(move || {
        fleetops_storage::perms::check_private(&dir, allow)?;
        // Fails while a server holds the data directory: migrate with it stopped.
        let store = fleetops_storage::Store::open(&dir)?;
        store.copy_to_postgres(&to)
    })
    .await?
    .map_err(|e| match e {
        fleetops_storage::StorageError::Locked(_) => anyhow::anyhow!(
            "a running server holds {}: stop it, then migrate",
            cfg.data_dir.display()
        ),
        other => anyhow::Error::from(other),
    })?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn restore(cfg: Config, from: PathBuf) -> anyhow::Result<()> {
    if cfg.database.is_postgres() {
        anyhow::bail!(
            "a backup restores an embedded store, and this configuration keeps its records in \
             PostgreSQL: restore the database with its own tools"
        );
    }
    let report = fleetops_storage::backup::restore(&from, &cfg.data_dir)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
