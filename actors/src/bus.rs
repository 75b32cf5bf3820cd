//! The bus between nodes: what must travel from one fleetops process to the others as it
//! happens (cache revocations, live log batches, rollout and alert events).
//!
//! `[bus] url` (`FLEETOPS_BUS_URL`) names a NATS server (core subjects, no JetStream). Empty,
//! the bus is in-process: publishing goes nowhere and nothing arrives, which is all one node
//! needs, since its actors already fan out inside the process.
//!
//! The NATS server is not trusted with what travels on it. A node logs in with NATS's own
//! credentials (`[bus] user` and `password`, `token`, `nkey_seed` or `creds_file`) over TLS
//! when configured, and seals every message it publishes with the bus key the nodes share
//! ([`seal`]: encrypted, its subject and sender authenticated). A message that does not open
//! is dropped and counted (`fleetops_bus_rejected` in `/metrics`), so a client that reaches
//! the server reads nothing and makes no node act on anything it sends.
//!
//! Delivery is at most once, as NATS core's is: every user of the bus has its own way to notice
//! a loss and catch up from the store (caches hold an entry a bounded time on a shared store;
//! a live feed reads a gap back from the stored chunks). So the bus never holds anything up:
//!
//! - publishing queues the message and returns; one task seals and sends the queue in order.
//!   The queue is bounded in bytes (`max_queued_bytes`): past it a message is dropped and
//!   counted (`fleetops_bus_dropped` in `/metrics`), never waited for;
//! - each subscription is bounded in messages by the client (`subscription_capacity`); a
//!   subscriber that falls behind loses messages, as a slow consumer does on NATS;
//! - a node does not hear what it published itself (the server echoes nothing back to it).
//!
//! No `async_nats` type leaves this file.

mod seal;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

pub use seal::KEY_LEN;
use seal::{OVERHEAD, Opened, Opener, Sealer};

/// `[bus]`.
#[derive(Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    /// `nats://host:4222` (`tls://` for TLS); empty: in-process.
    pub url: String,
    /// NATS user name, with `password`.
    pub user: String,
    /// NATS password (`FLEETOPS_BUS_PASSWORD`).
    pub password: String,
    /// NATS token (`FLEETOPS_BUS_TOKEN`).
    pub token: String,
    /// NATS nkey seed, `SU...` (`FLEETOPS_BUS_NKEY_SEED`).
    pub nkey_seed: String,
    /// A NATS `.creds` file (a user JWT and its nkey seed).
    pub creds_file: String,
    /// PEM file of the CA that signed the NATS server's certificate (beside the system's).
    pub tls_ca_file: String,
    /// PEM client certificate for NATS servers that verify clients, with `tls_key_file`.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Refuses a NATS server that does not speak TLS.
    pub tls_required: bool,
    /// Bytes of messages waiting to be sent; past it a message is dropped.
    pub max_queued_bytes: usize,
    /// Messages a subscription holds before the client drops its newer ones.
    pub subscription_capacity: usize,
    /// How long a lease (a rollout's controller) lasts without being renewed: how soon
    /// another node takes over after its holder died. Renewed at every controller tick, so
    /// keep it a few ticks long.
    pub lease_ttl_ms: u64,
    /// How many nodes share the load behind the load balancer. Rate limits are counted by
    /// each node alone, so each enforces this share of every limit (a tier's requests per
    /// minute, the login limits), rounded up: a client spread evenly over the nodes gets its
    /// limit in all.
    pub nodes: u32,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            user: String::new(),
            password: String::new(),
            token: String::new(),
            nkey_seed: String::new(),
            creds_file: String::new(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_required: false,
            max_queued_bytes: 64 << 20,
            subscription_capacity: 8192,
            lease_ttl_ms: 5_000,
            nodes: 1,
        }
    }
}

