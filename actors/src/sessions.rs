//! [`SessionsHandle`]: the way in for sessions and their logs.
//!
//! Writers: a session's record (status, tags) belongs to its project's actor; its log chunks
//! and counters to its own SessionActor while it is active. Completion seals the session
//! actor (no more appends), then ends the record through the project actor, then stops the
//! session actor. Reads (lists, details, log queries) go to the store directly; log queries run
//! on a blocking thread since they scan.

use std::collections::BTreeMap;
use std::sync::Arc;

use fleetops_storage::blobs::PutError;
use fleetops_storage::{Artifact, BlobStore, Session, SessionStatus, Store};
use futures::stream::BoxStream;

use crate::clock::{now_ms, write_ms};
use crate::config::SessionsConfig;
use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::live::{self, Subscription};
use crate::logs::{self, LogFilter, RawEntry};
use crate::project::ProjectMsg;
use crate::project::handle::ProjectsHandle;
use crate::rules;
use crate::session::{Replay, SessionActor, SessionMsg};
use crate::views::{
    Accepted, ArtifactView, Items, LogPage, Page, PageReq, SessionDetail, SessionItem,
};

/// Filters of the session list (`since` inclusive, `until` exclusive, on `started_at`).
#[derive(Debug, Default, Clone)]
pub struct SessionFilter {
    pub device_id: Option<u64>,
    pub status: Option<SessionStatus>,
    pub since: Option<i64>,
    pub until: Option<i64>,
}

pub fn parse_status(s: &str) -> Option<SessionStatus> {
    match s {
        "active" => Some(SessionStatus::Active),
        "completed" => Some(SessionStatus::Completed),
        "failed" => Some(SessionStatus::Failed),
        _ => None,
    }
}

/// How a session ends (the body of `complete`).
#[derive(Debug, Clone, Copy)]
pub enum EndStatus {
    Completed,
    Failed,
}

impl From<EndStatus> for SessionStatus {
    fn from(e: EndStatus) -> Self {
        match e {
            EndStatus::Completed => SessionStatus::Completed,
            EndStatus::Failed => SessionStatus::Failed,
        }
    }
}

#[derive(Clone)]
pub struct SessionsHandle {
    pub(crate) actors: Keyed<SessionActor>,
    pub(crate) projects: ProjectsHandle,
    pub(crate) store: Store,
    pub(crate) blobs: BlobStore,
    pub(crate) cfg: SessionsConfig,
}

impl SessionsHandle {
    fn record(&self, pid: u64, id: u64) -> Result<Session> {
        self.store
            .session(pid, id)?
            .ok_or_else(|| Error::not_found("Session"))
    }

    fn detail_of(&self, s: &Session) -> Result<SessionDetail> {
        let c = self.store.session_counters(s.id)?;
        let mut d = SessionDetail::new(s, &c, now_ms());
        if let Some(pkg) = s.package_id {
            // A deleted package leaves the id on the session but no name to show.
            d.package =
                self.store
                    .deployment(s.project_id, pkg)?
                    .map(|p| crate::views::PackageRef {
                        id: p.id,
                        name: p.name,
                    });
        }
        Ok(d)
    }

    /// The device a session belongs to (for device-token checks); 404 when absent.
    pub fn device_of(&self, pid: u64, id: u64) -> Result<u64> {
        Ok(self.record(pid, id)?.device_id)
    }

    pub fn detail(&self, pid: u64, id: u64) -> Result<SessionDetail> {
        self.detail_of(&self.record(pid, id)?)
    }

