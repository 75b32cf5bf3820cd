//! Blobs (artifacts, capsules) through `object_store`: the local filesystem under the data
//! directory by default. Keys are built from ids by callers, never from user-supplied names.
//!
//! Durability: a local put is followed by an fsync of the file and its directory, so a blob
//! acknowledged with 201 survives a crash like the records that point at it.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::buffered::BufWriter;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload, local::LocalFileSystem,
    path::Path as ObjPath,
};
use tokio::io::AsyncWriteExt;

use crate::{Result, StorageError};

/// `[storage]`: where blobs live, and how writes are committed.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// `local` (files under the data directory) or `s3` (any S3-compatible store).
    pub backend: String,
    pub bucket: String,
    /// e.g. `http://127.0.0.1:9000` for MinIO; empty: AWS.
    pub endpoint: String,
    pub region: String,
    /// Empty: taken from the standard `AWS_*` environment variables.
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Allow a plain-HTTP endpoint (local test servers).
    pub allow_http: bool,
    /// Group commit: how long the flusher waits after the first waiting writer before it
    /// fsyncs, so that more writers share the fsync (like PostgreSQL's `commit_delay`). 0:
    /// flush at once; writers that arrive during a flush share the next one anyway.
    pub commit_delay_us: u64,
    /// Start even when other accounts can read or write the data directory
    /// (`FLEETOPS_ALLOW_SHARED_DATA_DIR`); it holds the JWT signing key and the webhook
    /// secret, so by default such a start is refused.
    pub allow_shared_data_dir: bool,
    /// Below this many free bytes on the data directory's file system, requests that would
    /// write to it are refused (507); reads, exports and deletes go on. 0: no floor.
    pub min_free_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            backend: "local".into(),
            bucket: String::new(),
            endpoint: String::new(),
            region: "us-east-1".into(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
            allow_http: false,
            commit_delay_us: 0,
            allow_shared_data_dir: false,
            min_free_bytes: 256 * 1024 * 1024,
        }
    }
}

#[derive(Clone)]
pub struct BlobStore {
    inner: Arc<dyn ObjectStore>,
    /// The directory of the local backend (for fsync); `None` for remote stores.
    local_root: Option<PathBuf>,
    /// The S3 backend's URL signer (the local backend has none: fleetops signs its own links).
    signer: Option<Arc<dyn object_store::signer::Signer>>,
}

/// Parts of one streamed put written at once (object_store's default is 8, each a part's
/// size in memory).
pub const STREAM_PARTS_IN_FLIGHT: usize = 2;

