//! The NATS server binary (Debian's `nats-server`, which `scripts/test` installs).

use std::path::{Path, PathBuf};

/// `nats-server` from `PATH`, or Debian's `/usr/sbin/nats-server`.
pub fn binary() -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("nats-server");
        if p.exists() {
            return p;
        }
    }
    let debian = PathBuf::from("/usr/sbin/nats-server");
    assert!(
        debian.exists(),
        "nats-server is needed (Debian's nats-server, which scripts/test installs)"
    );
    debian
}
