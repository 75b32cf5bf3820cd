//! [`SessionsHandle`]: the way in for sessions and their logs.
//!
//! Writers: a session's record (status, tags) belongs to its project's actor; its log chunks
//! and counters to its own SessionActor while it is active. Completion seals the session
//! actor (no more appends), then ends the record through the project actor, then stops the
//! session actor. Reads (lists, details, log queries) go to the store directly; log queries run
//! on a blocking thread since they scan.

use std::sync::Arc;

use fleetops_storage::sessions::{ChunkIndex, SessionQuery};
use fleetops_storage::{BlobStore, Columns, LogChunk, Session, SessionStatus, Store};

pub use super::exports::{ExportFormat, ExportStream};
use super::{Replay, SessionActor, SessionMsg};
use super::{exports, search};
use crate::clock::now_ms;
use crate::config::SessionsConfig;
use crate::error::{Error, Result};
use crate::keyed::Keyed;
use crate::live::{self, Subscription};
use crate::logs::{self, LogFilter, RawEntry};
use crate::project::SessionsMsg;
use crate::project::handle::ProjectsHandle;
use crate::views::{Accepted, LogPage, Page, PageReq, SessionDetail, SessionItem};

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
    pub(crate) counters: std::sync::Arc<crate::counters::Counters>,
    pub(crate) actors: Keyed<SessionActor>,
    pub(crate) projects: ProjectsHandle,
    pub(crate) store: Store,
    pub(crate) blobs: BlobStore,
    pub(crate) cfg: SessionsConfig,
    /// Exports and ZIP downloads streaming now, each on a blocking thread
    /// (`[sessions] max_streams`, at most `max_streams_per_org` for one organization).
    pub(crate) streams: crate::shares::Shares,
    /// Streamed uploads running now (artifacts here, capsules and configurations in the
    /// pipeline: one pool), with each organization's share.
    pub(crate) uploads: crate::shares::Shares,
    /// Seals sessions' log batches into chunks of the configured size.
    pub(crate) sealer: super::sealer::LogSealer,
    /// `[logs]`: the default retention of ended sessions.
    pub(crate) logs: crate::config::LogsConfig,
    /// Tells the other nodes' actors of a session's end.
    pub(crate) bus: crate::bus::Bus,
}

/// Longest retention a project may set (100 years); 0 keeps sessions for good.
const MAX_RETENTION_DAYS: u32 = 36_500;
/// Sessions one housekeeping pass deletes past their retention, at most.
const EXPIRE_PER_PASS: usize = 1_000;
/// Ended sessions of each status one pass looks at per project, at most.
const EXPIRE_SCAN: usize = 10_000;