/// Why a streamed put stopped.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error("the body exceeds {0} bytes")]
    TooLarge(u64),
    #[error("reading the body: {0}")]
    Body(std::io::Error),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl BlobStore {
    /// The configured backend; `data_dir/blobs` for the local one.
    pub fn from_config(cfg: &StorageConfig, data_dir: &Path) -> Result<Self> {
        match cfg.backend.as_str() {
            "local" => Self::local(&data_dir.join("blobs")),
            "s3" => {
                if cfg.bucket.is_empty() {
                    return Err(StorageError::Config(
                        "[storage] bucket is required for the s3 backend".into(),
                    ));
                }
                // A store that is down answers its callers within seconds (a read is 503 with
                // Retry-After), not after object_store's default three minutes of retries.
                let retry = object_store::RetryConfig {
                    max_retries: 3,
                    retry_timeout: std::time::Duration::from_secs(15),
                    ..Default::default()
                };
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&cfg.bucket)
                    .with_region(&cfg.region)
                    .with_allow_http(cfg.allow_http)
                    .with_retry(retry);
                if !cfg.endpoint.is_empty() {
                    b = b.with_endpoint(&cfg.endpoint);
                }
                if !cfg.access_key_id.is_empty() {
                    b = b
                        .with_access_key_id(&cfg.access_key_id)
                        .with_secret_access_key(&cfg.secret_access_key);
                }
                let s3 = Arc::new(b.build()?);
                Ok(Self {
                    inner: s3.clone(),
                    local_root: None,
                    signer: Some(s3),
                })
            }
            other => Err(StorageError::Config(format!(
                "[storage] backend must be \"local\" or \"s3\", not {other:?}"
            ))),
        }
    }

    /// Blobs as files under `dir` (created if missing, its entry durable: `sync` stops at
    /// the root).
    pub fn local(dir: &Path) -> Result<Self> {
        crate::create_dir_durable(dir)?;
        Ok(Self {
            inner: Arc::new(LocalFileSystem::new_with_prefix(dir)?),
            local_root: Some(dir.to_path_buf()),
            signer: None,
        })
    }

    /// The directory of the local backend; `None` for a remote store.
    pub fn local_root(&self) -> Option<&Path> {
        self.local_root.as_deref()
    }

    /// A presigned URL for one `PUT` (or `GET`) of `key`, valid for `ttl`; `None` on the local
    /// backend, which has no signer of its own.
    pub async fn presign(
        &self,
        put: bool,
        key: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<String>> {
        let Some(s) = &self.signer else {
            return Ok(None);
        };
        let method = if put {
            object_store::signer::Method::PUT
        } else {
            object_store::signer::Method::GET
        };
        let url = s.signed_url(method, &ObjPath::from(key), ttl).await?;
        Ok(Some(url.to_string()))
    }

    /// Whether the backend hands out its own presigned URLs.
    pub fn presigns(&self) -> bool {
        self.signer.is_some()
    }

    /// Whether the store answers now (the size of a key that does not exist), for readiness.
    pub async fn reachable(&self) -> Result<()> {
        self.size("readyz/probe").await.map(|_| ())
    }

    /// The size of a stored object, `None` when absent.
    pub async fn size(&self, key: &str) -> Result<Option<u64>> {
        match self.inner.head(&ObjPath::from(key)).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn put(&self, key: &str, bytes: Bytes) -> Result<()> {
        self.inner
            .put(&ObjPath::from(key), PutPayload::from_bytes(bytes))
            .await?;
        self.sync(key).await
    }

    /// The piece a streamed put buffers before it writes: S3's smallest multipart part
    /// (5 MiB); 1 MiB on the local backend.
    fn stream_part(&self) -> usize {
        match self.local_root {
            Some(_) => 1 << 20,
            None => 5 << 20,
        }
    }

    /// The most memory one streamed put holds: the piece it buffers and the parts it is
    /// writing ([`STREAM_PARTS_IN_FLIGHT`]). The edge counts it in the body budget.
    pub fn stream_buffer_bytes(&self) -> usize {
        self.stream_part() * (1 + STREAM_PARTS_IN_FLIGHT)
    }

    /// Streams a body into `key`, refusing more than `max` bytes. Returns the size.
    ///
    /// The object appears at `key` only whole (object_store writes a staging file, or a
    /// multipart upload, and renames or completes it at the end), so a failed stream is
    /// aborted and leaves whatever `key` held before: an upload link written once and then
    /// retried with a body that fails keeps the bytes it already acknowledged.
    pub async fn put_stream(
        &self,
        key: &str,
        mut body: BoxStream<'static, std::io::Result<Bytes>>,
        max: u64,
    ) -> std::result::Result<u64, PutError> {
        let path = ObjPath::from(key);
        let mut w = BufWriter::with_capacity(self.inner.clone(), path, self.stream_part())
            .with_max_concurrency(STREAM_PARTS_IN_FLIGHT);
        let mut size = 0u64;
        let outcome = async {
            while let Some(piece) = body.next().await {
                let piece = piece.map_err(PutError::Body)?;
                size += piece.len() as u64;
                if size > max {
                    return Err(PutError::TooLarge(max));
                }
                w.write_all(&piece)
                    .await
                    .map_err(|e| PutError::Storage(StorageError::Io(e)))?;
            }
            w.shutdown()
                .await
                .map_err(|e| PutError::Storage(StorageError::Io(e)))
        }
        .await;
        if let Err(e) = outcome {
            let _ = w.abort().await;
            return Err(e);
        }
        self.sync(key).await?;
        Ok(size)
    }

    /// fsync of a local blob and of every directory from its own up to the root: the store
    /// creates missing folders (a new session's `artifacts/{session}/`), and a folder's entry
    /// is only durable once its parent is synced too.
    async fn sync(&self, key: &str) -> Result<()> {
        let Some(root) = self.local_root.clone() else {
            return Ok(());
        };
        let file = root.join(key);
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::File::open(&file)?.sync_all()?;
            let mut dir = file.parent();
            while let Some(d) = dir {
                std::fs::File::open(d)?.sync_all()?;
                if d == root {
                    break;
                }
                dir = d.parent();
            }
            Ok(())
        })
        .await
        .map_err(|e| StorageError::Io(std::io::Error::other(e)))??;
        Ok(())
    }

    /// Writes `bytes` to `key` only if nothing is there yet (S3's `If-None-Match: *`; a local
    /// file created exclusively); a store that cannot make the condition writes it plainly
    /// (callers name such keys uniquely). `false` when the key already exists.
    pub async fn put_new(&self, key: &str, bytes: Bytes) -> Result<bool> {
        let path = ObjPath::from(key);
        let opts = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        match self
            .inner
            .put_opts(&path, PutPayload::from_bytes(bytes.clone()), opts)
            .await
        {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => return Ok(false),
            Err(object_store::Error::NotImplemented { .. }) => {
                self.inner.put(&path, PutPayload::from_bytes(bytes)).await?;
            }
            Err(e) => return Err(e.into()),
        }
        self.sync(key).await?;
        Ok(true)
    }

    /// The bytes of several ranges of `key`: ranges close together are fetched as one GET
    /// (`object_store`'s coalescing), the rest in parallel.
    pub async fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        Ok(self.inner.get_ranges(&ObjPath::from(key), ranges).await?)
    }

    /// The bytes of `range` of `key` (one ranged GET).
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        Ok(self.inner.get_range(&ObjPath::from(key), range).await?)
    }

    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        match self.inner.get(&ObjPath::from(key)).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The bytes of `range` (or all), as a stream.
    pub async fn stream(
        &self,
        key: &str,
        range: Option<Range<u64>>,
    ) -> Result<BoxStream<'static, std::io::Result<Bytes>>> {
        let opts = GetOptions {
            range: range.map(GetRange::Bounded),
            ..GetOptions::default()
        };
        let r = self.inner.get_opts(&ObjPath::from(key), opts).await?;
        Ok(r.into_stream().map_err(std::io::Error::other).boxed())
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.inner.delete(&ObjPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Copies `from` to `to` inside the store (S3: one server-side `CopyObject`, which copies
    /// one consistent version of the source; local: a hard link renamed into place), replacing
    /// whatever `to` held. `false` when `from` does not exist. A local copy is fsynced like a
    /// put.
    pub async fn copy(&self, from: &str, to: &str) -> Result<bool> {
        match self
            .inner
            .copy(&ObjPath::from(from), &ObjPath::from(to))
            .await
        {
            Ok(()) => {}
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.sync(to).await?;
        Ok(true)
    }

    /// The keys of every object under the folder `prefix` (whole path segments: `a/1` does
    /// not list `a/10/x`).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self
            .inner
            .list(Some(&ObjPath::from(prefix)))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await?)
    }

    /// The keys under the folder `prefix` as they are listed, one at a time (sweeps over the
    /// whole store never hold the listing in memory).
    pub fn keys(&self, prefix: &str) -> BoxStream<'_, Result<String>> {
        self.inner
            .list(Some(&ObjPath::from(prefix)))
            .map_ok(|m| m.location.to_string())
            .map_err(StorageError::from)
            .boxed()
    }

    /// Every key under `prefix` with when the store wrote it, on the store's own clock (Unix
    /// ms).
    pub fn keys_written(&self, prefix: &str) -> BoxStream<'_, Result<(String, i64)>> {
        self.inner
            .list(Some(&ObjPath::from(prefix)))
            .map_ok(|m| (m.location.to_string(), m.last_modified.timestamp_millis()))
            .map_err(StorageError::from)
            .boxed()
    }

    /// The store's own clock now (Unix ms): the time it stamps on a small probe written now
    /// (and deleted again), so ages of stored objects are judged on one clock, whichever node
    /// wrote them.
    pub async fn clock_ms(&self) -> Result<i64> {
        let key = ObjPath::from("readyz/clock");
        self.inner
            .put(&key, PutPayload::from_bytes(Bytes::new()))
            .await?;
        let at = self
            .inner
            .head(&key)
            .await?
            .last_modified
            .timestamp_millis();
        match self.inner.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(at),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes every object under the folder `prefix`, as [`Self::list`]; how many went.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<usize> {
        let keys = self.list(prefix).await?;
        for k in &keys {
            self.delete(k).await?;
        }
        Ok(keys.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_round_trip_stream_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let b = BlobStore::local(dir.path()).unwrap();
        b.put("a/1", Bytes::from_static(b"hello")).await.unwrap();
        assert_eq!(
            b.get("a/1").await.unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        let s: Vec<Bytes> = b
            .stream("a/1", Some(1..3))
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(s.concat(), b"el");
        b.delete("a/1").await.unwrap();
        assert!(b.get("a/1").await.unwrap().is_none());

        let body = futures::stream::iter(vec![
            Ok(Bytes::from_static(b"abc")),
            Ok(Bytes::from_static(b"def")),
        ])
        .boxed();
        assert_eq!(b.put_stream("s/1", body, 10).await.unwrap(), 6);
        assert_eq!(
            b.get("s/1").await.unwrap().unwrap(),
            Bytes::from_static(b"abcdef")
        );
        let body = futures::stream::iter(vec![Ok(Bytes::from_static(b"abcdef"))]).boxed();
        assert!(matches!(
            b.put_stream("s/2", body, 5).await,
            Err(PutError::TooLarge(5))
        ));
        assert!(b.get("s/2").await.unwrap().is_none());
    }

    #[tokio::test]
    async fn local_copy_and_delete_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let b = BlobStore::local(dir.path()).unwrap();
        b.put("c/1/1", Bytes::from_static(b"one")).await.unwrap();
        assert!(b.copy("c/1/1", "c/1/sealed/1/x").await.unwrap());
        b.put("c/1/1", Bytes::from_static(b"two")).await.unwrap();
        assert_eq!(
            b.get("c/1/sealed/1/x").await.unwrap().unwrap(),
            Bytes::from_static(b"one")
        );
        assert!(!b.copy("c/1/missing", "c/1/sealed/1/y").await.unwrap());
        b.put("c/1/sealed/10/z", Bytes::from_static(b"keep"))
            .await
            .unwrap();
        assert_eq!(
            b.list("c/1/sealed/1").await.unwrap(),
            vec!["c/1/sealed/1/x".to_string()]
        );
        assert_eq!(b.delete_prefix("c/1/sealed/1").await.unwrap(), 1);
        assert!(b.get("c/1/sealed/1/x").await.unwrap().is_none());
        assert!(b.get("c/1/sealed/10/z").await.unwrap().is_some());
        assert_eq!(b.delete_prefix("c/9/nothing").await.unwrap(), 0);
    }
}
