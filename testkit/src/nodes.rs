//! The engines several nodes share, started here on loopback: a private PostgreSQL cluster
//! (one database per test), moto (one bucket per test) and `nats-server` (one per test, so a
//! test may stop it); and fleetops nodes, each its own process on port 0 with its own data
//! directory, spoken to over HTTP.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binary;
use crate::process::{Guard, free_port, printed_value, until_listening, wait_for_port};

/// `[scm] webhook_secret` of every node.
pub const WEBHOOK_SECRET: &str = "It's a Secret to Everybody";

/// `[bus] lease_ttl_ms` of every node (unless [`Engines::with_leases_of`] says otherwise).
pub const LEASE_TTL_MS: u64 = 2_000;

/// One `nats-server` on loopback.
pub struct Nats {
    child: Option<Guard>,
    port: u16,
    /// Its arguments past the address and port (`--user`, `--pass`, ...).
    args: Vec<String>,
}

impl Nats {
    pub fn start() -> Nats {
        Nats::start_with(&[])
    }

    /// A server started with `args` too (credentials it asks of its clients).
    pub fn start_with(args: &[&str]) -> Nats {
        let port = free_port();
        let mut n = Nats {
            child: None,
            port,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        n.restart();
        n
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server (kill -9).
    pub fn stop(&mut self) {
        self.child = None;
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        let child = Command::new(crate::nats::binary())
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server");
        self.child = Some(Guard(child));
        wait_for_port(self.port, "nats-server");
    }
}

/// The engines of one test: a database, a bucket and a bus of its own.
pub struct Engines {
    pub database: String,
    pub bucket: String,
    pub nats: Nats,
    /// Holds the nodes' data directories.
    pub dir: tempfile::TempDir,
    /// `[bus] lease_ttl_ms` of the nodes started from here on.
    lease_ttl_ms: u64,
}

impl Engines {
    pub async fn start() -> Engines {
        Engines::start_on(Nats::start()).await
    }

    /// As [`Engines::start`], the bus being `nats`.
    pub async fn start_on(nats: Nats) -> Engines {
        let dir = tempfile::tempdir().unwrap();
        let database = crate::postgres::database_for(dir.path());
        Engines::with_database(nats, dir, database).await
    }

    /// As [`Engines::start`], on a database of `cluster` (the benches' cluster, fsync on).
    pub async fn start_in(cluster: &crate::postgres::Cluster) -> Engines {
        let dir = tempfile::tempdir().unwrap();
        Engines::with_database(Nats::start(), dir, cluster.database()).await
    }

    async fn with_database(nats: Nats, dir: tempfile::TempDir, database: String) -> Engines {
        let bucket = format!("b{}", uuid::Uuid::new_v4().simple());
        let r = reqwest::Client::new()
            .put(format!("{}/{bucket}", crate::moto::shared()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "creating the bucket");
        Engines {
            database,
            bucket,
            nats,
            dir,
            lease_ttl_ms: LEASE_TTL_MS,
        }
    }

    /// The nodes started from here on hold their leases for `ms`.
    pub fn with_leases_of(mut self, ms: u64) -> Engines {
        self.lease_ttl_ms = ms;
        self
    }

    fn config(&self, data_dir: &Path, s3: &str) -> String {
        format!(
            r#"listen = "127.0.0.1:0"
data_dir = "{data}"
log = "warn"

[database]
url = "{db}"

[bus]
url = "{bus}"
lease_ttl_ms = {lease}
nodes = 2

[storage]
backend = "s3"
bucket = "{bucket}"
endpoint = "{s3}"
region = "us-east-1"
access_key_id = "testing"
secret_access_key = "testing"
allow_http = true

[http]
login_per_minute = 100000

[admin]
tier = "free"

[tiers.free]
requests_per_minute = 1000000

[pipeline]
rollout_tick_ms = 100

[scm]
webhook_secret = "{webhook_secret}"

[alerts]
allow_private_targets = true
tick_ms = 100
"#,
            data = data_dir.display(),
            db = self.database,
            bus = self.nats.url(),
            lease = self.lease_ttl_ms,
            webhook_secret = WEBHOOK_SECRET,
            bucket = self.bucket,
            s3 = s3,
        )
    }

    /// Starts node `name` (its data directory kept across restarts), waiting for it to
    /// listen. The first node started on the engines prints the first credentials.
    pub fn node(&self, name: &str) -> Node {
        self.node_with_s3(name, crate::moto::shared())
    }

    /// As [`Engines::node`], its blob store at `s3` (an endpoint that may not answer).
    pub fn node_with_s3(&self, name: &str, s3: &str) -> Node {
        self.spawn(name, s3, |c| c, false)
            .unwrap_or_else(|e| panic!("node {name} did not start: {e}"))
    }

    /// As [`Engines::node`], its configuration file's text changed by `edit` first.
    pub fn node_with(&self, name: &str, edit: impl FnOnce(String) -> String) -> Node {
        self.spawn(name, crate::moto::shared(), edit, false)
            .unwrap_or_else(|e| panic!("node {name} did not start: {e}"))
    }

    /// As [`Engines::node_with`], for a node that may not start: what it wrote (stderr,
    /// then stdout) when it exits before listening.
    pub fn try_node_with(
        &self,
        name: &str,
        edit: impl FnOnce(String) -> String,
    ) -> Result<Node, String> {
        self.spawn(name, crate::moto::shared(), edit, true)
    }

    fn spawn(
        &self,
        name: &str,
        s3: &str,
        edit: impl FnOnce(String) -> String,
        keep_stderr: bool,
    ) -> Result<Node, String> {
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        let file = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, edit(self.config(&data.join("data"), s3))).unwrap();
        let err_file = self.dir.path().join(format!("{name}.stderr"));
        let stderr = match std::env::var_os("FLEETOPS_TEST_STDERR") {
            _ if keep_stderr => Stdio::from(std::fs::File::create(&err_file).unwrap()),
            Some(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .unwrap(),
            ),
            None => Stdio::null(),
        };
        let mut cmd = Command::new(binary("fleetops"));
        cmd.arg("--config")
            .arg(&file)
            .arg("serve")
            .current_dir(&data)
            .env_remove("FLEETOPS_DATABASE_URL")
            .env_remove("FLEETOPS_BUS_URL")
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn().unwrap();
        let started = until_listening(child.stdout.take().unwrap(), Duration::from_secs(60));
        let (stdout, base) = (started.printed, started.listening_on.unwrap_or_default());
        if base.is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            let err = std::fs::read_to_string(&err_file).unwrap_or_default();
            return Err(format!("{err}{}", stdout.join("\n")));
        }
        Ok(Node {
            name: name.to_string(),
            _proc: Guard(child),
            base,
            stdout,
        })
    }
}

/// One fleetops process.
pub struct Node {
    pub name: String,
    /// Dropping it kills the node.
    _proc: Guard,
    pub base: String,
    /// What it printed before listening (the first credentials, on the first node).
    pub stdout: Vec<String>,
}

impl Node {
    /// kill -9, waiting until it is gone.
    pub fn kill(self) {
        drop(self);
    }

    /// Sends it `SIG{name}` (`STOP`, `CONT`).
    pub fn signal(&self, name: &str) {
        let pid = self._proc.0.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{name} {pid}");
    }

    /// Stops it as an operator does (SIGTERM), waiting until it has exited.
    pub fn stop(mut self) {
        let pid = self._proc.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while self._proc.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "node {} did not stop", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Its process id (the bench reads its CPU time).
    pub fn pid(&self) -> u32 {
        self._proc.0.id()
    }

    /// A value the first start printed (`API key:`, `project secret:`).
    pub fn printed(&self, label: &str) -> String {
        printed_value(&self.stdout, label)
            .unwrap_or_else(|| panic!("{label} not printed by {}: {:?}", self.name, self.stdout))
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A request's status and JSON body (Null when not JSON).
pub async fn call(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    bearer: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = c.request(method, url);
    if !bearer.is_empty() {
        r = r.bearer_auth(bearer);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}
