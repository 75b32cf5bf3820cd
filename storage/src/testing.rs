//! This crate's store tests on each engine. A test that opens a store is written once as a
//! plain function, named to [`on_each_engine!`] beside it, and runs twice, on sled and on PostgreSQL: a private cluster the test
//! process starts (Debian's `postgresql`; the harness the integration tests use), with a
//! database per data directory cloned from a migrated template, so a test that reopens its
//! directory finds its records again.
//!
//! Tests of what only the embedded store has (sled's flush and crash recovery, the payload
//! log's journal, offline backups) stay plain `#[test]`s and say so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::Cell;
use std::path::Path;

use crate::{DatabaseConfig, Store};

use fleetops_testkit::postgres as cluster;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Engine {
    Sled,
    Postgres,
}

thread_local! {
    static ENGINE: Cell<Engine> = const { Cell::new(Engine::Sled) };
}

/// Runs `test` with stores opened on `engine`.
pub(crate) fn on(engine: Engine, test: impl FnOnce()) {
    ENGINE.set(engine);
    test();
}

/// The engine of the test running on this thread.
pub(crate) fn engine() -> Engine {
    ENGINE.get()
}

/// The database configuration of a store in `dir` on this test's engine.
pub(crate) fn database(dir: &Path) -> DatabaseConfig {
    match engine() {
        Engine::Sled => DatabaseConfig::default(),
        Engine::Postgres => DatabaseConfig {
            url: cluster::database_for(dir),
            ..DatabaseConfig::default()
        },
    }
}

/// A store in `dir` on this test's engine.
pub(crate) fn open(dir: &Path) -> Store {
    Store::open_on(dir, std::time::Duration::ZERO, &database(dir)).unwrap()
}

/// Two stores on one PostgreSQL database, as two servers sharing it see it.
pub(crate) fn two_servers(dir: &Path) -> (Store, Store) {
    let db = DatabaseConfig {
        url: cluster::database_for(dir),
        shared: true,
        ..DatabaseConfig::default()
    };
    let second = dir.join("second");
    let a = Store::open_on(dir, std::time::Duration::ZERO, &db).unwrap();
    let b = Store::open_on(&second, std::time::Duration::ZERO, &db).unwrap();
    (a, b)
}

/// Runs the test function `name` (beside it, `fn name()`) once on each engine, as
/// `name::sled` and `name::postgres`.
macro_rules! on_each_engine {
    ($name:ident) => {
        mod $name {
            #[test]
            fn sled() {
                $crate::testing::on($crate::testing::Engine::Sled, super::$name)
            }

            #[test]
            fn postgres() {
                $crate::testing::on($crate::testing::Engine::Postgres, super::$name)
            }
        }
    };
}
pub(crate) use on_each_engine;
