//! Blobs (artifacts, capsules) through `object_store`: the local filesystem under the data
//! directory by default. Keys are built from ids by callers, never from user-supplied names.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use object_store::{
    ObjectStore, ObjectStoreExt, PutPayload, local::LocalFileSystem, path::Path as ObjPath,
};

use crate::Result;

#[derive(Clone)]
pub struct BlobStore {
    inner: Arc<dyn ObjectStore>,
}

impl BlobStore {
    /// Blobs as files under `dir` (created if missing).
    pub fn local(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            inner: Arc::new(LocalFileSystem::new_with_prefix(dir)?),
        })
    }

    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<()> {
        self.inner
            .put(&ObjPath::from(key), PutPayload::from_bytes(bytes))
            .await?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        match self.inner.get(&ObjPath::from(key)).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.inner.delete(&ObjPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let b = BlobStore::local(dir.path()).unwrap();
        b.put("a/1", Bytes::from_static(b"hello")).await.unwrap();
        assert_eq!(
            b.get("a/1").await.unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        b.delete("a/1").await.unwrap();
        assert!(b.get("a/1").await.unwrap().is_none());
    }
}
