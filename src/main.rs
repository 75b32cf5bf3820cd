//! `fleetops`: the server (`serve`) and its offline admin commands (`admin bootstrap`).

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
                        email,
                        password,
                        org,
                        project,
                        tier,
                    },
                )
                .await
            }
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
        .with_writer(std::io::stderr);
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
