//! Sections: what lets one writer at a time decide from what it read, across every server
//! sharing a database, where an actor is that one writer within a server (a project's
//! records: devices, groups, packages, rules).
//!
//! [`Store::section`] enters the section of a name and answers with an [`Section`]; its
//! [`Section::run`] runs a synchronous closure whose writes are all fenced by the section.
//! On a store of one server (sled, or PostgreSQL not shared) it enters at once and guards
//! nothing: the actor alone is the one writer.
//!
//! On a shared database:
//! - **Exclusion**: a PostgreSQL advisory lock named by the section, tried once on one
//!   connection per server (the common case: nobody holds it); when another server holds
//!   it, waited for in PostgreSQL's queue on a connection of its own (closed, giving the
//!   lock back, when the section is left), so servers take turns however busy one of them
//!   keeps the section; after [`ENTER_WITHIN`] the caller is answered 503 (`Unavailable`).
//! - **Fencing**: the section's counter (a record) is read once the lock is held, and every
//!   write made inside `run` is guarded on it still holding that value and moves it on. A
//!   server whose lock was lost (its connection broke) cannot write over what another wrote
//!   meanwhile: its write fails whole, as 503 (`Unavailable`), nothing written.
//! - **Caches**: when the counter moved since this server last wrote or read it, another
//!   server wrote in the section, and this server forgets what it caches of the section's
//!   records ([`Cached`]) before the closure reads them (announcements over the bus may still
//!   be on their way).
//!
//! Writes made outside [`Store::apply`] (a session's log chunks and counters) are excluded
//! by the lock but not fenced by the counter.

use std::cell::RefCell;
use std::time::Duration;

use crate::engine::Bytes;
use crate::engine::pg::Advisory;
use crate::{Result, StorageError, Store, Writes, codec, keys};

/// How long entering a section may wait for another server to leave it.
pub const ENTER_WITHIN: Duration = Duration::from_secs(10);

thread_local! {
    /// The section whose closure runs on this thread: its counter's key and value as read.
    static CURRENT: RefCell<Option<(Vec<u8>, Option<Bytes>)>> = const { RefCell::new(None) };
}

/// A section entered ([`Store::section`]); left when dropped.
pub struct Section {
    store: Store,
    name: String,
    /// The lock this holds (shared databases only).
    lock: Option<Lock>,
    /// The counter's key and value as read (shared databases only).
    counter: Option<(Vec<u8>, Option<Bytes>)>,
}

/// What a server may hold cached of the records written in a section, forgotten when
/// another server wrote in it.
#[derive(Debug, Clone, Copy)]
pub enum Cached {
    /// A project's own records (its groups and capsules).
    Project(u64),
    /// Anything (accounts, organizations, projects).
    Everything,
}

impl Store {
    /// Enters section `name`, whose writes may change what `cached` says: at once on a store
    /// of one server; on a shared database once no other server is in it (503 after
    /// [`ENTER_WITHIN`]).
    pub async fn section(&self, name: &str, cached: Cached) -> Result<Section> {
        let mut section = Section {
            store: self.clone(),
            name: name.to_string(),
            lock: None,
            counter: None,
        };
        let crate::engine::Db::Pg(pg) = &self.inner.db else {
            return Ok(section);
        };
        if !self.inner.shared {
            return Ok(section);
        }
        let key = lock_key(name);
        // A try on the server's lock connection, the common case; else a turn in
        // PostgreSQL's queue on a connection of its own (a server whose tries kept missing
        // would otherwise wait on another that takes the lock again and again).
        if pg.advisory(key, Advisory::Take).await? {
            // From here the drop gives the lock back, whatever happens next.
            section.lock = Some(Lock::Shared(key));
        } else {
            match pg.advisory_wait(key, ENTER_WITHIN).await? {
                Some(held) => section.lock = Some(Lock::Own(held)),
                None => {
                    return Err(StorageError::Unavailable(format!(
                        "another server has been writing in {name} for {}s",
                        ENTER_WITHIN.as_secs()
                    )));
                }
            }
        }
        let counter_key = keys::section(name);
        let read = self.inner.records.get_async(&counter_key).await?;
        let seen = self.inner.sections.get(name).map(|v| v.clone());
        if seen.as_ref() != Some(&read) {
            match cached {
                Cached::Project(pid) => self.inner.cache.clear_project(pid),
                Cached::Everything => self.inner.cache.clear(),
            }
            self.inner.sections.insert(name.to_string(), read.clone());
        }
        section.counter = Some((counter_key, read));
        Ok(section)
    }
}

