//! Server-wide values generated once and kept in the data directory (secrets, markers).

use crate::{Result, Store};

impl Store {
    /// Returns the value stored under `name`, creating it with `make` the first time.
    pub fn meta_get_or_init(&self, name: &str, make: impl FnOnce() -> Vec<u8>) -> Result<Vec<u8>> {
        let meta = &self.inner.meta;
        if let Some(v) = meta.get(name.as_bytes())? {
            return Ok(v.to_vec());
        }
        let v = make();
        // compare_and_swap so that two racing initialisers agree on one value.
        if meta.compare_and_swap(name.as_bytes(), None, Some(&v))? {
            return Ok(v);
        }
        // Another initialiser won: its value, which is never removed.
        Ok(meta.get(name.as_bytes())?.map(|c| c.to_vec()).unwrap_or(v))
    }

    pub fn meta_get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.inner.meta.get(name.as_bytes())?.map(|v| v.to_vec()))
    }

    pub fn meta_put(&self, name: &str, value: &[u8]) -> Result<()> {
        self.inner.meta.insert(name.as_bytes(), value)?;
        Ok(())
    }

    /// Runs a one-time migration unless `marker` says it ran: the work, then the marker, then
    /// a flush. Work that a crash cuts short runs again whole, so it must be idempotent.
    pub(crate) fn once(&self, marker: &str, work: impl FnOnce() -> Result<()>) -> Result<()> {
        if self.meta_get(marker)?.is_some() {
            return Ok(());
        }
        work()?;
        self.meta_put(marker, b"1")?;
        self.flush_blocking()
    }

    pub fn meta_remove(&self, name: &str) -> Result<()> {
        self.inner.meta.remove(name.as_bytes())?;
        Ok(())
    }
}