    pub fn list(&self, pid: u64, f: &SessionFilter, page: PageReq) -> Result<Page<SessionItem>> {
        let now = now_ms();
        let mut items = Vec::new();
        for s in self.store.project_sessions(pid)? {
            let keep = f.device_id.is_none_or(|d| s.device_id == d)
                && f.status.is_none_or(|st| s.status == st)
                && f.since.is_none_or(|t| s.started_at >= t)
                && f.until.is_none_or(|t| s.started_at < t);
            if keep {
                items.push(s);
            }
        }
        // Newest first by start, id breaking ties.
        items.sort_by(|a, b| b.started_at.cmp(&a.started_at).then(b.id.cmp(&a.id)));
        let page = page.slice(items);
        let mut out = Vec::with_capacity(page.items.len());
        for s in &page.items {
            out.push(SessionItem::new(
                s,
                &self.store.session_counters(s.id)?,
                now,
            ));
        }
        Ok(Page {
            items: out,
            total: page.total,
            page: page.page,
            page_size: page.page_size,
            has_more: page.has_more,
        })
    }

    pub async fn create(
        &self,
        pid: u64,
        device_id: u64,
        tags: Vec<String>,
        package_id: Option<u64>,
    ) -> Result<SessionDetail> {
        let s = self
            .projects
            .write(pid, |reply| ProjectMsg::CreateSession {
                device_id,
                tags: tags.clone(),
                package_id,
                reply,
            })
            .await?;
        self.detail_of(&s)
    }

    /// Appends one batch (all or nothing), answered once durable.
    pub async fn append(&self, pid: u64, id: u64, entries: Vec<RawEntry>) -> Result<Accepted> {
        let s = self.record(pid, id)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        let chunk = Arc::new(logs::build_chunk(entries)?);
        if chunk.is_empty() {
            return Ok(Accepted { accepted: 0 });
        }
        let accepted = self
            .actors
            .call(id, |reply| SessionMsg::Append(chunk.clone(), reply))
            .await?;
        self.store.durable().await?;
        Ok(Accepted { accepted })
    }

    /// Seals the session's actor (starting it if needed, so that no append that raced with
    /// this call can land after it).
    async fn seal(&self, id: u64) -> Result<()> {
        self.actors.call(id, SessionMsg::Seal).await
    }

    /// Tells the session's subscribers how it ended (`None`: deleted) and stops its actor.
    fn end_actor(&self, id: u64, status: Option<&'static str>) {
        if let Some(a) = self.actors.running(id) {
            let _ = a.cast(crate::mailbox::Envelope::cast(SessionMsg::End(status)));
        }
        self.actors.forget(id);
    }

