//! The test server and a small JSON client.

use std::time::Duration;

use fleetops::config::{Config, TierFile};
use fleetops::startup::{self, Running};
use fleetops_actors::views::Bootstrapped;
use reqwest::{Method, StatusCode, header::HeaderMap};
use serde_json::{Value, json};

pub const ADMIN_PASSWORD: &str = "admin-password";
pub const JWT_SECRET: &str = "test-jwt-secret-that-is-long-enough-0123456789";

pub struct Srv {
    pub base: String,
    pub running: Option<Running>,
    pub admin: Bootstrapped,
    pub http: reqwest::Client,
    pub _dir: tempfile::TempDir,
}

/// A server with limits high enough that tests never meet them by accident.
/// Every test ends with the list indexes checked against the records, so a write path that
/// forgets a list, or a count that drifts, fails the test that took it.
impl Drop for Srv {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        if let Some(r) = &self.running {
            let diffs = r
                .runtime
                .store()
                .verify_lists()
                .unwrap_or_else(|e| vec![e.to_string()]);
            assert!(
                diffs.is_empty(),
                "list indexes disagree with the records: {diffs:?}"
            );
            if crate::backend::backend().blobs_on_s3() {
                let local: Vec<_> = walk(self._dir.path())
                    .into_iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "seg"))
                    .collect();
                assert!(local.is_empty(), "segments in local files: {local:?}");
            }
            if crate::backend::backend().seals_every_batch() {
                // Kept until the seals are checked after the test: a seal still running
                // writes there.
                let dir = std::mem::replace(&mut self._dir, tempfile::tempdir().unwrap());
                KEPT.with_borrow_mut(|v| v.push(dir));
            }
        }
    }
}

