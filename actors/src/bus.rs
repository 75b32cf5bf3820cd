//! The bus between nodes: what must travel from one fleetops process to the others as it
//! happens (cache revocations, live log batches, rollout and alert events).
//!
//! `[bus] url` (`FLEETOPS_BUS_URL`) names a NATS server (core subjects, no JetStream). Empty,
//! the bus is in-process: publishing goes nowhere and nothing arrives, which is all one node
//! needs, since its actors already fan out inside the process.
//!
//! Delivery is at most once, as NATS core's is: every user of the bus has its own way to notice
//! a loss and catch up from the store (caches hold an entry a bounded time on a shared store;
//! a live feed reads a gap back from the stored chunks). So the bus never holds anything up:
//!
//! - publishing queues the message and returns; one task sends the queue in order. The queue is
//!   bounded in bytes (`max_queued_bytes`): past it a message is dropped and counted
//!   (`fleetops_bus_dropped` in `/metrics`), never waited for;
//! - each subscription is bounded in messages by the client (`subscription_capacity`); a
//!   subscriber that falls behind loses messages, as a slow consumer does on NATS;
//! - a node skips what it published itself: each message starts with its sender's node id.
//!
//! No `async_nats` type leaves this file.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::mpsc;

/// `[bus]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    /// `nats://host:4222`; empty: in-process.
    pub url: String,
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
            max_queued_bytes: 64 << 20,
            subscription_capacity: 8192,
            lease_ttl_ms: 5_000,
            nodes: 1,
        }
    }
}

/// Length of the sender's id at the head of every message.
const ORIGIN: usize = 16;

/// A handle on the bus; cheap to clone.
#[derive(Clone)]
pub struct Bus {
    inner: Option<Arc<Nats>>,
    /// This process's id, fresh at every start.
    node: [u8; ORIGIN],
}

struct Nats {
    client: async_nats::Client,
    out: mpsc::UnboundedSender<(String, Bytes)>,
    queued: AtomicUsize,
    max_queued: usize,
    capacity: usize,
    dropped: AtomicU64,
    published: AtomicU64,
    received: AtomicU64,
}

/// A message from another node.
pub struct Message {
    pub subject: String,
    pub payload: Bytes,
}

/// What a subscription yields; ends when the bus closes.
pub struct Subscription {
    inner: Option<async_nats::Subscriber>,
    node: [u8; ORIGIN],
    nats: Option<Arc<Nats>>,
}

impl Subscription {
    /// The next message another node published on the subject; `None` once the bus is gone
    /// (or at once on the in-process bus, which never delivers anything).
    pub async fn next(&mut self) -> Option<Message> {
        let sub = self.inner.as_mut()?;
        loop {
            let m = sub.next().await?;
            if m.payload.len() < ORIGIN || m.payload[..ORIGIN] == self.node {
                continue;
            }
            if let Some(n) = &self.nats {
                n.received.fetch_add(1, Ordering::Relaxed);
            }
            return Some(Message {
                subject: m.subject.to_string(),
                payload: m.payload.slice(ORIGIN..),
            });
        }
    }
}

/// The bus's counters for `/metrics`.
#[derive(Debug, Default, Clone, Copy)]
pub struct BusStats {
    pub published: u64,
    pub received: u64,
    pub dropped: u64,
}

impl Bus {
    /// The in-process bus.
    pub fn local() -> Self {
        Self {
            inner: None,
            node: node_id(),
        }
    }

    /// Connects to `cfg.url`, or the in-process bus when it is empty. A server that cannot be
    /// reached at start is an error; once connected, the client reconnects by itself and
    /// `/readyz` reports the bus down meanwhile.
    pub async fn connect(cfg: &BusConfig) -> anyhow::Result<Self> {
        if cfg.url.is_empty() {
            return Ok(Self::local());
        }
        let client = async_nats::ConnectOptions::new()
            .name("fleetops")
            .subscription_capacity(cfg.subscription_capacity.max(16))
            .connection_timeout(Duration::from_secs(5))
            .connect(cfg.url.as_str())
            .await
            .map_err(|e| anyhow::anyhow!("[bus] url {}: {e}", redact(&cfg.url)))?;
        let (out, mut rx) = mpsc::unbounded_channel::<(String, Bytes)>();
        let nats = Arc::new(Nats {
            client: client.clone(),
            out,
            queued: AtomicUsize::new(0),
            max_queued: cfg.max_queued_bytes.max(1 << 20),
            capacity: cfg.subscription_capacity,
            dropped: AtomicU64::new(0),
            published: AtomicU64::new(0),
            received: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&nats);
        tokio::spawn(async move {
            while let Some((subject, payload)) = rx.recv().await {
                let len = payload.len() + subject.len() + 64;
                let sent = client.publish(subject, payload).await;
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
            node: node_id(),
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
        // Counted with the subject and the queue entry, so a flood of empty messages is
        // bounded too.
        let len = ORIGIN + payload.len() + subject.len() + 64;
        if n.queued.fetch_add(len, Ordering::Relaxed) + len > n.max_queued {
            n.queued.fetch_sub(len, Ordering::Relaxed);
            n.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut b = BytesMut::with_capacity(ORIGIN + payload.len());
        b.put_slice(&self.node);
        b.put_slice(payload);
        if n.out.send((subject, b.freeze())).is_err() {
            n.queued.fetch_sub(len, Ordering::Relaxed);
            n.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Messages other nodes publish on `subject` (NATS wildcards allowed) from now on.
    pub async fn subscribe(&self, subject: &str) -> anyhow::Result<Subscription> {
        let Some(n) = &self.inner else {
            return Ok(Subscription {
                inner: None,
                node: self.node,
                nats: None,
            });
        };
        let sub = n
            .client
            .subscribe(subject.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("bus subscribe {subject}: {e}"))?;
        Ok(Subscription {
            inner: Some(sub),
            node: self.node,
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
            },
        }
    }

    /// Messages a subscription holds at most.
    pub fn subscription_capacity(&self) -> usize {
        self.inner.as_ref().map_or(0, |n| n.capacity)
    }
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