    /// A live subscriber: replay, then the feed; for a session that is not active, the
    /// replay from storage and its end.
    pub async fn subscribe(
        &self,
        pid: u64,
        id: u64,
        replay: usize,
        filter: LogFilter,
    ) -> Result<Subscription> {
        let s = self.record(pid, id)?;
        if s.status == SessionStatus::Active {
            let f = filter.clone();
            return self
                .actors
                .call(id, |reply| SessionMsg::Subscribe {
                    replay: Replay::Last(replay),
                    filter: f.clone(),
                    reply,
                })
                .await;
        }
        let store = self.store.clone();
        let frames = tokio::task::spawn_blocking(move || -> Result<Vec<bytes::Bytes>> {
            let mut chunks = Vec::new();
            let mut matched = 0;
            for item in store.log_chunks_rev(id) {
                if matched >= replay {
                    break;
                }
                let (_, c) = item?;
                matched += filter.matches(&c).len();
                chunks.push(Arc::new(c));
            }
            chunks.reverse();
            Ok(live::replay_frames(&chunks, &filter, replay))
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
        let counters = self.store.session_counters(id)?;
        Ok(Subscription {
            replay: frames,
            next_seq: counters.log_count,
            feed: None,
            ended: Some(s.status.as_str()),
        })
    }

    /// Picks a live feed up again after the session's actor restarted: every buffered entry
    /// from `from` on, then the new feed.
    pub async fn resume(&self, id: u64, from: u64, filter: LogFilter) -> Result<Subscription> {
        self.actors
            .call(id, |reply| SessionMsg::Subscribe {
                replay: Replay::Since(from),
                filter: filter.clone(),
                reply,
            })
            .await
    }

    pub async fn complete(&self, pid: u64, id: u64, status: EndStatus) -> Result<SessionDetail> {
        let status = SessionStatus::from(status);
        let s = self.record(pid, id)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        self.seal(id).await?;
        let s = self
            .projects
            .write(pid, |reply| ProjectMsg::EndSession { id, status, reply })
            .await?;
        self.end_actor(id, Some(status.as_str()));
        self.detail_of(&s)
    }

    pub async fn tag(&self, pid: u64, id: u64, tag: String, add: bool) -> Result<SessionDetail> {
        let s = self
            .projects
            .write(pid, |reply| ProjectMsg::Tag {
                id,
                tag: tag.clone(),
                add,
                reply,
            })
            .await?;
        self.detail_of(&s)
    }

    /// Deletes artifact blobs no record points at: those a crash left between a blob's write
    /// and its record, or between a record's removal and its blob's. The error paths never
    /// delete a blob a record may still point at; this sweep collects what they leave. A blob
    /// younger than `grace_ms` may belong to an upload still streaming, and is kept. Returns
    /// how many went.
    pub async fn collect_orphans(&self, now_ms: i64, grace_ms: i64) -> Result<usize> {
        use futures::StreamExt;
        let mut keys = self.blobs.keys("artifacts");
        // Listings come grouped by session: one session's records at a time.
        let mut current: Option<(u64, bool, std::collections::HashSet<String>)> = None;
        let mut gone = 0;
        while let Some(key) = keys.next().await {
            let key = key?;
            let mut parts = key.split('/');
            let (Some("artifacts"), Some(sid), Some(name), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Ok(sid) = sid.parse::<u64>() else {
                continue;
            };
            if current.as_ref().is_none_or(|c| c.0 != sid) {
                let exists = self.store.session_by_id(sid)?.is_some();
                let held = self
                    .store
                    .artifacts(sid)?
                    .into_iter()
                    .map(|a| a.blob_key)
                    .collect();
                current = Some((sid, exists, held));
            }
            let Some((_, exists, held)) = &current else {
                continue;
            };
            if held.contains(&key) {
                continue;
            }
            // Not a key of ours (a backend's temporary file of a write in flight): left alone.
            let Ok(made_by) = uuid::Uuid::parse_str(name) else {
                continue;
            };
            // Keys made before v7 carry no time; no upload of theirs can still be running.
            let young = made_by.get_timestamp().is_some_and(|t| {
                let (secs, nanos) = t.to_unix();
                let made = secs as i64 * 1000 + i64::from(nanos / 1_000_000);
                now_ms - made < grace_ms
            });
            if *exists && young {
                continue;
            }
            self.blobs.delete(&key).await?;
            gone += 1;
        }
        Ok(gone)
    }

    /// Deletes the session with its logs, for good.
    pub async fn delete(&self, pid: u64, id: u64) -> Result<()> {
        self.record(pid, id)?;
        self.seal(id).await?;
        let blobs = self
            .projects
            .write(pid, |reply| ProjectMsg::DeleteSession { id, reply })
            .await?;
        self.end_actor(id, None);
        // The records are gone for good; the bytes follow (a crash here leaves only
        // unreferenced blobs, never a half-visible session).
        for key in blobs {
            if let Err(e) = self.blobs.delete(&key).await {
                tracing::warn!(key, error = %e, "could not delete an artifact blob");
            }
        }
        Ok(())
    }

    /// The log query: every match counted, one page returned, ascending by timestamp with
    /// ties in arrival order.
    pub async fn logs(
        &self,
        pid: u64,
        id: u64,
        filter: LogFilter,
        limit: usize,
        offset: usize,
    ) -> Result<LogPage> {
        self.record(pid, id)?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || query(&store, id, &filter, limit, offset))
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
    }

    /// Streams every matching entry as JSON or CSV through a small channel, ascending by
    /// timestamp like the query; memory stays flat (the sort keys, 16 bytes a match, and a few
    /// decoded chunks) however long the session.
    pub fn export(
        &self,
        pid: u64,
        id: u64,
        filter: LogFilter,
        format: ExportFormat,
    ) -> Result<ExportStream> {
        self.record(pid, id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = export_into(&store, id, &filter, format, &tx) {
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        });
        Ok(rx)
    }

    /// Stores an artifact streamed from the request body (replacing the same path), answered
    /// once the bytes and the record are durable.
    pub async fn put_artifact(
        &self,
        pid: u64,
        id: u64,
        path: String,
        content_type: Option<String>,
        body: BoxStream<'static, std::io::Result<bytes::Bytes>>,
    ) -> Result<ArtifactView> {
        let s = self.record(pid, id)?;
        rules::artifact_path(&path)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        let content_type = content_type
            .filter(|c| !c.trim().is_empty())
            .unwrap_or_else(|| {
                mime_guess::from_path(&path)
                    .first_or_octet_stream()
                    .essence_str()
                    .to_string()
            });
        // Time-ordered (v7), so the orphan sweep can tell an upload still in flight by age.
        let blob_key = format!("artifacts/{id}/{}", uuid::Uuid::now_v7());
        let size = self
            .blobs
            .put_stream(&blob_key, body, self.cfg.max_artifact_bytes)
            .await
            .map_err(|e| match e {
                PutError::TooLarge(max) => {
                    Error::TooLarge(format!("An artifact is at most {max} bytes"))
                }
                PutError::Body(e) => {
                    Error::BadRequest(format!("Could not read the request body: {e}"))
                }
                PutError::Storage(e) => Error::from(e),
            })?;
        let a = Artifact {
            session_id: id,
            path,
            size_bytes: size,
            content_type,
            blob_key: blob_key.clone(),
            created_at: now_ms(),
        };
        let view = ArtifactView::from(&a);
        let replaced = match self
            .actors
            .call(id, |reply| SessionMsg::PutArtifact(a.clone(), reply))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // Refused or never taken on (503): the record does not point at the blob. The
                // actor may also have died after writing it (500): then the record is the
                // truth, and the blob it points at stays.
                let kept = matches!(
                    self.store.artifact(id, &a.path),
                    Ok(Some(ref r)) if r.blob_key == blob_key
                );
                if !kept {
                    let _ = self.blobs.delete(&blob_key).await;
                }
                return Err(e);
            }
        };
        self.store.durable().await?;
        if let Some(old) = replaced {
            let _ = self.blobs.delete(&old).await;
        }
        Ok(view)
    }