impl SessionsHandle {
    /// How long a stream's reader may leave a piece untaken before the stream is cut short.
    pub(super) fn stall(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.cfg.stalled_reader_seconds.max(1))
    }

    /// A place for one more export or ZIP stream of project `pid`, or 503: each holds a
    /// blocking thread while it runs (until its reader takes the last piece, or stalls past
    /// `stall`), and one organization's streams hold at most its share of the places.
    pub(super) fn stream_permit(&self, pid: u64) -> Result<crate::shares::Slot> {
        self.streams.take(self.store.org_of_project(pid)?, 5)
    }

    pub(super) fn record(&self, pid: u64, id: u64) -> Result<Session> {
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

    pub async fn list(
        &self,
        pid: u64,
        f: &SessionFilter,
        page: PageReq,
    ) -> Result<Page<SessionItem>> {
        let me = self.clone();
        let f = f.clone();
        crate::off_thread(move || me.list_now(pid, &f, page)).await
    }

    /// On the blocking pool: a filtered list may walk storage.
    fn list_now(&self, pid: u64, f: &SessionFilter, page: PageReq) -> Result<Page<SessionItem>> {
        let now = now_ms();
        let q = SessionQuery {
            device: f.device_id,
            status: f.status,
            since: f.since,
            until: f.until,
        };
        let (sessions, total) = self
            .store
            .sessions_page(pid, q, page.skip(), page.page_size)?;
        let ids: Vec<u64> = sessions.iter().map(|s| s.id).collect();
        let counters = self.store.sessions_counters(&ids)?;
        let out: Vec<SessionItem> = sessions
            .iter()
            .zip(&counters)
            .map(|(s, c)| SessionItem::new(s, c, now))
            .collect();
        Ok(page.of(out, total))
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
            .write(pid, |reply| SessionsMsg::CreateSession {
                device_id,
                tags: tags.clone(),
                package_id,
                reply,
            })
            .await?;
        self.detail_of(&s)
    }

    /// Appends one batch (all or nothing), answered once durable.
    /// `batch`: the sender's number for it, rising within the session; a number the session
    /// already stored is answered as accepted again (`duplicate`), and stores nothing.
    pub async fn append(
        &self,
        pid: u64,
        id: u64,
        entries: Vec<RawEntry>,
        batch: Option<u64>,
    ) -> Result<Accepted> {
        let s = self.record(pid, id)?;
        if s.status != SessionStatus::Active {
            return Err(Error::Conflict("Session is not active".into()));
        }
        // Columns and index for a large batch are built on the blocking pool (a thousand
        // entries are about a millisecond of work; the text filter is a pass over all text).
        let indexed = |entries| -> Result<(LogChunk, ChunkIndex)> {
            let chunk = logs::build_chunk(entries)?;
            let index = ChunkIndex::of(&chunk)?;
            Ok((chunk, index))
        };
        let (chunk, index) = if entries.len() > 64 {
            crate::off_thread(move || indexed(entries)).await?
        } else {
            indexed(entries)?
        };
        let (chunk, index) = (Arc::new(chunk), Arc::new(index));
        if chunk.is_empty() {
            return Ok(Accepted {
                accepted: 0,
                duplicate: false,
            });
        }
        let stored = self
            .actors
            .call(id, |reply| {
                SessionMsg::Append(chunk.clone(), index.clone(), batch, reply)
            })
            .await?;
        // A duplicate too: its first write may still be on its way to disk.
        self.store.durable().await?;
        let Some(accepted) = stored else {
            return Ok(Accepted {
                accepted: chunk.len(),
                duplicate: true,
            });
        };
        crate::counters::Counters::add(&self.counters.log_lines, chunk.levels.len() as u64);
        self.projects.alerts.logs(pid, s.device_id, chunk).await;
        Ok(Accepted {
            accepted,
            duplicate: false,
        })
    }

    /// Session actors running now (active sessions not passivated), for `/metrics`.
    pub fn running_actors(&self) -> usize {
        self.actors.running_count()
    }

    /// Seals the session's actor (starting it if needed, so that no append that raced with
    /// this call can land after it).
    async fn seal(&self, id: u64) -> Result<()> {
        self.actors.call(id, SessionMsg::Seal).await
    }

    /// Undoes `seal` after the write it guarded failed (answered an error, so the session
    /// stays as stored: appends are taken again while it is active). A caller that went away
    /// mid-write sends none (the write may yet apply): that seal lasts until the actor, which
    /// refused appends do not keep alive, idles out and starts again from storage.
    fn unseal(&self, id: u64) {
        if let Some(a) = self.actors.running(id) {
            let _ = a.cast(crate::mailbox::Envelope::cast(SessionMsg::Unseal));
        }
    }

    /// Tells the session's subscribers how it ended (`None`: deleted) and stops its actor.
    fn end_actor(&self, id: u64, status: Option<&'static str>) {
        if self.bus.is_shared() {
            self.bus
                .publish(super::remote::subject(id), &super::remote::end(status));
        }
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
            let _pin = store.log_pin(id);
            for item in store.log_chunks_rev(id) {
                if matched >= replay {
                    break;
                }
                let (_, c) = item?;
                // Only chunks with a match are kept: a filter that matches little must not
                // hold the whole session in memory while it looks.
                let n = filter.matches(&c).len();
                if n > 0 {
                    matched += n;
                    chunks.push(Arc::new(c));
                }
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
            .write(pid, |reply| SessionsMsg::EndSession { id, status, reply })
            .await
            .inspect_err(|_| self.unseal(id))?;
        self.end_actor(id, Some(status.as_str()));
        // Its last batches are sealed now rather than at the next housekeeping pass.
        self.sealer.request_all(id);
        self.detail_of(&s)
    }

    /// The project's retention of ended sessions.
    pub fn log_retention(&self, pid: u64) -> Result<crate::views::LogRetentionView> {
        Ok(self.retention_view(self.store.log_retention(pid)?))
    }

    fn retention_view(
        &self,
        r: fleetops_storage::sessions::LogRetention,
    ) -> crate::views::LogRetentionView {
        crate::views::LogRetentionView {
            retention_days: r.retention_days,
            default_retention_days: self.logs.retention_days,
            effective_retention_days: r.retention_days.unwrap_or(self.logs.retention_days),
        }
    }

    /// Sets the project's own retention (`None`: the server's default).
    pub async fn set_log_retention(
        &self,
        pid: u64,
        days: Option<u32>,
    ) -> Result<crate::views::LogRetentionView> {
        if days.is_some_and(|d| d > MAX_RETENTION_DAYS) {
            return Err(Error::unprocessable(
                "retention_days",
                format!("at most {MAX_RETENTION_DAYS} (0 keeps sessions for good)"),
            ));
        }
        let retention = fleetops_storage::sessions::LogRetention {
            retention_days: days,
        };
        let r = self
            .projects
            .write(pid, |reply| SessionsMsg::SetLogRetention {
                retention,
                reply,
            })
            .await?;
        Ok(self.retention_view(r))
    }

    /// Deletes, with their logs and files, the ended sessions past their project's retention:
    /// at most `EXPIRE_PER_PASS` a pass (the housekeeper's), each through the same path as a
    /// user's delete. Returns how many went.
    pub async fn expire_sessions(&self, now_ms: i64) -> Result<usize> {
        let mut gone = 0;
        for org in self.store.all_orgs()? {
            for p in self.store.org_projects(org.id)? {
                if gone >= EXPIRE_PER_PASS || self.store.project_retired(p.id) {
                    continue;
                }
                let days = self
                    .store
                    .log_retention(p.id)?
                    .retention_days
                    .unwrap_or(self.logs.retention_days);
                if days == 0 {
                    continue;
                }
                let cutoff = now_ms.saturating_sub(i64::from(days).saturating_mul(86_400_000));
                let store = self.store.clone();
                let (pid, left) = (p.id, EXPIRE_PER_PASS - gone);
                let expired = tokio::task::spawn_blocking(move || {
                    store.sessions_ended_before(pid, cutoff, left, EXPIRE_SCAN)
                })
                .await
                .map_err(|e| Error::Internal(e.to_string()))??;
                for s in expired {
                    match self.delete(pid, s.id).await {
                        Ok(()) => gone += 1,
                        // Deleted meanwhile by someone else.
                        Err(Error::NotFound(_)) => {}
                        // One that cannot go now does not hold back the others.
                        Err(e) => tracing::warn!(
                            session = s.id,
                            error = %e,
                            "a session past its retention could not be deleted; the next pass retries"
                        ),
                    }
                }
            }
        }
        Ok(gone)
    }

    /// Seals the log batches of sessions that have waited `[logs] seal_age_seconds` for it
    /// (the housekeeper's pass); how many sessions were owed one.
    pub async fn seal_owed(&self, now_ms: i64) -> Result<usize> {
        self.sealer.seal_owed(now_ms).await
    }

    pub async fn tag(&self, pid: u64, id: u64, tag: String, add: bool) -> Result<SessionDetail> {
        let s = self
            .projects
            .write(pid, |reply| SessionsMsg::Tag {
                id,
                tag: tag.clone(),
                add,
                reply,
            })
            .await?;
        self.detail_of(&s)
    }

    /// Deletes the session with its logs, for good.
    pub async fn delete(&self, pid: u64, id: u64) -> Result<()> {
        self.record(pid, id)?;
        self.seal(id).await?;
        let blobs = self
            .projects
            .write(pid, |reply| SessionsMsg::DeleteSession { id, reply })
            .await
            .inspect_err(|_| self.unseal(id))?;
        self.end_actor(id, None);
        // The records are gone for good; the bytes follow (a crash here leaves only
        // unreferenced blobs, never a half-visible session). Log segments are on the
        // to-delete list until deleted; the housekeeper retries what is left there.
        let (segments, files): (Vec<String>, Vec<String>) = blobs
            .into_iter()
            .partition(|k| k.starts_with(fleetops_storage::sessions::segments::SEGMENT_PREFIX));
        for key in files {
            if let Err(e) = self.blobs.delete(&key).await {
                tracing::warn!(key, error = %e, "could not delete an artifact blob");
            }
        }
        if !segments.is_empty() {
            fleetops_storage::failpoints::hit("delete:after-commit");
            let store = self.store.clone();
            crate::off_thread(move || {
                for key in &segments {
                    if let Err(e) = store.delete_doomed_segment(key) {
                        tracing::warn!(key, error = %e, "could not delete a log segment; the housekeeper retries");
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    /// Deletes the log segments of deleted sessions still on the to-delete list (at most
    /// 1,000 a pass); how many went.
    pub async fn delete_doomed_segments(&self) -> Result<usize> {
        let store = self.store.clone();
        crate::off_thread(move || {
            let mut gone = 0;
            for key in store.doomed_segments(1_000)? {
                store.delete_doomed_segment(&key)?;
                gone += 1;
            }
            Ok(gone)
        })
        .await
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
        let window = self.cfg.max_result_window;
        if offset.saturating_add(limit) > window {
            return Err(Error::unprocessable(
                "offset",
                format!("offset + limit is at most {window}; page further with since"),
            ));
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || search::query(&store, id, &filter, limit, offset))
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
        let permit = self.stream_permit(pid)?;
        let (tx, stream) = exports::Pieces::new(self.stall());
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            if let Err(e) = exports::export_into(&store, id, &filter, format, &tx) {
                tx.send(Err(std::io::Error::other(e.to_string())));
            }
        });
        Ok(stream)
    }

    /// The `[sessions]` configuration (live-stream settings).
    pub fn config(&self) -> &SessionsConfig {
        &self.cfg
    }

    /// Makes a session's actor panic in its handler (supervision tests only).
    #[doc(hidden)]
    #[cfg(feature = "fault-injection")]
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
    #[cfg(feature = "fault-injection")]
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
