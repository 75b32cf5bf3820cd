//! A private PostgreSQL cluster for tests and benches: Debian's server programs, a temporary
//! directory, a free port; `initdb` refuses root, so as root the cluster is the `postgres`
//! account's. Used by the suites on the PostgreSQL backend, the storage crate's engine
//! tests and the benches.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

pub struct Cluster {
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
    as_postgres: bool,
    /// Whether the server fsyncs (benches measure durable figures; tests never lose power).
    fsync: bool,
}

/// Debian keeps the server's programs out of `PATH`.
fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    found.retain(|p| p.join("initdb").exists());
    found.sort();
    found
        .pop()
        .expect("PostgreSQL's server (Debian's postgresql, installed by the README's test command)")
}

fn cmd(c: &Cluster, program: &str) -> Command {
    let path = c.bin.join(program);
    if c.as_postgres {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(path);
        cmd
    } else {
        Command::new(path)
    }
}

fn run(mut cmd: Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The cluster every test of the process shares.
fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| Cluster::start_new(false))
}

impl Cluster {
    /// A test's cluster of its own (fsync off), as [`Cluster::start_new`] starts it.
    pub fn private() -> Cluster {
        Cluster::start_new(false)
    }

    /// A private cluster in a temporary directory, started, and stopped and removed when the
    /// test process ends (a shell watches it); `initdb` refuses root, so as root the cluster
    /// is the `postgres` account's.
    pub fn start_new(fsync: bool) -> Cluster {
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let dir = std::env::temp_dir().join(format!(
            "fleetops-pg-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Cluster {
            port: std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port(),
            bin: bin_dir(),
            as_postgres,
            dir,
            fsync,
        };
        if as_postgres {
            run(
                {
                    let mut x = Command::new("chown");
                    x.args(["postgres:postgres"]).arg(&c.dir);
                    x
                },
                "chown",
            );
        }
        let mut init = cmd(&c, "initdb");
        init.args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            // A minimal system may have no locales generated.
            "--no-locale",
            "--no-sync",
            "-D",
        ])
        .arg(c.dir.join("data"));
        run(init, "initdb");
        c.start();
        let me = std::process::id();
        let stop = format!(
            "while kill -0 {me} 2>/dev/null; do sleep 1; done; {} {}/pg_ctl -D {}/data -m immediate stop >/dev/null 2>&1; rm -rf {}",
            if c.as_postgres {
                "runuser -u postgres --"
            } else {
                ""
            },
            c.bin.display(),
            c.dir.display(),
            c.dir.display()
        );
        let mut watcher = Command::new("sh").args(["-c", &stop]).spawn().expect("sh");
        std::thread::spawn(move || watcher.wait());
        c
    }

    /// Starts the server (again), waiting until it accepts connections.
    pub fn start(&self) {
        // Tests never lose power: fsync off for their speed; commits stay synchronous
        // (fleetops refuses a server that has them off).
        let durability = if self.fsync {
            "-c fsync=on -c full_page_writes=on"
        } else {
            "-c fsync=off -c full_page_writes=off"
        };
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 {durability} \
             -c shared_buffers=128MB",
            self.port,
            self.dir.display()
        );
        let mut start = cmd(self, "pg_ctl");
        start
            .args(["-D"])
            .arg(self.dir.join("data"))
            .args(["-w", "-l"])
            .arg(self.dir.join("log"))
            .args(["-o", &opts, "start"]);
        run(start, "pg_ctl start");
    }

    /// Stops the server at once (`-m immediate`: no shutdown checkpoint, as in a crash).
    pub fn stop(&self) {
        let mut stop = cmd(self, "pg_ctl");
        stop.args(["-D"])
            .arg(self.dir.join("data"))
            .args(["-w", "-m", "immediate", "stop"]);
        run(stop, "pg_ctl stop");
    }

    /// A new empty database on this cluster, migrated: its URL.
    pub fn database(&self) -> String {
        let name = format!("t{}", uuid::Uuid::new_v4().simple());
        psql(self, "postgres", &format!("CREATE DATABASE {name}"));
        let u = url(self, &name);
        fleetops_storage::migrate::prepare_postgres(&u).unwrap();
        u
    }
}

/// `psql` running `sql` in database `db` of cluster `c`, stopping at the first error.
fn psql_cmd(c: &Cluster, db: &str, sql: &str) -> Command {
    let mut p = Command::new(c.bin.join("psql"));
    p.args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(&c.dir)
        .args([
            "-p",
            &c.port.to_string(),
            "-U",
            "postgres",
            "-d",
            db,
            "-c",
            sql,
        ]);
    p
}

fn psql(c: &Cluster, db: &str, sql: &str) -> String {
    run(psql_cmd(c, db, sql), sql)
}

/// Every value of every table of the database at `url`, raw.
pub fn values(url: &str) -> Vec<u8> {
    let c = cluster();
    let db = url.rsplit('/').next().unwrap();
    let sql = "COPY (SELECT v FROM fleetops_records UNION ALL SELECT v FROM fleetops_logs \
               UNION ALL SELECT v FROM fleetops_meta) TO STDOUT WITH (FORMAT binary)";
    let out = psql_cmd(c, db, sql).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn url(c: &Cluster, db: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{}/{db}", c.port)
}

/// The migrated template every test's database is cloned from.
fn template() -> &'static str {
    static TEMPLATE: OnceLock<&'static str> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let c = cluster();
        psql(c, "postgres", "CREATE DATABASE fleetops_template");
        fleetops_storage::migrate::prepare_postgres(&url(c, "fleetops_template")).unwrap();
        "fleetops_template"
    })
}

type Known = std::sync::Mutex<std::collections::HashMap<PathBuf, String>>;
static DATABASES: OnceLock<Known> = OnceLock::new();

/// The database of the server whose files are under `dir`, made on first use (a restart
/// on the same directory finds its records again): its URL.
pub fn database_for(dir: &std::path::Path) -> String {
    let mut known = DATABASES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    known
        .entry(dir.to_path_buf())
        .or_insert_with(database)
        .clone()
}

/// Makes the server on `to` use the database of the one on `from` (a data directory
/// copied elsewhere still names the same database).
pub fn share(from: &std::path::Path, to: &std::path::Path) {
    let url = database_for(from);
    DATABASES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(to.to_path_buf(), url);
}

/// A new database cloned from the migrated template: its URL.
fn database() -> String {
    let tmpl = template();
    let c = cluster();
    let name = format!("t{}", uuid::Uuid::new_v4().simple());
    let sql = format!("CREATE DATABASE {name} TEMPLATE {tmpl}");
    // The template's last connections may take a moment to go.
    for _ in 0..100 {
        let out = psql_cmd(c, "postgres", &sql).output().unwrap();
        if out.status.success() {
            return url(c, &name);
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("being accessed by other users"),
            "{sql}: {err}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{sql}: the template stayed in use");
}