    pub fn artifacts(&self, pid: u64, id: u64) -> Result<Items<ArtifactView>> {
        self.record(pid, id)?;
        Ok(Items {
            items: self
                .store
                .artifacts(id)?
                .iter()
                .map(ArtifactView::from)
                .collect(),
        })
    }

    /// One artifact's record (404 "Artifact not found").
    pub fn artifact(&self, pid: u64, id: u64, path: &str) -> Result<Artifact> {
        self.record(pid, id)?;
        self.store
            .artifact(id, path)?
            .ok_or_else(|| Error::not_found("Artifact"))
    }

    /// The bytes of an artifact, or of `range` of it.
    pub async fn artifact_bytes(
        &self,
        a: &Artifact,
        range: Option<std::ops::Range<u64>>,
    ) -> Result<BoxStream<'static, std::io::Result<bytes::Bytes>>> {
        Ok(self.blobs.stream(&a.blob_key, range).await?)
    }

    /// Every artifact of the session as one ZIP, streamed (each file is copied through in
    /// pieces on a blocking thread; memory stays flat).
    pub fn zip(&self, pid: u64, id: u64) -> Result<ExportStream> {
        self.record(pid, id)?;
        let artifacts = self.store.artifacts(id)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let blobs = self.blobs.clone();
        let rt = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = zip_into(&rt, &blobs, &artifacts, &tx) {
                let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        });
        Ok(rx)
    }

    /// The `[sessions]` configuration (live-stream settings).
    pub fn config(&self) -> &SessionsConfig {
        &self.cfg
    }

    /// Makes a session's actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    pub async fn inject_panic(&self, id: u64) -> Result<()> {
        let a = self.actors.actor(id).await?;
        a.cast(crate::mailbox::Envelope::cast(SessionMsg::Panic))
            .map_err(|_| Error::Unavailable {
                retry_after_secs: 1,
            })
    }

    /// Makes the session's next append panic after its write, while fanning it out
    /// (supervision tests only).
    #[doc(hidden)]
    pub async fn inject_panic_after_next_write(&self, id: u64) -> Result<()> {
        let a = self.actors.actor(id).await?;
        a.cast(crate::mailbox::Envelope::cast(
            SessionMsg::PanicAfterNextWrite,
        ))
        .map_err(|_| Error::Unavailable {
            retry_after_secs: 1,
        })
    }
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Json,
    Csv,
}

