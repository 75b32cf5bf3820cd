//! `fleetops admin org ...`: list, show, rename, re-tier and delete organizations.
//!
//! With the server stopped the command opens the data directory itself (a delete then waits
//! until the organization's data is purged); while a server holds the directory, it asks that
//! server over HTTP with a superuser's API key or token, as `admin backup` does (a delete then
//! returns once the organization is gone from every lookup, its purge going on in the server).
//! Each command prints one JSON object.

use clap::Subcommand;
use fleetops::config::Config;
use fleetops::startup;
use serde_json::{Value, json};

#[derive(Subcommand)]
pub enum OrgCmd {
    /// Every organization, newest first, and how many deleted ones are still being purged.
    List,
    /// One organization.
    Show { slug: String },
    /// Changes an organization's display name (its slug stays).
    Rename { slug: String, name: String },
    /// Moves an organization to another configured tier (its quotas and rate limits).
    SetTier { slug: String, tier: String },
    /// Deletes an organization with every project, device, session, log, file, capsule,
    /// configuration, deployment, rule, alert, repository link and test run of it.
    Delete {
        slug: String,
        /// Confirms the deletion (it cannot be undone).
        #[arg(long)]
        yes: bool,
    },
}

/// Where the command goes when a server holds the data directory.
pub struct Remote {
    pub url: Option<String>,
    pub token: Option<String>,
}

pub async fn run(cfg: Config, cmd: OrgCmd, remote: Remote) -> anyhow::Result<()> {
    match &cmd {
        OrgCmd::Show { slug }
        | OrgCmd::Rename { slug, .. }
        | OrgCmd::SetTier { slug, .. }
        | OrgCmd::Delete { slug, .. } => {
            fleetops_actors::rules::slug("organization", slug)
                .map_err(|_| anyhow::anyhow!("{slug:?} is not an organization slug"))?;
        }
        OrgCmd::List => {}
    }
    if let OrgCmd::Delete { slug, yes: false } = &cmd {
        anyhow::bail!("deleting {slug} removes all of its data for good: add --yes to confirm");
    }
    if remote.url.is_none() {
        if !cfg.database.is_postgres() && !cfg.data_dir.join("db").exists() {
            anyhow::bail!(
                "{} holds no fleetops store: check data_dir (or FLEETOPS_DATA_DIR)",
                cfg.data_dir.display()
            );
        }
        // Reads need only the store; changes go through the runtime's actors (its timers
        // run too while the command does: the server is stopped, so they are the only ones).
        let reads = matches!(cmd, OrgCmd::List | OrgCmd::Show { .. });
        let opened = if reads {
            startup::open_store(&cfg).await.map(Opened::Store)
        } else {
            startup::start_runtime(&cfg)
                .await
                .map(|rt| Opened::Runtime(Box::new(rt)))
        };
        match opened {
            Ok(Opened::Store(store)) => {
                let out = read_offline(&store, cmd)?;
                println!("{}", serde_json::to_string(&out)?);
                return Ok(());
            }
            Ok(Opened::Runtime(rt)) => {
                let out = offline(&rt, cmd).await;
                rt.shutdown().await;
                println!("{}", serde_json::to_string(&out?)?);
                return Ok(());
            }
            Err(e) if is_locked(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let out = online(&cfg, cmd, remote).await?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

enum Opened {
    Store(fleetops_storage::Store),
    Runtime(Box<fleetops_actors::Runtime>),
}

/// `list` and `show` on the store alone.
fn read_offline(store: &fleetops_storage::Store, cmd: OrgCmd) -> anyhow::Result<Value> {
    use fleetops_actors::views::{AllOrgs, OrgView};
    Ok(match cmd {
        OrgCmd::Show { slug } => {
            let o = store
                .org_by_slug(&slug)?
                .ok_or_else(|| anyhow::anyhow!("no organization {slug}"))?;
            serde_json::to_value(OrgView::from(&*o))?
        }
        _ => serde_json::to_value(AllOrgs::of(
            &store.all_orgs()?,
            store.orgs_being_deleted()?.len() as u64,
        ))?,
    })
}

fn is_locked(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<fleetops_storage::StorageError>(),
        Some(fleetops_storage::StorageError::Locked(_))
    )
}

async fn offline(rt: &fleetops_actors::Runtime, cmd: OrgCmd) -> anyhow::Result<Value> {
    let dir = &rt.directory;
    let org = |slug: &str| -> anyhow::Result<fleetops_actors::views::OrgView> {
        dir.org_by_slug(slug)?
            .ok_or_else(|| anyhow::anyhow!("no organization {slug}"))
    };
    Ok(match cmd {
        OrgCmd::Show { slug } => serde_json::to_value(org(&slug)?)?,
        OrgCmd::List => serde_json::to_value(dir.all_orgs()?)?,
        OrgCmd::Rename { slug, name } => {
            let id = org(&slug)?.id;
            serde_json::to_value(dir.update_org(id, Some(name), None).await?)?
        }
        OrgCmd::SetTier { slug, tier } => {
            let id = org(&slug)?.id;
            serde_json::to_value(dir.update_org(id, None, Some(tier)).await?)?
        }
        OrgCmd::Delete { slug, .. } => {
            let id = org(&slug)?.id;
            dir.delete_org(id).await?;
            // Offline nobody else finishes the purge: wait for it (a stop before the end
            // leaves it to the next start).
            while dir.purging()?.contains(&id) {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            json!({"deleted": slug, "purging": false})
        }
    })
}

async fn online(cfg: &Config, cmd: OrgCmd, remote: Remote) -> anyhow::Result<Value> {
    let token = remote.token.ok_or_else(|| {
        anyhow::anyhow!(
            "the data directory is in use (by a running server, or another admin command): for a server, give a superuser's API key with --token or FLEETOPS_TOKEN, and the server makes the change"
        )
    })?;
    let base = crate::server_base(cfg, remote.url)?;
    let c = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()?;
    let org = |slug: &str| format!("{base}/api/v1/organizations/{slug}");
    let rb = match &cmd {
        OrgCmd::List => c.get(format!("{base}/api/v1/admin/organizations")),
        OrgCmd::Show { slug } => c.get(org(slug)),
        OrgCmd::Rename { slug, name } => c.patch(org(slug)).json(&json!({"name": name})),
        OrgCmd::SetTier { slug, tier } => c.patch(org(slug)).json(&json!({"tier": tier})),
        OrgCmd::Delete { slug, .. } => c.delete(org(slug)),
    };
    let r = rb.bearer_auth(token).send().await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        anyhow::bail!("the server refused ({status}): {text}");
    }
    Ok(match cmd {
        OrgCmd::Delete { slug, .. } => json!({"deleted": slug, "purging": true}),
        _ => serde_json::from_str(&text)?,
    })
}