thread_local! {
    /// The runtimes of the servers this test started, on a backend that seals every batch.
    static SEALING: std::cell::RefCell<Vec<fleetops_actors::Runtime>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

thread_local! {
    /// The data directories of the servers of this test that have stopped, until then.
    static KEPT: std::cell::RefCell<Vec<tempfile::TempDir>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

fn watch_sealing(running: &Running) {
    if crate::backend::backend().seals_every_batch() {
        SEALING.with_borrow_mut(|v| v.push(running.runtime.clone()));
    }
}

/// Run after a test on a backend that seals every batch at once: no seal failed, and the
/// test's batches were sealed (a failed seal is logged and leaves its batches answering
/// unsealed, so the test would have proved nothing about sealed chunks). On the test's
/// runtime, after the test, since a seal's blob-store writes need it.
pub async fn assert_sealing_held() {
    use fleetops_actors::counters::Counters;
    for rt in SEALING.with_borrow_mut(std::mem::take) {
        let c = rt.counters.clone();
        let done = crate::common::eventually(20, || {
            let (rt, c) = (rt.clone(), c.clone());
            async move {
                let owed = rt
                    .store()
                    .sessions_owed_seal(i64::MAX, 1)
                    .map_or(1, |s| s.len());
                Counters::get(&c.log_lines) == 0
                    || Counters::get(&c.log_batches_sealed) > 0
                    || owed == 0
            }
        })
        .await;
        assert!(
            done,
            "{} lines ingested and no batch sealed ({} seals failed)",
            Counters::get(&c.log_lines),
            Counters::get(&c.log_seals_failed)
        );
        assert_eq!(
            Counters::get(&c.log_seals_failed),
            0,
            "a seal failed (the server's log says why)"
        );
    }
    KEPT.with_borrow_mut(Vec::clear);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The bucket of the server on `dir` (one per data directory, so a restart finds its blobs).
fn bucket_for(dir: &std::path::Path) -> String {
    static BUCKETS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, String>>,
    > = std::sync::OnceLock::new();
    let mut known = BUCKETS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    known
        .entry(dir.to_path_buf())
        .or_insert_with(|| {
            let bucket = format!("t{}", uuid::Uuid::new_v4().simple());
            fleetops_testkit::moto::create_bucket(fleetops_testkit::moto::shared(), &bucket);
            bucket
        })
        .clone()
}

pub async fn start() -> Srv {
    start_with(|_| {}).await
}

pub async fn start_with(f: impl FnOnce(&mut Config)) -> Srv {
    let dir = tempfile::tempdir().unwrap();
    let cfg = test_config(&dir, f);
    let running = startup::start(cfg).await.unwrap();
    watch_sealing(&running);
    let admin = running
        .initial
        .clone()
        .expect("first start creates the admin");
    Srv {
        base: format!("http://{}", running.addr),
        running: Some(running),
        admin,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        _dir: dir,
    }
}

pub(crate) fn test_config(dir: &tempfile::TempDir, f: impl FnOnce(&mut Config)) -> Config {
    let mut cfg = Config {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("data"),
        ..Config::default()
    };
    cfg.admin.password = ADMIN_PASSWORD.into();
    // The tests' quotas and limits are the `free` tier's, set per test.
    cfg.admin.tier = "free".into();
    cfg.auth.jwt_secret = JWT_SECRET.into();
    for tier in ["free", "personal", "team", "enterprise"] {
        cfg.tiers.insert(
            tier.into(),
            TierFile {
                requests_per_minute: Some(1_000_000),
                storage_bytes: None,
            },
        );
    }
    if crate::backend::backend().seals_every_batch() {
        cfg.logs.seal_lines = 1;
        // A seal left for later (every place taken, a reader holding the chunks) runs at the
        // next pass, within a second or two.
        cfg.logs.seal_age_seconds = 1;
        cfg.supervision.housekeeping_seconds = 1;
    }
    if crate::backend::on_postgres() {
        cfg.database.url = crate::common::postgres::database_for(dir.path());
        cfg.database.max_connections = 8;
    }
    if crate::backend::backend().blobs_on_s3() {
        let endpoint = fleetops_testkit::moto::shared();
        cfg.storage.backend = "s3".into();
        cfg.storage.bucket = bucket_for(dir.path());
        cfg.storage.endpoint = endpoint.to_string();
        cfg.storage.region = "us-east-1".into();
        cfg.storage.access_key_id = "testing".into();
        cfg.storage.secret_access_key = "testing".into();
        cfg.storage.allow_http = true;
    }
    f(&mut cfg);
    cfg
}

/// The PostgreSQL cluster the tests on PostgreSQL keep their records in.
pub use fleetops_testkit::postgres;

/// The environment a `fleetops` process started on `dir` (whose data directory is
/// `dir/data`) needs besides: the database of the suite's backend.
pub fn backend_env(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    if crate::backend::on_postgres() {
        vec![("FLEETOPS_DATABASE_URL", postgres::database_for(dir))]
    } else {
        Vec::new()
    }
}

/// Every value the database of the server on `dir` holds, concatenated (to look for secrets
/// in the clear); nothing for the embedded store, whose bytes are the data directory's files.
pub fn database_bytes(dir: &std::path::Path) -> Vec<u8> {
    if !crate::backend::on_postgres() {
        return Vec::new();
    }
    postgres::values(&postgres::database_for(dir))
}

/// A data directory copied from `from` to `to`: on PostgreSQL, both name one database.
pub fn copied_backend(from: &std::path::Path, to: &std::path::Path) {
    if crate::backend::on_postgres() {
        postgres::share(from, to);
    }
}

/// The store of the server that ran on `dir` (stopped), opened offline.
pub fn open_store(dir: &std::path::Path) -> fleetops_storage::Store {
    let mut database = fleetops_storage::DatabaseConfig::default();
    if crate::backend::on_postgres() {
        database.url = postgres::database_for(dir);
    }
    fleetops_storage::Store::open_on(&dir.join("data"), Duration::ZERO, &database).unwrap()
}

/// A response: status, JSON body (Null when empty or not JSON), headers.
pub struct Resp {
    pub status: StatusCode,
    pub body: Value,
    pub headers: HeaderMap,
}

impl Resp {
    pub fn header(&self, k: &str) -> Option<&str> {
        self.headers.get(k).and_then(|v| v.to_str().ok())
    }

    /// Asserts the contract's error envelope with this status.
    #[track_caller]
    pub fn assert_error(&self, status: u16) -> &str {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.body);
        assert_eq!(
            self.body["status_code"],
            json!(status),
            "body: {}",
            self.body
        );
        self.body["detail"].as_str().expect("detail is a string")
    }
}

impl Srv {
    /// The runtime of the in-process server (fault injection, the clock, the store).
    pub fn rt(&self) -> fleetops_actors::Runtime {
        self.running.as_ref().unwrap().runtime.clone()
    }

    /// The keys of the log segments in this server's bucket (on `SealedS3`; none elsewhere).
    pub async fn segment_keys(&self) -> Vec<String> {
        if !crate::backend::backend().blobs_on_s3() {
            return Vec::new();
        }
        let url = format!(
            "{}/{}?list-type=2&prefix={}",
            fleetops_testkit::moto::shared(),
            bucket_for(self._dir.path()),
            fleetops_storage::sessions::segments::SEGMENT_PREFIX
        );
        let xml = self
            .http
            .get(url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        xml.split("<Key>")
            .skip(1)
            .filter_map(|k| k.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }

    /// Waits until every batch of session `sid` is sealed, on a backend that seals every
    /// batch (at once otherwise), so that what follows reads sealed chunks.
    pub async fn sealed(&self, sid: u64) {
        if !crate::backend::backend().seals_every_batch() {
            return;
        }
        let rt = self.rt();
        let sealed = crate::common::eventually(20, || {
            let rt = rt.clone();
            async move {
                !rt.store()
                    .sessions_owed_seal(i64::MAX, usize::MAX)
                    .unwrap()
                    .contains(&sid)
            }
        })
        .await;
        assert!(sealed, "session {sid} still holds unsealed batches");
    }

    /// The id of project `slug` of organization `default`.
    pub fn project_id(&self, slug: &str) -> u64 {
        let rt = &self.running.as_ref().unwrap().runtime;
        let org = rt.store().org_by_slug("default").unwrap().unwrap();
        rt.store()
            .project_by_slug(org.id, slug)
            .unwrap()
            .unwrap()
            .id
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn key(&self) -> &str {
        &self.admin.api_key
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        cred: Option<&str>,
        body: Option<Value>,
    ) -> Resp {
        let mut rb = self.http.request(method, self.url(path));
        if let Some(c) = cred {
            rb = rb.bearer_auth(c);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        into_resp(rb.send().await.unwrap()).await
    }

    pub async fn raw(&self, rb: reqwest::RequestBuilder) -> Resp {
        into_resp(rb.send().await.unwrap()).await
    }

    pub async fn get(&self, path: &str, cred: &str) -> Resp {
        self.send(Method::GET, path, Some(cred), None).await
    }
    pub async fn post(&self, path: &str, cred: &str, body: Value) -> Resp {
        self.send(Method::POST, path, Some(cred), Some(body)).await
    }
    pub async fn patch(&self, path: &str, cred: &str, body: Value) -> Resp {
        self.send(Method::PATCH, path, Some(cred), Some(body)).await
    }
    pub async fn delete(&self, path: &str, cred: &str) -> Resp {
        self.send(Method::DELETE, path, Some(cred), None).await
    }

    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// One unlabelled sample of `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} not on /metrics"))
    }

    pub async fn login(&self, email: &str, password: &str) -> String {
        let r = self
            .send(
                Method::POST,
                "/api/v1/auth/login",
                None,
                Some(json!({"email": email, "password": password})),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["access_token"].as_str().unwrap().to_string()
    }

    /// Creates a user (as the admin) and returns a JWT for it.
    pub async fn user(&self, email: &str) -> String {
        let r = self
            .post(
                "/api/v1/users",
                self.key(),
                json!({"email": email, "password": "pw-123456"}),
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.body);
        self.login(email, "pw-123456").await
    }

    /// A JWT for a new user who is a member of organization `default` with `role`.
    pub async fn member_key(&self, role: &str) -> String {
        let email = format!("{role}-{}@example.com", uuid::Uuid::new_v4().simple());
        let jwt = self.user(&email).await;
        let r = self
            .post(
                "/api/v1/organizations/default/members",
                self.key(),
                json!({"email": email, "role": role}),
            )
            .await;
        assert!(r.status.is_success(), "{}", r.body);
        jwt
    }

    /// Graceful stop; the temporary directory that holds the data directory outlives it.
    pub async fn stopped(mut self) -> tempfile::TempDir {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
        std::mem::replace(&mut self._dir, tempfile::tempdir().unwrap())
    }

    /// Graceful stop, then a new server on the same data directory (and a new port).
    pub async fn restart(self) -> Srv {
        self.restart_with(|_| {}).await
    }

    /// As `restart`, with the configuration changed by `f`.
    pub async fn restart_with(mut self, f: impl FnOnce(&mut Config)) -> Srv {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
        let cfg = test_config(&self._dir, f);
        // The previous instance released its lock on stop; allow its flusher thread a moment.
        let mut attempt = 0;
        let running = loop {
            match startup::start(cfg.clone()).await {
                Ok(r) => break r,
                Err(e) if attempt < 50 => {
                    attempt += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("restart failed: {e:#}"),
            }
        };
        assert!(running.initial.is_none(), "a restart creates no new admin");
        watch_sealing(&running);
        self.base = format!("http://{}", running.addr);
        self.running = Some(running);
        self
    }
}

async fn into_resp(r: reqwest::Response) -> Resp {
    let status = r.status();
    let headers = r.headers().clone();
    let bytes = r.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Resp {
        status,
        body,
        headers,
    }
}

/// Every file under `dir`, at any depth (none when it does not exist).
pub fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

pub use fleetops_testkit::eventually;

pub const DEV: &str = "/api/v1/organizations/default/projects/default";

/// `len` bytes of xorshift noise from `state`, which the next call continues: content that
/// does not compress, so archives and ZIPs of it stay as large as it is.
pub fn noise(state: &mut u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state as u8
        })
        .collect()
}