/// Pieces of an export body, each about 64 KiB.
pub type ExportStream = tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>;

const EXPORT_PIECE: usize = 64 * 1024;

/// Chunks decoded and kept while exporting (timestamps out of arrival order revisit chunks).
const EXPORT_CHUNK_CACHE: usize = 32;

/// The sort keys (timestamp, chunk, index) of every match, ascending.
fn sorted_hits(store: &Store, session: u64, f: &LogFilter) -> Result<Vec<(i64, u64, u32)>> {
    let mut hits: Vec<(i64, u64, u32)> = Vec::new();
    for item in store.log_chunks(session) {
        let (seq, chunk) = item?;
        for i in f.matches(&chunk) {
            if let Some(ts) = chunk.ts_at(i) {
                hits.push((ts, seq, i as u32));
            }
        }
    }
    hits.sort_unstable();
    Ok(hits)
}

/// A `Write` that sends what it is given down the channel in pieces.
struct ChannelWriter<'a> {
    buf: Vec<u8>,
    tx: &'a tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
}

impl std::io::Write for ChannelWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= EXPORT_PIECE {
            self.flush()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = bytes::Bytes::from(std::mem::take(&mut self.buf));
        self.tx
            .blocking_send(Ok(piece))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client went away"))
    }
}

fn zip_into(
    rt: &tokio::runtime::Handle,
    blobs: &BlobStore,
    artifacts: &[Artifact],
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) -> Result<()> {
    use futures::StreamExt;
    use std::io::Write;
    let io = |e: &dyn std::fmt::Display| Error::Internal(e.to_string());
    let out = ChannelWriter {
        buf: Vec::with_capacity(EXPORT_PIECE * 2),
        tx,
    };
    let mut zip = zip::ZipWriter::new_stream(out);
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    for a in artifacts {
        zip.start_file(a.path.as_str(), opts).map_err(|e| io(&e))?;
        let mut stream = rt.block_on(blobs.stream(&a.blob_key, None))?;
        while let Some(piece) = rt.block_on(stream.next()) {
            let piece = piece.map_err(|e| io(&e))?;
            zip.write_all(&piece).map_err(|e| io(&e))?;
        }
    }
    let mut out = zip.finish().map_err(|e| io(&e))?;
    out.flush().map_err(|e| io(&e))?;
    Ok(())
}

