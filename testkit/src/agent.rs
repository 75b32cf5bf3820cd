//! A fleetops server as a process on a port of its own (so it can be stopped and started
//! again where the agent expects it), and the agent binary run against it: the `agent` suite
//! and the agent's bench.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binary;
pub use crate::process::Guard;
use crate::process::{free_port, printed_value, until_listening};

pub const DEV: &str = "/api/v1/organizations/default/projects/default";

/// One server: its data directory and port outlive its process.
pub struct Server {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub base: String,
    proc: Option<Guard>,
    /// What the first start printed (the first credentials).
    printed: Vec<String>,
    /// The free tier's requests a minute (devices count against their organization's).
    rpm: u32,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with_rpm(1_000_000)
    }

    /// A server whose organizations may make `rpm` requests a minute.
    pub fn start_with_rpm(rpm: u32) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut s = Server {
            base: format!("http://127.0.0.1:{port}"),
            dir,
            port,
            proc: None,
            printed: Vec::new(),
            rpm,
        };
        s.printed = s.run();
        s
    }

    fn run(&mut self) -> Vec<String> {
        let data = self.dir.path().join("data");
        let file = self.dir.path().join("fleetops.toml");
        std::fs::write(
            &file,
            format!(
                "listen = \"127.0.0.1:{}\"\ndata_dir = \"{}\"\nlog = \"warn\"\n\n[http]\nlogin_per_minute = 100000\n\n[admin]\ntier = \"free\"\n\n[tiers.free]\nrequests_per_minute = {}\n",
                self.port,
                data.display(),
                self.rpm
            ),
        )
        .unwrap();
        let mut child = Command::new(binary("fleetops"))
            .arg("--config")
            .arg(&file)
            .arg("serve")
            .current_dir(self.dir.path())
            .env_remove("FLEETOPS_DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = until_listening(child.stdout.take().unwrap(), Duration::from_secs(60));
        let child = Guard(child);
        assert!(
            started.listening_on.is_some(),
            "the server did not start: {:?}",
            started.printed
        );
        self.proc = Some(child);
        started.printed
    }

    /// SIGTERM, waiting until it has exited.
    pub fn stop(&mut self) {
        if let Some(mut g) = self.proc.take() {
            let pid = g.0.id().to_string();
            Command::new("kill").args(["-TERM", &pid]).status().unwrap();
            let until = Instant::now() + Duration::from_secs(20);
            while g.0.try_wait().unwrap().is_none() {
                assert!(Instant::now() < until, "the server did not stop");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.run();
    }

    /// A value the first start printed (`API key:`).
    pub fn printed(&self, label: &str) -> String {
        printed_value(&self.printed, label)
            .unwrap_or_else(|| panic!("{label} not printed: {:?}", self.printed))
    }

    pub fn key(&self) -> String {
        self.printed("API key:")
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.key());
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> Value {
        let (s, b) = self.call(reqwest::Method::GET, path, None).await;
        assert_eq!(s, 200, "GET {path}: {b}");
        b
    }

    /// The messages of session `id`'s log lines, in order.
    pub async fn messages(&self, id: u64) -> Vec<String> {
        self.get(&format!("{DEV}/sessions/{id}/logs?limit=10000"))
            .await["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["message"].as_str().unwrap().to_string())
            .collect()
    }

    /// A new enrollment token of the default project.
    pub async fn enrollment_token(&self, body: Value) -> String {
        let (s, b) = self
            .call(
                reqwest::Method::POST,
                &format!("{DEV}/enrollment-tokens"),
                Some(body),
            )
            .await;
        assert_eq!(s, 201, "{b}");
        b["token"].as_str().unwrap().to_string()
    }
}

/// An agent's configuration and state directory, for `server`.
pub struct Agent {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

impl Agent {
    /// `extra`: more TOML, appended.
    pub fn new(server: &Server, token: &str, extra: &str) -> Agent {
        Agent::at(&server.base, token, extra)
    }

    /// An agent speaking to the service at `base`.
    pub fn at(base: &str, token: &str, extra: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "server = \"{}\"\nstate_dir = \"{}\"\nname = \"amr-1\"\nenrollment_token = \"{token}\"\n{extra}",
                base,
                dir.path().join("state").display()
            ),
        )
        .unwrap();
        Agent { dir, config }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(binary("fleetops-agent"));
        c.arg("--config").arg(&self.config).args(args);
        c.current_dir(self.dir.path());
        c
    }

    /// Starts `args` in the background, its output discarded; killed when dropped.
    pub fn spawn(&self, args: &[&str]) -> Guard {
        Guard(
            self.command(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    /// As [`Agent::spawn`], leading a process group of its own: dropping it kills the agent
    /// and every process it started (its hooks, its command), as a power cut does.
    pub fn spawn_group(&self, args: &[&str]) -> crate::process::GroupGuard {
        crate::process::GroupGuard::spawn(
            self.command(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
    }

    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn identity(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.state().join("device.json")).unwrap()).unwrap()
    }
}