impl Section {
    /// Runs `f`, every write of which (through [`Store::apply`]) is fenced by this section.
    pub fn run<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let Some(counter) = self.counter.take() else {
            return f();
        };
        /// Takes the section off the thread however `f` ends, a panic included.
        struct Current<'a>(&'a mut Section);
        impl Drop for Current<'_> {
            fn drop(&mut self) {
                if let Some(c) = CURRENT.with(|c| c.borrow_mut().take()) {
                    self.0
                        .store
                        .inner
                        .sections
                        .insert(self.0.name.clone(), c.1.clone());
                    self.0.counter = Some(c);
                }
            }
        }
        CURRENT.with(|c| *c.borrow_mut() = Some(counter));
        let _current = Current(self);
        f()
    }
}

/// How a section holds its lock.
enum Lock {
    /// On the server's lock connection, by key.
    Shared(i64),
    /// On a connection of its own, closed when dropped.
    Own(#[allow(dead_code)] crate::engine::pg::HeldLock),
}

impl Drop for Section {
    fn drop(&mut self) {
        let (Some(Lock::Shared(key)), crate::engine::Db::Pg(pg)) =
            (self.lock.take(), &self.store.inner.db)
        else {
            // An own connection's lock goes with it.
            return;
        };
        // Given back by a task on the engine's runtime, which runs whether or not its answer
        // is awaited. A later take of the same key by this server stacks on the lock
        // meanwhile, so the order of the two does not matter. Should the give-back fail, the
        // lock goes with the connection, which a failed statement usually means is gone.
        drop(pg.advisory(key, Advisory::Give));
    }
}

/// The advisory lock's key of section `name`: the same on every server (64-bit FNV-1a).
pub(crate) fn lock_key(name: &str) -> i64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    i64::from_ne_bytes(h.to_ne_bytes())
}

/// The section whose `run` is on this thread: its counter's key and value as read.
pub(crate) fn current() -> Option<(Vec<u8>, Option<Bytes>)> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Guards `w` on the counter still holding what the section read, and moves it on: the
/// counter's next value.
pub(crate) fn fence(w: &mut Writes, (key, read): &(Vec<u8>, Option<Bytes>)) -> Result<Bytes> {
    let n = read
        .as_deref()
        .map(codec::decode::<u64>)
        .transpose()?
        .unwrap_or(0);
    let next = codec::encode(&(n + 1))?;
    let expected = read.clone();
    w.guard(key.clone(), FENCED, move |v| v == expected.as_deref());
    w.0.insert(key.clone(), next.clone());
    Ok(next.into())
}

/// The word of the conflict a fenced write meets when another server wrote in the section.
pub(crate) const FENCED: &str = "section";

/// After a fenced write committed: the counter now holds `next`.
pub(crate) fn moved(next: Bytes) {
    CURRENT.with(|c| {
        if let Some((_, read)) = c.borrow_mut().as_mut() {
            *read = Some(next);
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use crate::{StorageError, Writes, keys};

    fn write(store: &crate::Store, v: u64) -> crate::Result<()> {
        let mut w = Writes::new();
        w.put(b"x".to_vec(), &v)?;
        store.apply(w)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_server_at_a_time_is_in_a_section() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = crate::testing::two_servers(dir.path());
        let held = a
            .section("project/1", super::Cached::Project(1))
            .await
            .unwrap();
        let entering = tokio::spawn(async move {
            b.section("project/1", super::Cached::Project(1))
                .await
                .map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !entering.is_finished(),
            "B entered while A was in the section"
        );
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), entering)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_in_a_section_another_server_wrote_in_meanwhile_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = crate::testing::two_servers(dir.path());
        let mut s = a
            .section("project/1", super::Cached::Project(1))
            .await
            .unwrap();
        s.run(|| write(&a, 1)).unwrap();
        s.run(|| write(&a, 2)).unwrap();
        // B writes in the section without A's lock (A's connection broke, say).
        let mut w = Writes::new();
        w.put(keys::section("project/1"), &7u64).unwrap();
        b.apply(w).unwrap();
        let r = s.run(|| write(&a, 3));
        assert!(matches!(r, Err(StorageError::Unavailable(_))), "{r:?}");
        assert_eq!(a.get::<u64>(b"x").unwrap(), Some(2));
        // Outside a section, writes are not fenced.
        write(&a, 4).unwrap();
        assert_eq!(a.get::<u64>(b"x").unwrap(), Some(4));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_section_of_an_embedded_store_is_entered_at_once_and_fences_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::Store::open(dir.path()).unwrap();
        let mut s1 = store
            .section("project/1", super::Cached::Project(1))
            .await
            .unwrap();
        let mut s2 = store
            .section("project/1", super::Cached::Project(1))
            .await
            .unwrap();
        s1.run(|| write(&store, 1)).unwrap();
        s2.run(|| write(&store, 2)).unwrap();
        assert_eq!(store.get::<u64>(b"x").unwrap(), Some(2));
    }
}