/// The export's output buffer, shared between the CSV writer and the sender.
#[derive(Clone, Default)]
struct Shared(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn export_into(
    store: &Store,
    session: u64,
    f: &LogFilter,
    format: ExportFormat,
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) -> Result<()> {
    let internal = |e: &dyn std::fmt::Display| Error::Internal(e.to_string());
    let hits = sorted_hits(store, session, f)?;
    let mut cache: Vec<(u64, Arc<fleetops_storage::LogChunk>)> = Vec::new();
    let mut ts_buf = String::with_capacity(24);
    let buf = Shared::default();
    let mut out = csv::WriterBuilder::new().from_writer(buf.clone());
    if format == ExportFormat::Csv {
        out.write_record(["timestamp", "level", "module", "message", "metadata"])
            .map_err(|e| internal(&e))?;
    } else {
        buf.0.borrow_mut().push(b'[');
    }
    for (n, (_, seq, i)) in hits.iter().enumerate() {
        let chunk = match cache.iter().find(|(s, _)| s == seq) {
            Some((_, c)) => c.clone(),
            None => {
                let Some(c) = store.log_chunk(session, *seq)? else {
                    continue;
                };
                let c = Arc::new(c);
                if cache.len() >= EXPORT_CHUNK_CACHE {
                    cache.remove(0);
                }
                cache.push((*seq, c.clone()));
                c
            }
        };
        let i = *i as usize;
        // Written straight from the chunk's columns: no allocation per entry.
        let (Some(ts), Some(level), Some(module), Some(message), Some(meta)) = (
            chunk.ts_at(i),
            chunk.level_at(i).and_then(|l| logs::LEVELS.get(l as usize)),
            chunk
                .module_at(i)
                .and_then(|m| chunk.modules.get(m as usize)),
            chunk.message(i),
            chunk.metadata(i),
        ) else {
            continue;
        };
        ts_buf.clear();
        write_ms(&mut ts_buf, ts);
        if format == ExportFormat::Csv {
            out.write_record([
                ts_buf.as_bytes(),
                level.as_bytes(),
                module.as_bytes(),
                message.as_bytes(),
                meta,
            ])
            .map_err(|e| internal(&e))?;
            // The CSV writer buffers; move its output along every so often.
            if n % 256 == 255 {
                out.flush().map_err(|e| internal(&e))?;
            }
        } else {
            let mut b = buf.0.borrow_mut();
            if n > 0 {
                b.push(b',');
            }
            b.extend_from_slice(b"{\"timestamp\":\"");
            b.extend_from_slice(ts_buf.as_bytes());
            b.extend_from_slice(b"\",\"level\":\"");
            b.extend_from_slice(level.as_bytes());
            b.extend_from_slice(b"\",\"module\":");
            serde_json::to_writer(&mut *b, module).map_err(|e| internal(&e))?;
            b.extend_from_slice(b",\"message\":");
            serde_json::to_writer(&mut *b, message).map_err(|e| internal(&e))?;
            b.extend_from_slice(b",\"metadata\":");
            b.extend_from_slice(meta);
            b.push(b'}');
        }
        if buf.0.borrow().len() >= EXPORT_PIECE {
            let piece = std::mem::take(&mut *buf.0.borrow_mut());
            if tx.blocking_send(Ok(bytes::Bytes::from(piece))).is_err() {
                return Ok(()); // the client went away
            }
        }
    }
    out.flush().map_err(|e| internal(&e))?;
    if format == ExportFormat::Json {
        buf.0.borrow_mut().push(b']');
    }
    let rest = std::mem::take(&mut *buf.0.borrow_mut());
    let _ = tx.blocking_send(Ok(bytes::Bytes::from(rest)));
    Ok(())
}

fn query(
    store: &Store,
    session: u64,
    f: &LogFilter,
    limit: usize,
    offset: usize,
) -> Result<LogPage> {
    let hits = sorted_hits(store, session, f)?;
    let total = hits.len();
    let page: Vec<(i64, u64, u32)> = hits.into_iter().skip(offset).take(limit).collect();
    // Pass 2: decode only the chunks that hold the page.
    let mut wanted: BTreeMap<u64, Vec<(usize, u32)>> = BTreeMap::new();
    for (pos, (_, seq, i)) in page.iter().enumerate() {
        wanted.entry(*seq).or_default().push((pos, *i));
    }
    let mut items: Vec<Option<logs::LogEntryView>> = vec![None; page.len()];
    for (seq, entries) in wanted {
        let Some(chunk) = store.log_chunk(session, seq)? else {
            continue;
        };
        for (pos, i) in entries {
            if let Some(slot) = items.get_mut(pos) {
                *slot = logs::entry(&chunk, i as usize);
            }
        }
    }
    Ok(LogPage {
        items: items.into_iter().flatten().collect(),
        total,
    })
}