/// Never shows a secret.
impl std::fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &str| if s.is_empty() { "" } else { "****" };
        f.debug_struct("BusConfig")
            .field("url", &redact(&self.url))
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("nkey_seed", &hidden(&self.nkey_seed))
            .field("creds_file", &self.creds_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("tls_required", &self.tls_required)
            .field("max_queued_bytes", &self.max_queued_bytes)
            .field("subscription_capacity", &self.subscription_capacity)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl BusConfig {
    /// The NATS credentials and TLS keys agree with each other and with `url`.
    pub fn validate(&self) -> anyhow::Result<()> {
        let logins = [
            !self.user.is_empty() || !self.password.is_empty(),
            !self.token.is_empty(),
            !self.nkey_seed.is_empty(),
            !self.creds_file.is_empty(),
        ];
        let tls = !self.tls_ca_file.is_empty()
            || !self.tls_cert_file.is_empty()
            || !self.tls_key_file.is_empty()
            || self.tls_required;
        if self.url.is_empty() && (logins.contains(&true) || tls) {
            anyhow::bail!("[bus] has NATS credentials or TLS keys but no url");
        }
        if logins.iter().filter(|l| **l).count() > 1 {
            anyhow::bail!(
                "[bus] takes one NATS login: user and password, token, nkey_seed or creds_file"
            );
        }
        if self.user.is_empty() != self.password.is_empty() {
            anyhow::bail!("[bus] user and password go together");
        }
        if self.tls_cert_file.is_empty() != self.tls_key_file.is_empty() {
            anyhow::bail!("[bus] tls_cert_file and tls_key_file go together");
        }
        Ok(())
    }

    /// The client options: name, bounds, credentials and TLS.
    async fn options(&self) -> anyhow::Result<async_nats::ConnectOptions> {
        let mut o = async_nats::ConnectOptions::new()
            .name("fleetops")
            .subscription_capacity(self.subscription_capacity.max(16))
            .connection_timeout(Duration::from_secs(5))
            // A node never hears itself: a message naming it as its sender is forged.
            .no_echo();
        if !self.user.is_empty() {
            o = o.user_and_password(self.user.clone(), self.password.clone());
        }
        if !self.token.is_empty() {
            o = o.token(self.token.clone());
        }
        if !self.nkey_seed.is_empty() {
            o = o.nkey(self.nkey_seed.trim().to_string());
        }
        if !self.creds_file.is_empty() {
            o = o
                .credentials_file(&self.creds_file)
                .await
                .map_err(|e| anyhow::anyhow!("[bus] creds_file {}: {e}", self.creds_file))?;
        }
        if !self.tls_ca_file.is_empty() {
            o = o.add_root_certificates(self.tls_ca_file.clone().into());
        }
        if !self.tls_cert_file.is_empty() {
            o = o.add_client_certificate(
                self.tls_cert_file.clone().into(),
                self.tls_key_file.clone().into(),
            );
        }
        if self.tls_required {
            o = o.require_tls(true);
        }
        Ok(o)
    }
}

/// Length of a node's id.
const ORIGIN: usize = seal::ORIGIN;

/// A handle on the bus; cheap to clone.
#[derive(Clone)]
pub struct Bus {
    inner: Option<Arc<Nats>>,
    /// This process's id, fresh at every start.
    node: [u8; ORIGIN],
}

struct Nats {
    client: async_nats::Client,
    /// The bus key every node shares: each subscription opens what it receives with it.
    key: Arc<[u8; KEY_LEN]>,
    out: mpsc::UnboundedSender<(String, Bytes)>,
    queued: AtomicUsize,
    max_queued: usize,
    capacity: usize,
    dropped: AtomicU64,
    published: AtomicU64,
    received: AtomicU64,
    /// Messages that did not open: not sealed by a node, or replayed.
    rejected: AtomicU64,
}

/// A message from another node.
pub struct Message {
    pub subject: String,
    pub payload: Bytes,
}

/// What a subscription yields; ends when the bus closes.
pub struct Subscription {
    inner: Option<(async_nats::Subscriber, Opener)>,
    nats: Option<Arc<Nats>>,
}

impl Subscription {
    /// The next message another node published on the subject; `None` once the bus is gone
    /// (or at once on the in-process bus, which never delivers anything). A message that does
    /// not open (forged, altered, moved from another subject, replayed) is dropped and
    /// counted.
    pub async fn next(&mut self) -> Option<Message> {
        let (sub, opener) = self.inner.as_mut()?;
        loop {
            let m = sub.next().await?;
            let subject = m.subject.to_string();
            let payload = match opener.open(&subject, &m.payload, seal::now_ms()) {
                Opened::Refused => {
                    if let Some(n) = &self.nats {
                        n.rejected.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(subject, "a bus message that does not open: dropped");
                    continue;
                }
                Opened::Payload(p) => p,
            };
            if let Some(n) = &self.nats {
                n.received.fetch_add(1, Ordering::Relaxed);
            }
            return Some(Message { subject, payload });
        }
    }
}

/// The bus's counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy)]
pub struct BusStats {
    pub published: u64,
    pub received: u64,
    pub dropped: u64,
    /// Messages dropped because they did not open with the bus key.
    pub rejected: u64,
}

impl Bus {
    /// The in-process bus.
    pub fn local() -> Self {
        Self {
            inner: None,
            node: node_id(),
        }
    }

    /// Connects to `cfg.url`, or the in-process bus when it is empty, sealing and opening
    /// messages with `key` (the nodes' shared bus key, [`KEY_LEN`] bytes). A server that
    /// cannot be reached, or refuses the credentials, at start is an error; once connected,
    /// the client reconnects by itself and `/readyz` reports the bus down meanwhile.
    pub async fn connect(cfg: &BusConfig, key: &[u8]) -> anyhow::Result<Self> {
        if cfg.url.is_empty() {
            return Ok(Self::local());
        }
        let key: [u8; KEY_LEN] = key
            .try_into()
            .map_err(|_| anyhow::anyhow!("the bus key is not {KEY_LEN} bytes"))?;
        let client = cfg
            .options()
            .await?
            .connect(cfg.url.as_str())
            .await
            .map_err(|e| anyhow::anyhow!("[bus] url {}: {e}", redact(&cfg.url)))?;
        let node = node_id();
        let (out, mut rx) = mpsc::unbounded_channel::<(String, Bytes)>();
        let nats = Arc::new(Nats {
            client: client.clone(),
            key: Arc::new(key),
            out,
            queued: AtomicUsize::new(0),
            max_queued: cfg.max_queued_bytes.max(1 << 20),
            capacity: cfg.subscription_capacity,
            dropped: AtomicU64::new(0),
            published: AtomicU64::new(0),
            received: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&nats);
        let mut sealer = Sealer::new(&key, node);
        tokio::spawn(async move {
            while let Some((subject, payload)) = rx.recv().await {
                let len = queued_len(&subject, &payload);
                // Sealed here, in sending order: a sender's counters rise on the wire.
                let sealed = sealer.seal(&subject, &payload, seal::now_ms());
                drop(payload);
                let sent = client.publish(subject, sealed).await;
                let Some(n) = weak.upgrade() else { break };
                n.queued.fetch_sub(len, Ordering::Relaxed);
                match sent {
                    Ok(()) => n.published.fetch_add(1, Ordering::Relaxed),
                    Err(_) => n.dropped.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
        Ok(Self {
            inner: Some(nats),
            node,
        })
    }

    /// This process's id among the nodes (fresh at every start): who holds a lease.
    pub fn node_id(&self) -> [u8; ORIGIN] {
        self.node
    }

    /// Whether messages travel to other nodes.
    pub fn is_shared(&self) -> bool {
        self.inner.is_some()
    }

    /// Queues `payload` for the other nodes subscribed to `subject`; dropped (and counted)
    /// when the queue holds `max_queued_bytes` already.
    pub fn publish(&self, subject: String, payload: &[u8]) {
        let Some(n) = &self.inner else { return };
        let payload = Bytes::copy_from_slice(payload);
        let len = queued_len(&subject, &payload);
        if n.queued.fetch_add(len, Ordering::Relaxed) + len > n.max_queued {
            n.queued.fetch_sub(len, Ordering::Relaxed);
            n.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if n.out.send((subject, payload)).is_err() {
            n.queued.fetch_sub(len, Ordering::Relaxed);
            n.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Messages other nodes publish on `subject` (NATS wildcards allowed) from now on.
    pub async fn subscribe(&self, subject: &str) -> anyhow::Result<Subscription> {
        let Some(n) = &self.inner else {
            return Ok(Subscription {
                inner: None,
                nats: None,
            });
        };
        let sub = n
            .client
            .subscribe(subject.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("bus subscribe {subject}: {e}"))?;
        Ok(Subscription {
            inner: Some((sub, Opener::new(n.key.clone(), self.node))),
            nats: Some(n.clone()),
        })
    }

    /// Whether the bus can carry messages now: always on the in-process bus; on NATS, whether
    /// the client is connected and answers a flush within `wait`.
    pub async fn reachable(&self, wait: Duration) -> bool {
        let Some(n) = &self.inner else { return true };
        if n.client.connection_state() != async_nats::connection::State::Connected {
            return false;
        }
        matches!(
            tokio::time::timeout(wait, n.client.flush()).await,
            Ok(Ok(()))
        )
    }

    pub fn stats(&self) -> BusStats {
        match &self.inner {
            None => BusStats::default(),
            Some(n) => BusStats {
                published: n.published.load(Ordering::Relaxed),
                received: n.received.load(Ordering::Relaxed),
                dropped: n.dropped.load(Ordering::Relaxed),
                rejected: n.rejected.load(Ordering::Relaxed),
            },
        }
    }

    /// Messages a subscription holds at most.
    pub fn subscription_capacity(&self) -> usize {
        self.inner.as_ref().map_or(0, |n| n.capacity)
    }
}

/// What a queued message counts against `max_queued_bytes`: sealed, with its subject and the
/// queue entry, so a flood of empty messages is bounded too.
fn queued_len(subject: &str, payload: &[u8]) -> usize {
    OVERHEAD + payload.len() + subject.len() + 64
}

/// A task forwarding what a subscription brings to an actor, ended with the actor's state
/// (dropping it aborts the task).
pub struct Listener(tokio::task::JoinHandle<()>);

impl Listener {
    pub fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn node_id() -> [u8; ORIGIN] {
    *uuid::Uuid::new_v4().as_bytes()
}

/// The URL without a password, for messages.
fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("****"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_nats_login_with_its_parts_and_a_url_and_no_secret_in_debug() {
        let with = |f: fn(&mut BusConfig)| {
            let mut c = BusConfig {
                url: "nats://127.0.0.1:4222".into(),
                ..BusConfig::default()
            };
            f(&mut c);
            c
        };
        assert!(with(|_| {}).validate().is_ok());
        let login = with(|c| {
            c.user = "fleet".into();
            c.password = "hunter2-secret".into();
        });
        assert!(login.validate().is_ok());
        assert!(!format!("{login:?}").contains("hunter2-secret"));
        assert!(with(|c| c.user = "fleet".into()).validate().is_err());
        assert!(
            with(|c| {
                c.token = "t".into();
                c.nkey_seed = "SU".into();
            })
            .validate()
            .is_err()
        );
        assert!(
            with(|c| c.tls_cert_file = "c.pem".into())
                .validate()
                .is_err()
        );
        let mut no_url = with(|c| c.token = "t".into());
        no_url.url.clear();
        assert!(no_url.validate().is_err());
    }
}
