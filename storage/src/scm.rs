//! Inbound webhooks: the dedup window, the delivery log and its intake queue, installations,
//! repository links and test runs. Each change is one atomic batch ([`ScmBatch`]), so a
//! delivery's outcome is written together with its effect and a crash replays it whole or not
//! at all.

use crate::accounts::Seq;
use crate::states::DeliveryOutcome;
use crate::states::RunStatus;
use crate::{
    Delivery, Installation, InstallationBinding, RepoHold, RepoLink, Result, Store, TestRun,
    Writes, codec, keys,
};

use crate::lists::{Entry, ListId, Listed, Query};

/// The delivery log's lists: every delivery, or a project's, each whole or by outcome.
fn delivery_list(project: Option<u64>, outcome: Option<DeliveryOutcome>) -> ListId {
    match (project, outcome) {
        (None, None) => ListId::new("wd"),
        (None, Some(o)) => ListId::new("wdo").str(o.as_str()),
        (Some(p), None) => ListId::new("wdp").id(p),
        (Some(p), Some(o)) => ListId::new("wdpo").id(p).str(o.as_str()),
    }
}

impl Listed for Delivery {
    fn entries(&self) -> Vec<Entry> {
        let (s, o) = (self.seq, Some(self.outcome));
        let mut e = vec![
            Entry::at(delivery_list(None, None), s, s),
            Entry::at(delivery_list(None, o), s, s),
        ];
        if let Some(p) = self.project_id {
            e.push(Entry::at(delivery_list(Some(p), None), s, s));
            e.push(Entry::at(delivery_list(Some(p), o), s, s));
        }
        e
    }
}

/// A project's test runs: whole, by status, by repository (case-insensitive), by commit.
fn run_list(project: u64) -> ListId {
    ListId::new("tr").id(project)
}
fn run_status_list(project: u64, s: RunStatus) -> ListId {
    ListId::new("trs").id(project).str(s.as_str())
}
fn run_repo_list(project: u64, repo: &str) -> ListId {
    ListId::new("trr")
        .id(project)
        .str(&repo.to_ascii_lowercase())
}
fn run_commit_list(project: u64, sha: &str) -> ListId {
    ListId::new("trc").id(project).str(sha)
}

impl Listed for TestRun {
    fn entries(&self) -> Vec<Entry> {
        let (p, id) = (self.project_id, self.id);
        vec![
            Entry::at(run_list(p), id, id),
            Entry::at(run_status_list(p, self.status), id, id),
            Entry::at(run_repo_list(p, &self.repository), id, id),
            Entry::at(run_commit_list(p, &self.commit_sha), id, id),
        ]
    }
}

/// Which test runs a list shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunQuery<'a> {
    pub status: Option<RunStatus>,
    pub repository: Option<&'a str>,
    pub commit_sha: Option<&'a str>,
}

/// How many test-run ids [`Store::new_run`] takes from the counter at once.
pub const RUN_ID_BLOCK: u64 = 64;

/// A run about to be made: its id was just taken from the run counter, so nothing is stored
/// under it. Only [`Store::new_run`] makes one, and it cannot be changed afterwards, so
/// [`ScmBatch::put_new_run`] may skip removing index entries it cannot have.
#[derive(Debug, Clone)]
pub struct NewRun(TestRun);

impl std::ops::Deref for NewRun {
    type Target = TestRun;
    fn deref(&self) -> &TestRun {
        &self.0
    }
}

/// The conflict a repository link meets when another link holds its name.
pub const REPO_NAME_TAKEN: &str = "repository name";

/// Changes applied together by [`ScmBatch::commit`].
pub struct ScmBatch(Writes);

impl Default for ScmBatch {
    fn default() -> Self {
        Self(Writes::new())
    }
}

impl ScmBatch {
    /// Records a delivery's outcome: out of the queue (the list of queued deliveries), into
    /// its project's log.
    /// Decided by the store: the write fails with a conflict unless the delivery is still
    /// queued when it is applied, so a delivery is worked once however many workers read it.
    pub fn finish_delivery(&mut self, d: &Delivery) -> Result<()> {
        self.0.guard(
            keys::delivery(d.seq),
            "the delivery was already worked",
            |v| {
                v.and_then(|v| codec::decode::<Delivery>(v).ok())
                    .is_some_and(|d| d.outcome == DeliveryOutcome::Queued)
            },
        );
        self.0.put_listed(keys::delivery(d.seq), d)
    }

    pub fn put_installation(&mut self, i: &Installation) -> Result<()> {
        self.0.put(keys::installation(i.id), i)
    }

    pub fn put_binding(&mut self, installation: u64, b: &InstallationBinding) -> Result<()> {
        self.0.put(keys::installation_binding(installation), b)
    }

    pub fn put_hold(&mut self, full_name: &str, h: &RepoHold) -> Result<()> {
        self.0.put(keys::repo_hold(full_name), h)
    }

    /// Writes a run made now. Its id is new ([`Store::new_run`] takes it), so it has no
    /// index entries yet and none is removed: each removal is a tree descent in sled's
    /// batch, paid per delivery.
    ///
    /// Decided by the store: a run holding an idempotency key claims it, and the write fails
    /// with a conflict when a run of the same project holds the key by then (another
    /// project's entry is taken over, as when a repository moved between organizations).
    pub fn put_new_run(&mut self, r: &NewRun) -> Result<()> {
        if r.0.holds_key() {
            let pid = r.0.project_id.to_be_bytes();
            self.0.guard(
                keys::run_by_key(&r.0.idempotency_key),
                "the idempotency key is held by another run",
                move |v| v.is_none_or(|v| v.get(..8) != Some(&pid[..])),
            );
        }
        self.write_run(None, &r.0)
    }

    /// Writes a new run that takes its idempotency key over from whatever run holds it (a
    /// rerequested check suite).
    pub fn put_rerun(&mut self, r: &NewRun) -> Result<()> {
        self.write_run(None, &r.0)
    }

    /// Writes a changed run and keeps its indexes (queue, running, idempotency key, pull
    /// request) in step with its status. `old` is the run as its writer read it: the write
    /// fails with a conflict (decided by the store) when the run changed meanwhile, so two
    /// runners never claim one run and a lease's expiry never undoes a completion.
    pub fn put_run(&mut self, old: &TestRun, r: &TestRun) -> Result<()> {
        self.0.guard_record(
            keys::run(r.project_id, r.id),
            old,
            "the test run changed meanwhile",
        );
        self.write_run(Some(old), r)
    }

    fn write_run(&mut self, old: Option<&TestRun>, r: &TestRun) -> Result<()> {
        self.0.put_listed(keys::run(r.project_id, r.id), r)?;
        let pid = r.project_id.to_be_bytes().to_vec();
        let stored = old.is_some();
        if r.status == RunStatus::Queued {
            self.0
                .0
                .insert(keys::run_queue(r.project_id, r.id), Vec::new());
        } else if stored {
            self.0.delete(keys::run_queue(r.project_id, r.id));
        }
        if r.status == RunStatus::Running {
            self.0.0.insert(keys::running(r.id), pid.clone());
        } else if stored {
            self.0.delete(keys::running(r.id));
        }
        // The key index is set when a run is made (a rerequested check suite moves it to
        // the new run, so later changes of an older run must not move it back).
        if r.holds_key() {
            if old.is_none() {
                let mut v = pid.clone();
                v.extend_from_slice(&r.id.to_be_bytes());
                self.0.0.insert(keys::run_by_key(&r.idempotency_key), v);
            }
        } else if old.is_some_and(|o| o.holds_key()) {
            // Only while the index still points here: the commit migration's fold can hand
            // an in-flight run's key to a newer run (and a change that moves keys later must
            // not have a cancel take the newer run's entry).
            let mut v = pid.clone();
            v.extend_from_slice(&r.id.to_be_bytes());
            self.0.0.remove_if(keys::run_by_key(&r.idempotency_key), v);
        }
        if !r.commit_sha.is_empty() {
            self.0.0.insert(
                keys::commit_run(&r.repository, &r.commit_sha, r.id),
                pid.clone(),
            );
        }
        if let Some(n) = r.pull_request_number {
            if r.in_flight() {
                self.0.0.insert(keys::pr_run(&r.repository, n, r.id), pid);
            } else if stored {
                self.0.delete(keys::pr_run(&r.repository, n, r.id));
            }
        }
        Ok(())
    }

    /// Writes a link of a project of organization `org`, indexed by its name in `org`. The
    /// name is claimed inside the write: when another link holds it (another server linked
    /// it first), the commit fails with [`crate::StorageError::Conflict`]`(`[`REPO_NAME_TAKEN`]`)`.
    pub fn put_repo(&mut self, org: u64, r: &RepoLink) -> Result<()> {
        self.0.put(keys::repo(r.project_id, r.id), r)?;
        self.0.claim(
            keys::repo_by_name(org, &r.full_name),
            pair_bytes(r),
            REPO_NAME_TAKEN,
        );
        Ok(())
    }

    pub fn delete_repo(&mut self, org: u64, r: &RepoLink) {
        self.0.delete(keys::repo(r.project_id, r.id));
        self.0.delete(keys::repo_by_name(org, &r.full_name));
    }

    pub fn commit(self, store: &Store) -> Result<()> {
        store.apply(self.0)
    }

    /// Makes the whole batch fail with [`crate::StorageError::Conflict`]`("lease")` unless
    /// `fence`'s lease is still held as it was taken (the webhook worker's, several nodes).
    pub fn fence(&mut self, fence: &crate::leases::Fence) {
        self.0.fence(fence);
    }

    /// How far the batch has got, to take back one delivery's writes when it fails halfway.
    pub fn mark(&self) -> crate::WritesMark {
        self.0.mark()
    }

    /// Takes back every change made since `m`.
    pub fn rollback(&mut self, m: crate::WritesMark) {
        self.0.rollback(m);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A batch's journal record: its last seq (so an applied batch is skipped unread), then
/// its deliveries as stored.
fn journal_record(last: u64, deliveries: &[Delivery]) -> Result<Vec<u8>> {
    let mut j = last.to_be_bytes().to_vec();
    j.extend_from_slice(&codec::encode(&deliveries)?);
    Ok(j)
}

fn bad_journal(applied: u64) -> crate::StorageError {
    crate::StorageError::Corrupt(format!(
        "a journal record in the payload log past seq {applied} is shorter than its header"
    ))
}

/// The writes that claim a delivery's id and store it. A delivery stored `Queued` is in the
/// worker's queue: the list of queued deliveries, ordered by seq, is the queue.
fn claim_writes(w: &mut Writes, d: &Delivery) -> Result<()> {
    w.0.insert(keys::delivery_by_id(&d.delivery_id), id_entry(d));
    w.put_listed(keys::delivery(d.seq), d)
}

/// What a delivery's id maps to: its seq and its receipt time (big-endian), so the dedup
/// window is one read. Retention removes the entry only while it is still these bytes.
fn id_entry(d: &Delivery) -> Vec<u8> {
    let mut entry = d.seq.to_be_bytes().to_vec();
    entry.extend_from_slice(&d.received_at.to_be_bytes());
    entry
}

/// Whether an id's entry (read with the write) says a delivery received at or after
/// `since` holds the id.
fn held_since(entry: Option<&[u8]>, since: i64) -> bool {
    entry
        .and_then(pair)
        .is_some_and(|(_, at)| at as i64 >= since)
}

/// A link's index value: its project and id.
fn pair_bytes(r: &RepoLink) -> Vec<u8> {
    let mut v = r.project_id.to_be_bytes().to_vec();
    v.extend_from_slice(&r.id.to_be_bytes());
    v
}

/// Two big-endian ids (a repository link's, a device token's index entry).
pub(crate) fn pair(v: &[u8]) -> Option<(u64, u64)> {
    let a = v.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok())?;
    let b = v.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok())?;
    Some((u64::from_be_bytes(a), u64::from_be_bytes(b)))
}

impl Store {
    /// Makes `run` a new run: its id is the next from the run counter (whatever it held).
    ///
    /// Ids are taken from the counter [`RUN_ID_BLOCK`] at a time (a counter update is a
    /// sled write of its own, and the worker makes a run per delivery): within one open they
    /// rise by one; a restart leaves the rest of the block as a gap, as a failed write does.
    /// The counter is raised before any id of its block is written in a run, and sled keeps
    /// its writes in order, so no id is handed out twice across a crash.
    pub fn new_run(&self, mut run: TestRun) -> Result<NewRun> {
        let mut ids = self
            .inner
            .run_ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ids.is_empty() {
            let first = self.new_ids(Seq::TestRun, RUN_ID_BLOCK)?;
            *ids = first..first.saturating_add(RUN_ID_BLOCK);
        }
        run.id = ids.start;
        ids.start = ids.start.saturating_add(1);
        Ok(NewRun(run))
    }

    /// Stores deliveries, each claiming its id unless a delivery received at or after
    /// `since` (the dedup window) holds it: `(delivery, payload)` each, in rising seq order
    /// (one stored `Queued` is in the worker's queue). Returns whether each was taken (a
    /// `false` is a duplicate, stored nothing). The claim is decided by the store, with the
    /// write, so two processes on one database take an id once.
    ///
    /// Durable when it returns. On the embedded store the payloads and a journal record of
    /// the deliveries go to the payload log in one write and one `fdatasync`; then one atomic
    /// sled batch claims the ids and stores the deliveries, without waiting for sled's flush
    /// (after a crash, [`Store::recover_deliveries`] writes again what sled lost), and each
    /// taken delivery's `payload_at` is set. On a shared engine the payloads are written with
    /// the deliveries in one transaction, so every process reads them.
    pub fn claim_deliveries(
        &self,
        items: &mut [(Delivery, Option<bytes::Bytes>)],
        since: i64,
    ) -> Result<Vec<bool>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if self.on_postgres() {
            let ids: Vec<Vec<u8>> = items
                .iter()
                .map(|(d, _)| keys::delivery_by_id(&d.delivery_id))
                .collect();
            return self.apply_decided(true, |reads| {
                let mut w = Writes::new();
                let mut taken = Vec::with_capacity(items.len());
                let entries = reads.get_many(&ids)?;
                for ((d, p), entry) in items.iter().zip(entries) {
                    let t = !held_since(entry.as_deref(), since);
                    if t {
                        claim_writes(&mut w, d)?;
                        if let Some(p) = p {
                            w.0.insert(keys::delivery_payload(d.seq), p.to_vec());
                        }
                    }
                    taken.push(t);
                }
                Ok((w, taken))
            });
        }
        // The embedded store's process is its only writer, and its intake decides one batch
        // at a time: the ids are decided before the journal, so only taken deliveries are
        // journaled (a restart never brings back a duplicate).
        let mut taken = Vec::with_capacity(items.len());
        for (d, _) in items.iter() {
            taken.push(!self.is_claimed(&d.delivery_id, since)?);
        }
        let chosen = || {
            items
                .iter()
                .zip(&taken)
                .filter(|(_, t)| **t)
                .map(|(i, _)| i)
        };
        let (Some(first), Some(last)) = (chosen().next(), chosen().last()) else {
            return Ok(taken);
        };
        let (first, last) = (first.0.seq, last.0.seq);
        let payloads: Vec<(u64, &[u8])> = chosen()
            .filter_map(|(d, p)| p.as_ref().map(|p| (d.seq, p.as_ref())))
            .collect();
        let mut journaled = Vec::new();
        let (_, mark) = self
            .inner
            .spool
            .append_journaled(first, &payloads, |places| {
                let mut at = places.iter().copied();
                for (d, p) in chosen() {
                    let mut d = d.clone();
                    if p.is_some() {
                        d.payload_at = at.next();
                    }
                    journaled.push(d);
                }
                journal_record(last, &journaled).map(Some)
            })?;
        let mut w = Writes::new();
        let mut journaled = journaled.into_iter();
        let mut built = Ok(());
        for ((d, _), t) in items.iter_mut().zip(&taken) {
            if *t && let Some(j) = journaled.next() {
                d.payload_at = j.payload_at;
                built = built.and_then(|()| claim_writes(&mut w, d));
            }
        }
        w.put_id(keys::journal_applied(), last);
        // A write that could not be built fails as one that could not be applied.
        if let Err(e) = built.and_then(|()| self.apply(w)) {
            // Answered 503 (not taken): the journal must not bring the batch back.
            if let Err(cut) = self.inner.spool.cut_back(mark) {
                tracing::error!(error = %cut, "a batch answered 503 stays in the payload log's journal and comes back at the next start");
            }
            return Err(e);
        }
        Ok(taken)
    }

    /// How many deliveries this open wrote again from the intake's journal.
    pub fn deliveries_recovered(&self) -> u64 {
        self.inner
            .recovered
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes again the deliveries the intake journaled but sled lost in a crash (answered
    /// 202, not yet flushed), once, at open; returns how many. Their ids are claimed as
    /// before, unless a later delivery claimed the id meanwhile (a batch whose sled write
    /// failed was answered 503 and may have been sent again). The delivery seq counter is
    /// moved past every seq the log holds, so no seq is handed out twice.
    pub(crate) fn recover_deliveries(&self) -> Result<usize> {
        let spool = &self.inner.spool;
        let counter = self.current_id(Seq::Delivery)?;
        let newest_segment = spool.last_segment()?.unwrap_or(0);
        let applied = self
            .inner
            .records
            .get(keys::journal_applied())?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_be_bytes);
        let Some(applied) = applied else {
            // A log written before the journal (or none yet): every delivery it answered
            // for is in sled already. Journals start in a segment of their own.
            let from = counter.max(newest_segment);
            spool.start_new_segment()?;
            self.raise_ids(Seq::Delivery, from)?;
            self.inner
                .records
                .insert(keys::journal_applied(), from.to_be_bytes())?;
            self.inner.db.flush()?;
            return Ok(0);
        };
        let (journals, torn) = spool.journals_after(applied)?;
        let mut highest = counter.max(newest_segment).max(applied);
        let mut lost = Vec::new();
        for j in journals {
            let (last, body) = j.split_at_checked(8).ok_or_else(|| bad_journal(applied))?;
            let last = <[u8; 8]>::try_from(last)
                .map(u64::from_be_bytes)
                .map_err(|_| bad_journal(applied))?;
            highest = highest.max(last);
            // Applied batches are skipped unread, so a record of an older format does not
            // stop the start once sled holds it.
            if last <= applied {
                continue;
            }
            let batch: Vec<Delivery> = codec::decode(body).map_err(|e| {
                crate::StorageError::Corrupt(format!(
                    "a webhook batch in the payload log's journal (seqs up to {last}) cannot be read: {e}"
                ))
            })?;
            for d in batch {
                highest = highest.max(d.seq);
                if d.seq > applied && !self.inner.records.contains_key(keys::delivery(d.seq))? {
                    lost.push(d);
                }
            }
        }
        // Of two lost deliveries of one id (the first answered 503, its journal not cut), the
        // later is the delivery; an id claimed in sled by a later seq stays with it. An id
        // claimed by an earlier seq (past its dedup window) is claimed again, as the intake did.
        let mut newest: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for d in &lost {
            let e = newest.entry(d.delivery_id.clone()).or_default();
            *e = (*e).max(d.seq);
        }
        let mut w = Writes::new();
        let mut replayed = 0;
        let mut last = applied;
        for d in lost {
            last = last.max(d.seq);
            if newest.get(&d.delivery_id).is_some_and(|&n| n > d.seq)
                || self
                    .id_entry(&d.delivery_id)?
                    .is_some_and(|(seq, _)| seq > d.seq)
            {
                continue;
            }
            claim_writes(&mut w, &d)?;
            replayed += 1;
        }
        if torn {
            spool.start_new_segment()?;
        }
        w.put_id(keys::journal_applied(), last);
        self.apply(w)?;
        self.raise_ids(Seq::Delivery, highest)?;
        self.inner.db.flush()?;
        if replayed > 0 {
            tracing::info!(
                deliveries = replayed,
                "webhook deliveries recovered from the intake's journal"
            );
        }
        Ok(replayed)
    }

    /// Whether the id was claimed by a delivery received at or after `since` (the dedup
    /// window is exact; the housekeeper only removes what has expired).
    pub fn is_claimed(&self, delivery_id: &str, since: i64) -> Result<bool> {
        Ok(self
            .id_entry(delivery_id)?
            .is_some_and(|(_, received_at)| received_at >= since))
    }

    /// The seq and receipt time of the newest delivery that claimed `delivery_id`.
    fn id_entry(&self, delivery_id: &str) -> Result<Option<(u64, i64)>> {
        Ok(self
            .inner
            .records
            .get(keys::delivery_by_id(delivery_id))?
            .and_then(|v| pair(&v))
            .map(|(seq, at)| (seq, at as i64)))
    }

    pub fn delivery(&self, seq: u64) -> Result<Option<Delivery>> {
        self.get(&keys::delivery(seq))
    }

    pub fn delivery_by_id(&self, delivery_id: &str) -> Result<Option<Delivery>> {
        match self.id_entry(delivery_id)? {
            Some((seq, _)) => self.delivery(seq),
            None => Ok(None),
        }
    }

    /// A delivery's payload, from the payload log; `None` for an unsubscribed event.
    pub fn payload(&self, d: &Delivery) -> Result<Option<Vec<u8>>> {
        match d.payload_at {
            // Segments go only once no delivery refers to them: a missing one is damage.
            Some(at) => match self.inner.spool.read(at, d.payload_len)? {
                Some(p) => Ok(Some(p)),
                None => Err(crate::StorageError::Corrupt(format!(
                    "the payload of delivery {} is missing from the payload log",
                    d.seq
                ))),
            },
            // On a shared engine the payload is a record of its own.
            None if self.on_postgres() => {
                let p = self.inner.records.get(keys::delivery_payload(d.seq))?;
                if p.is_none() && d.outcome == DeliveryOutcome::Queued {
                    return Err(crate::StorageError::Corrupt(format!(
                        "the payload of queued delivery {} is missing",
                        d.seq
                    )));
                }
                Ok(p.map(|p| p.to_vec()))
            }
            None => Ok(None),
        }
    }

    /// How many accepted deliveries wait for the worker (one counter read).
    pub fn deliveries_queued(&self) -> Result<u64> {
        self.list_len(&delivery_list(None, Some(DeliveryOutcome::Queued)))
    }

    /// Up to `limit` queued deliveries with a seq above `after`, in arrival order: the worker
    /// reads its queue (the list of queued deliveries) a page at a time, so a long backlog
    /// costs a page of memory.
    pub fn queued_after(&self, after: u64, limit: usize) -> Result<Vec<u64>> {
        let Some(from) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        self.list_ids_from(
            &delivery_list(None, Some(DeliveryOutcome::Queued)),
            from,
            limit,
        )
    }

    /// Every queued delivery, in arrival order.
    pub fn queued_deliveries(&self) -> Result<Vec<u64>> {
        self.queued_after(0, usize::MAX)
    }

    /// Removes the one-key-per-delivery queue of a store written before the list of queued
    /// deliveries became the queue (the list holds the same deliveries), in batches of at
    /// most 100,000 keys. An older binary started on the store afterwards would find its
    /// queue empty: a downgrade across this change is not supported (docs/operations.md).
    pub(crate) fn drop_legacy_queue(&self) -> Result<()> {
        let mut b = crate::engine::Batch::default();
        let mut n = 0usize;
        for k in self
            .inner
            .records
            .scan_prefix(keys::legacy_queued_prefix())
            .keys()
        {
            b.remove(k?);
            n += 1;
            if n.is_multiple_of(100_000) {
                self.inner.records.apply_batch(std::mem::take(&mut b))?;
            }
        }
        if !n.is_multiple_of(100_000) {
            self.inner.records.apply_batch(b)?;
        }
        if n > 0 {
            tracing::info!(keys = n, "the old per-delivery queue keys were removed");
        }
        Ok(())
    }

    /// The delivery log, newest first.
    pub fn deliveries(&self) -> Result<Vec<Delivery>> {
        self.scan_rev(&keys::delivery_prefix())
    }

    /// The first `n` deliveries of the log (or of a project's), newest first, that have
    /// `outcome` and `reason`, and how many there are. A reason filter decodes the list it
    /// narrows; the others read the page and a counter.
    pub fn deliveries_page(
        &self,
        project: Option<u64>,
        outcome: Option<DeliveryOutcome>,
        reason: Option<&str>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<Delivery>, u64)> {
        let keep = |d: &Delivery| {
            outcome.is_none_or(|o| d.outcome == o)
                && reason.is_none_or(|r| d.reason.as_deref() == Some(r))
        };
        let key = keys::delivery;
        let all = delivery_list(project, None);
        let mut candidates = Vec::new();
        if let Some(o) = outcome {
            candidates.push(delivery_list(project, Some(o)));
        }
        Query {
            // No list per reason: the narrowest list there is gets walked.
            unlisted: reason.is_some(),
            candidates,
            all,
            lo: 0,
            hi: None,
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    /// Drops processed deliveries received before `log_before` (the log's retention), with
    /// their id entries and then the payload segments no delivery needs. The dedup window
    /// needs no pass: each id's entry carries its receipt time.
    pub fn expire_deliveries(&self, log_before: i64) -> Result<()> {
        // Before the scan: a batch the intake writes meanwhile lands in this segment or later.
        let current = self.inner.spool.current()?;
        let mut w = Writes::new();
        for kv in self.inner.records.scan_prefix(keys::delivery_prefix()) {
            let (_, v) = kv?;
            let d: Delivery = codec::decode(&v)?;
            if d.received_at >= log_before {
                break;
            }
            if d.outcome == DeliveryOutcome::Queued {
                continue;
            }
            w.delete_listed::<Delivery>(keys::delivery(d.seq));
            if self.on_postgres() {
                w.delete(keys::delivery_payload(d.seq));
            }
            // A later delivery may have reclaimed the id (on a shared engine, even while
            // this pass runs): its entry stays.
            w.0.remove_if(keys::delivery_by_id(&d.delivery_id), id_entry(&d));
        }
        self.apply(w)?;
        // The deletions are on disk before any payload goes, so a crash cannot bring back a
        // delivery whose payload is gone.
        self.flush_blocking()?;
        // Payload segments wholly below the oldest delivery still logged go too.
        let oldest = match self
            .inner
            .records
            .scan_prefix(keys::delivery_prefix())
            .next()
        {
            Some(kv) => keys::trailing_id(&kv?.0).unwrap_or(0),
            None => u64::MAX,
        };
        self.inner.spool.release_before(oldest, current)?;
        Ok(())
    }

    pub fn installation(&self, id: u64) -> Result<Option<Installation>> {
        self.get(&keys::installation(id))
    }

    /// Every installation, newest first (by `created_at`, the higher id first on a tie), as
    /// the contract orders lists; keyed by the host's ids, whose order is not the service's.
    pub fn installations(&self) -> Result<Vec<Installation>> {
        let mut v: Vec<Installation> = self.scan_rev(&keys::installation_prefix())?;
        v.sort_by_key(|i| std::cmp::Reverse((i.created_at, i.id)));
        Ok(v)
    }

    /// The binding of installation `id`, `None` for an installation never seen (no binding,
    /// not even an unbound one, was ever written). A binding to an organization since
    /// deleted reads as unbound.
    pub fn installation_binding_if_seen(&self, id: u64) -> Result<Option<InstallationBinding>> {
        let Some(mut b) = self.get::<InstallationBinding>(&keys::installation_binding(id))? else {
            return Ok(None);
        };
        if let Some(org) = b.organization_id
            && !self.inner.records.contains_key(keys::org(org))?
        {
            b.organization_id = None;
        }
        Ok(Some(b))
    }

    /// The organization `id` is bound to and those it left (unbound when never written, or
    /// when its organization was deleted).
    pub fn installation_binding(&self, id: u64) -> Result<InstallationBinding> {
        Ok(self.installation_binding_if_seen(id)?.unwrap_or_default())
    }

    /// Binds installations stored before installations belonged to organizations, once per
    /// data directory, and moves the index of links by name under each link's organization.
    /// An installation whose linked repositories (held or removed) are linked in exactly one
    /// organization is bound to it; one with none is bound to the service's only
    /// organization when it has exactly one; any other is recorded unbound, and stays so
    /// until a superuser binds it. Returns how many it bound.
    pub fn bind_installations(&self) -> Result<usize> {
        let mut bound = 0;
        self.once("installation_orgs_v1", || {
            let mut w = Writes::new();
            // name (lower-case) -> the organizations that link it.
            let mut orgs_of: std::collections::HashMap<String, Vec<u64>> =
                std::collections::HashMap::new();
            for kv in self
                .inner
                .records
                .scan_prefix(keys::legacy_repo_by_name_prefix())
            {
                let (k, v) = kv?;
                w.delete(k.to_vec());
                let Some((p, id)) = pair(&v) else { continue };
                let (Some(r), Some(project)) = (self.repo(p, id)?, self.project(p)?) else {
                    continue;
                };
                w.0.insert(
                    keys::repo_by_name(project.org_id, &r.full_name),
                    pair_bytes(&r),
                );
                let orgs = orgs_of.entry(r.full_name.to_ascii_lowercase()).or_default();
                if !orgs.contains(&project.org_id) {
                    orgs.push(project.org_id);
                }
            }
            let sole = self.sole_org()?;
            for i in self.installations()? {
                if self.installation_binding(i.id)?.organization_id.is_some() {
                    continue;
                }
                let mut orgs: Vec<u64> = Vec::new();
                for name in i.repositories.iter().chain(&i.removed) {
                    for o in orgs_of
                        .get(&name.to_ascii_lowercase())
                        .into_iter()
                        .flatten()
                    {
                        if !orgs.contains(o) {
                            orgs.push(*o);
                        }
                    }
                }
                let org = match orgs.as_slice() {
                    [one] => Some(*one),
                    [] => sole,
                    _ => None,
                };
                // One left unbound is recorded so, as seen: it is not bound later by the
                // rule for an installation first seen by a single-organization service.
                let mut b = InstallationBinding::default();
                if let Some(org) = org {
                    b.bind(org);
                    bound += 1;
                }
                w.put(keys::installation_binding(i.id), &b)?;
            }
            self.apply(w)
        })?;
        Ok(bound)
    }

    pub fn repo_hold(&self, full_name: &str) -> Result<Option<RepoHold>> {
        self.get(&keys::repo_hold(full_name))
    }

    pub fn repo(&self, project: u64, id: u64) -> Result<Option<RepoLink>> {
        self.get(&keys::repo(project, id))
    }

    /// The link of `full_name` in organization `org`.
    pub fn repo_by_name(&self, org: u64, full_name: &str) -> Result<Option<RepoLink>> {
        let Some(v) = self.inner.records.get(keys::repo_by_name(org, full_name))? else {
            return Ok(None);
        };
        match pair(&v) {
            Some((p, id)) => self.repo(p, id),
            None => Ok(None),
        }
    }

    pub fn project_repos(&self, project: u64) -> Result<Vec<RepoLink>> {
        self.scan_rev(&keys::repo_prefix(project))
    }

    pub fn run(&self, project: u64, id: u64) -> Result<Option<TestRun>> {
        self.get(&keys::run(project, id))
    }

    pub fn run_by_key(&self, idempotency_key: &str) -> Result<Option<TestRun>> {
        let Some(v) = self.inner.records.get(keys::run_by_key(idempotency_key))? else {
            return Ok(None);
        };
        match pair(&v) {
            Some((p, id)) => self.run(p, id),
            None => Ok(None),
        }
    }

    /// A page of a project's runs, newest first, and how many the query shows.
    pub fn runs_page(
        &self,
        project: u64,
        q: RunQuery<'_>,
        skip: usize,
        take: usize,
    ) -> Result<(Vec<TestRun>, u64)> {
        let keep = |r: &TestRun| {
            q.status.is_none_or(|s| r.status == s)
                && q.repository
                    .is_none_or(|x| r.repository.eq_ignore_ascii_case(x))
                && q.commit_sha
                    .is_none_or(|x| r.commit_sha.eq_ignore_ascii_case(x))
        };
        let key = |id| keys::run(project, id);
        let mut candidates = Vec::new();
        if let Some(s) = q.status {
            candidates.push(run_status_list(project, s));
        }
        if let Some(r) = q.repository {
            candidates.push(run_repo_list(project, r));
        }
        if let Some(c) = q.commit_sha {
            candidates.push(run_commit_list(project, c));
        }
        Query {
            unlisted: false,
            candidates,
            all: run_list(project),
            lo: 0,
            hi: None,
            keep: &keep,
            key: &key,
        }
        .run(self, skip, take)
    }

    /// The oldest queued run of a project. A queue entry whose run is no longer queued
    /// (read as another process's claim of it committed) is passed over.
    pub fn first_queued(&self, project: u64) -> Result<Option<TestRun>> {
        for kv in self
            .inner
            .records
            .scan_prefix(keys::run_queue_prefix(project))
            .take(64)
        {
            let (k, _) = kv?;
            if let Some(r) = keys::trailing_id(&k)
                .map(|id| self.run(project, id))
                .transpose()?
                .flatten()
                .filter(|r| r.status == RunStatus::Queued)
            {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    /// Every running run, as (project, id).
    pub fn running_runs(&self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for kv in self.inner.records.scan_prefix(keys::running_prefix()) {
            let (k, v) = kv?;
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) {
                out.push((p, id));
            }
        }
        Ok(out)
    }

    /// The highest `attempt` of any run of `project` of `sha` in `full_name`, whatever event
    /// made it.
    pub fn max_commit_attempt(
        &self,
        project: u64,
        full_name: &str,
        sha: &str,
    ) -> Result<Option<u32>> {
        let mut max = None;
        for kv in self
            .inner
            .records
            .scan_prefix(keys::commit_run_prefix(full_name, sha))
        {
            let (k, v) = kv?;
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) && p == project
                && let Some(r) = self.run(p, id)?
            {
                max = max.max(Some(r.attempt));
            }
        }
        Ok(max)
    }

    /// The runs of `sha` in `full_name` that belong to `project`, newest first, at most
    /// `limit` (the provenance of a capsule built from that commit).
    pub fn commit_runs(
        &self,
        project: u64,
        full_name: &str,
        sha: &str,
        limit: usize,
    ) -> Result<Vec<TestRun>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::commit_run_prefix(full_name, sha))
            .rev()
        {
            let (k, v) = kv?;
            if out.len() >= limit {
                break;
            }
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) && p == project
                && let Some(r) = self.run(p, id)?
            {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Builds the commit index of runs stored before it existed, once per data directory.
    pub fn backfill_commit_runs(&self) -> Result<()> {
        self.once("ix_commit_runs_v1", || {
            let mut batch = crate::engine::Batch::default();
            for kv in self.inner.records.scan_prefix(keys::all_runs_prefix()) {
                let (_, v) = kv?;
                let r: TestRun = codec::decode(&v)?;
                if !r.commit_sha.is_empty() {
                    batch.insert(
                        keys::commit_run(&r.repository, &r.commit_sha, r.id),
                        r.project_id.to_be_bytes().to_vec(),
                    );
                }
            }
            self.inner.records.apply_batch(batch)
        })
    }

    /// Lower-cases the commit of runs stored before commits were lower-cased at parse, once
    /// per data directory: the run, its commit list entry and its idempotency key (whose `@sha` part is the commit), so a redelivery of its event after
    /// the upgrade finds it, a rerequest counts its attempts, and a commit filter lists it.
    /// Where two runs' keys become one, the key index keeps the newer run (as a rerequest
    /// would); a run the index no longer pointed at stays unindexed.
    pub fn lowercase_run_commits(&self) -> Result<usize> {
        const DONE: &str = "runs_commit_lowercase_v1";
        if self.meta_get(DONE)?.is_some() {
            return Ok(0);
        }
        let mut changed = Vec::new();
        for kv in self.inner.records.scan_prefix(keys::all_runs_prefix()) {
            let (_, v) = kv?;
            let r: TestRun = codec::decode(&v)?;
            if r.commit_sha.bytes().any(|b| b.is_ascii_uppercase()) {
                changed.push(r);
            }
        }
        // The key index entries this pass writes, so runs folding into one key see each other.
        let mut slots: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        let mut w = Writes::new();
        for old in &changed {
            let mut r = old.clone();
            r.commit_sha = old.commit_sha.to_ascii_lowercase();
            r.idempotency_key = old.idempotency_key.replacen(
                &format!("@{}", old.commit_sha),
                &format!("@{}", r.commit_sha),
                1,
            );
            // The commit index (`keys::commit_run`) is case-blind already.
            w.put_listed(keys::run(r.project_id, r.id), &r)?;
            let held = self
                .inner
                .records
                .get(keys::run_by_key(&old.idempotency_key))?
                .and_then(|v| pair(&v))
                == Some((old.project_id, old.id));
            if held && r.idempotency_key != old.idempotency_key {
                w.delete(keys::run_by_key(&old.idempotency_key));
                let holder = match slots.get(&r.idempotency_key) {
                    Some(&id) => Some(id),
                    None => self
                        .inner
                        .records
                        .get(keys::run_by_key(&r.idempotency_key))?
                        .and_then(|v| pair(&v))
                        .map(|(_, id)| id),
                };
                if holder.is_none_or(|id| id < r.id) {
                    let mut v = r.project_id.to_be_bytes().to_vec();
                    v.extend_from_slice(&r.id.to_be_bytes());
                    w.0.insert(keys::run_by_key(&r.idempotency_key), v);
                    slots.insert(r.idempotency_key.clone(), r.id);
                }
            }
        }
        if !changed.is_empty() {
            self.apply(w)?;
            // On disk before the marker that says it was done (they are in different trees).
            self.flush_blocking()?;
        }
        self.meta_put(DONE, b"1")?;
        self.flush_blocking()?;
        Ok(changed.len())
    }

    /// The queued and running runs of `project` of a pull request.
    pub fn pr_runs_in_flight(
        &self,
        project: u64,
        full_name: &str,
        number: u64,
    ) -> Result<Vec<TestRun>> {
        let mut out = Vec::new();
        for kv in self
            .inner
            .records
            .scan_prefix(keys::pr_run_prefix(full_name, number))
        {
            let (k, v) = kv?;
            if let (Some(id), Some(p)) = (
                keys::trailing_id(&k),
                <[u8; 8]>::try_from(v.as_ref()).ok().map(u64::from_be_bytes),
            ) && p == project
                && let Some(r) = self.run(p, id)?
            {
                out.push(r);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::on_each_engine;

    fn delivery(seq: u64, received_at: i64) -> Delivery {
        let id = format!("00000000-0000-4000-8000-{seq:012}");
        Delivery::received(seq, id, "push".into(), received_at, true, 3)
    }

    /// The worker's outcome for `d`, then a retention pass expiring what was received
    /// before 5,000.
    fn process_and_expire(store: &Store, d: &Delivery) {
        let mut done = d.clone();
        done.outcome = DeliveryOutcome::Processed;
        let mut b = ScmBatch::default();
        b.finish_delivery(&done).unwrap();
        b.commit(store).unwrap();
        store.expire_deliveries(5_000).unwrap();
    }

    /// A delivery id is taken once within its window, decided by the store with the
    /// write (a second claim of it stores nothing), and again once the window passed; on
    /// each engine the taken delivery's payload reads back.
    fn a_delivery_id_is_claimed_once_within_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        // Three bytes: the length `delivery` records.
        let body = bytes::Bytes::from_static(b"{ }");
        let first = delivery(1, 1_000);
        let mut items = vec![(first.clone(), Some(body.clone()))];
        assert_eq!(store.claim_deliveries(&mut items, 0).unwrap(), [true]);
        let stored = store.delivery(1).unwrap().unwrap();
        assert_eq!(
            store.payload(&stored).unwrap().as_deref(),
            Some(&b"{ }"[..])
        );
        // The same id again, received later, within the window (since 500): refused.
        let mut again = delivery(2, 2_000);
        again.delivery_id = first.delivery_id.clone();
        let mut items = vec![(again.clone(), Some(body.clone()))];
        assert_eq!(store.claim_deliveries(&mut items, 500).unwrap(), [false]);
        assert!(
            store.delivery(2).unwrap().is_none(),
            "a duplicate stores nothing"
        );
        assert_eq!(
            store
                .delivery_by_id(&first.delivery_id)
                .unwrap()
                .unwrap()
                .seq,
            1
        );
        // Past the window (since 1,500): taken again, by the new seq.
        let mut items = vec![(again, Some(body))];
        assert_eq!(store.claim_deliveries(&mut items, 1_500).unwrap(), [true]);
        assert_eq!(
            store
                .delivery_by_id(&first.delivery_id)
                .unwrap()
                .unwrap()
                .seq,
            2
        );
    }
    on_each_engine!(a_delivery_id_is_claimed_once_within_its_window);

    /// Retention takes a processed delivery with its payload (on a shared engine, the
    /// payload's record), and leaves the id's entry to a later delivery that claimed it.
    fn retention_takes_a_delivery_with_its_payload_and_leaves_a_reclaimed_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let old = delivery(1, 1_000);
        let body = bytes::Bytes::from_static(b"{ }");
        store
            .claim_deliveries(&mut [(old.clone(), Some(body.clone()))], 0)
            .unwrap();
        // The same id again past its window (since 5,500), received at 6,000.
        let mut again = delivery(2, 6_000);
        again.delivery_id = old.delivery_id.clone();
        let taken = store
            .claim_deliveries(&mut [(again.clone(), Some(body))], 5_500)
            .unwrap();
        assert_eq!(taken, [true]);
        process_and_expire(&store, &old);
        assert!(store.delivery(1).unwrap().is_none());
        assert!(
            store
                .inner
                .records
                .get(keys::delivery_payload(1))
                .unwrap()
                .is_none()
        );
        assert!(store.is_claimed(&old.delivery_id, 5_500).unwrap());
        assert_eq!(
            store.delivery_by_id(&old.delivery_id).unwrap().unwrap().seq,
            2
        );
        let kept = store.delivery(2).unwrap().unwrap();
        assert_eq!(store.payload(&kept).unwrap().as_deref(), Some(&b"{ }"[..]));
    }
    on_each_engine!(retention_takes_a_delivery_with_its_payload_and_leaves_a_reclaimed_id);

    /// A delivery's outcome is written once: a second writer that read it queued (as
    /// the first did) gets a conflict, and the first outcome stands.
    fn a_delivery_is_worked_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let d = delivery(1, 1_000);
        store.claim_deliveries(&mut [(d.clone(), None)], 0).unwrap();
        let finish = |outcome| {
            let mut done = d.clone();
            done.outcome = outcome;
            let mut b = ScmBatch::default();
            b.finish_delivery(&done).unwrap();
            b.commit(&store)
        };
        finish(DeliveryOutcome::Dispatched).unwrap();
        assert!(matches!(
            finish(DeliveryOutcome::Skipped),
            Err(crate::StorageError::Conflict(_))
        ));
        assert_eq!(
            store.delivery(1).unwrap().unwrap().outcome,
            DeliveryOutcome::Dispatched
        );
    }
    on_each_engine!(a_delivery_is_worked_once);

    /// A run changed since its writer read it is not overwritten (two runners claiming
    /// one run: the second gets a conflict), and a new run cannot take an idempotency
    /// key a run of its project holds, while a rerun takes it over.
    fn run_writes_are_conditional_on_what_their_writer_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let r = store.new_run(run_fields("k")).unwrap();
        let mut b = ScmBatch::default();
        b.put_new_run(&r).unwrap();
        b.commit(&store).unwrap();
        let read = store.run(1, r.id).unwrap().unwrap();
        let claim = |lease| {
            let mut c = read.clone();
            c.status = RunStatus::Running;
            c.lease_expires_at = Some(lease);
            let mut b = ScmBatch::default();
            b.put_run(&read, &c).unwrap();
            b.commit(&store)
        };
        claim(1).unwrap();
        assert!(matches!(claim(2), Err(crate::StorageError::Conflict(_))));
        assert_eq!(
            store.run(1, r.id).unwrap().unwrap().lease_expires_at,
            Some(1)
        );

        let twin = store.new_run(run_fields("k")).unwrap();
        let mut b = ScmBatch::default();
        b.put_new_run(&twin).unwrap();
        assert!(matches!(
            b.commit(&store),
            Err(crate::StorageError::Conflict(_))
        ));
        assert!(
            store.run(1, twin.id).unwrap().is_none(),
            "nothing of it was written"
        );
        assert_eq!(store.run_by_key("k").unwrap().map(|r| r.id), Some(r.id));
        let rerun = store.new_run(run_fields("k")).unwrap();
        let mut b = ScmBatch::default();
        b.put_rerun(&rerun).unwrap();
        b.commit(&store).unwrap();
        assert_eq!(store.run_by_key("k").unwrap().map(|r| r.id), Some(rerun.id));
    }
    on_each_engine!(run_writes_are_conditional_on_what_their_writer_read);

    fn run_fields(key: &str) -> TestRun {
        TestRun {
            id: 0,
            project_id: 1,
            repository: "acme/robot".into(),
            commit_sha: "a".repeat(40),
            git_ref: "main".into(),
            event: "push".into(),
            pull_request_number: None,
            status: RunStatus::Queued,
            attempt: 1,
            idempotency_key: key.into(),
            delivery_id: None,
            summary: None,
            urls_json: b"{}".to_vec(),
            lease_expires_at: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    /// Run ids come a block at a time: one by one within an open, and a reopen starts past
    /// the block, so an id handed out before is never handed out again.
    fn new_runs_take_rising_ids_and_a_reopen_never_reuses_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let ids: Vec<u64> = (0..3)
            .map(|i| store.new_run(run_fields(&format!("k{i}"))).unwrap().id)
            .collect();
        assert_eq!(ids, vec![1, 2, 3]);
        let kept = store.new_run(run_fields("kept")).unwrap();
        let mut b = ScmBatch::default();
        b.put_new_run(&kept).unwrap();
        b.commit(&store).unwrap();
        store.flush_blocking().unwrap();
        drop(store);

        let store = Store::reopen(dir.path());
        assert_eq!(
            store.run(1, kept.id).unwrap().unwrap().idempotency_key,
            "kept"
        );
        let next = store.new_run(run_fields("next")).unwrap().id;
        assert_eq!(next, RUN_ID_BLOCK + 1, "past the whole block taken before");
        assert_eq!(store.new_run(run_fields("then")).unwrap().id, next + 1);
    }
    on_each_engine!(new_runs_take_rising_ids_and_a_reopen_never_reuses_one);

    /// A cancelled run takes its key's index entry with it only while the entry points at
    /// it: a newer run given the key (stored, or earlier in the same batch) keeps it.
    fn a_cancelled_run_removes_only_its_own_key_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        // Each new run takes the key over, as a rerequest does.
        let make = |b: &mut ScmBatch, key: &str| {
            let r = store.new_run(run_fields(key)).unwrap();
            b.put_rerun(&r).unwrap();
            store.run(1, r.id).unwrap().unwrap_or_else(|| (*r).clone())
        };
        let cancel = |b: &mut ScmBatch, r: &TestRun| {
            let mut c = store.run(1, r.id).unwrap().unwrap();
            let old = c.clone();
            c.status = RunStatus::Cancelled;
            b.put_run(&old, &c).unwrap();
        };
        let by_key = |k: &str| store.run_by_key(k).unwrap().map(|r| r.id);
        let commit = |b: ScmBatch| b.commit(&store).unwrap();

        // The key moved to a newer run before: cancelling the older leaves it there.
        let mut b = ScmBatch::default();
        let older = make(&mut b, "k");
        commit(b);
        let mut b = ScmBatch::default();
        let newer = make(&mut b, "k");
        commit(b);
        assert_eq!(by_key("k"), Some(newer.id));
        let mut b = ScmBatch::default();
        cancel(&mut b, &older);
        commit(b);
        assert_eq!(by_key("k"), Some(newer.id), "the newer run keeps its key");

        // The same within one batch: the newer run is made, then the older cancelled.
        let mut b = ScmBatch::default();
        let first = make(&mut b, "j");
        commit(b);
        let mut b = ScmBatch::default();
        let second = make(&mut b, "j");
        cancel(&mut b, &first);
        commit(b);
        assert_eq!(by_key("j"), Some(second.id));

        // The holder cancelled: its entry goes.
        let mut b = ScmBatch::default();
        cancel(&mut b, &newer);
        commit(b);
        assert_eq!(by_key("k"), None);
    }
    on_each_engine!(a_cancelled_run_removes_only_its_own_key_entry);

    /// Runs stored with an upper-case commit are lower-cased once, with every index that
    /// names the commit; where two keys fold into one, the newer run keeps the key.
    fn runs_stored_with_upper_case_commits_are_lower_cased_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let upper = "ABCDEF0123".repeat(4);
        let lower = upper.to_ascii_lowercase();
        let make = |sha: &str, key: &str, status: RunStatus| {
            let mut r = run_fields(key);
            r.commit_sha = sha.into();
            r.status = status;
            let r = store.new_run(r).unwrap();
            let mut b = ScmBatch::default();
            b.put_new_run(&r).unwrap();
            b.commit(&store).unwrap();
            r.id
        };
        // An old run, its key held; an older one of another commit whose lower-case key a
        // newer run already holds; and a cancelled one, holding no key.
        let held = make(
            &upper,
            &format!("acme/robot@{upper}@main"),
            RunStatus::Queued,
        );
        let other = "FEDCBA9876".repeat(4);
        let folded = make(
            &other,
            &format!("acme/robot@{other}#pr7"),
            RunStatus::Passed,
        );
        let newer = make(
            &other.to_ascii_lowercase(),
            &format!("acme/robot@{}#pr7", other.to_ascii_lowercase()),
            RunStatus::Queued,
        );
        let cancelled = make(
            &upper,
            &format!("acme/robot@{upper}#pr9"),
            RunStatus::Cancelled,
        );
        let by_commit = |sha: &str| {
            store
                .runs_page(
                    1,
                    RunQuery {
                        commit_sha: Some(sha),
                        ..Default::default()
                    },
                    0,
                    10,
                )
                .unwrap()
                .1
        };
        assert_eq!(
            by_commit(&lower),
            0,
            "not yet found by its lower-case commit"
        );

        assert_eq!(store.lowercase_run_commits().unwrap(), 3);
        let r = store.run(1, held).unwrap().unwrap();
        assert_eq!(r.commit_sha, lower);
        assert_eq!(r.idempotency_key, format!("acme/robot@{lower}@main"));
        let by_key = |k: &str| store.run_by_key(k).unwrap().map(|r| r.id);
        assert_eq!(by_key(&format!("acme/robot@{lower}@main")), Some(held));
        assert_eq!(by_key(&format!("acme/robot@{upper}@main")), None);
        let o = other.to_ascii_lowercase();
        assert_eq!(
            by_key(&format!("acme/robot@{o}#pr7")),
            Some(newer),
            "the newer run keeps the key"
        );
        assert_eq!(by_key(&format!("acme/robot@{other}#pr7")), None);
        assert_eq!(store.run(1, folded).unwrap().unwrap().commit_sha, o);
        assert_eq!(
            by_key(&format!("acme/robot@{lower}#pr9")),
            None,
            "a cancelled run holds none"
        );
        assert_eq!(by_commit(&lower), 2);
        assert_eq!(by_commit(&upper), 0, "the upper-case list is left empty");
        let ids: Vec<u64> = store
            .commit_runs(1, "acme/robot", &lower, 10)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec![cancelled, held]);
        assert_eq!(
            store.max_commit_attempt(1, "acme/robot", &o).unwrap(),
            Some(1)
        );

        // Once per data directory, across a reopen.
        make(&upper, "acme/robot@later", RunStatus::Queued);
        drop(store);
        let store = Store::reopen(dir.path());
        assert_eq!(store.lowercase_run_commits().unwrap(), 0);
    }
    on_each_engine!(runs_stored_with_upper_case_commits_are_lower_cased_once);

    /// Organizations 1 and 2 with projects 10 and 20, links written under the index by name
    /// alone (as before links were per organization), and three installations.
    fn installations_stored_before_organizations_are_bound_once_by_their_links() {
        use crate::{Membership, Organization, Project, Role};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        for (org, project) in [(1u64, 10u64), (2, 20)] {
            let o = Organization {
                id: org,
                slug: format!("o{org}"),
                name: String::new(),
                tier: "free".into(),
                created_at: 0,
            };
            let m = Membership {
                org_id: org,
                user_id: 1,
                role: Role::Owner,
                created_at: 0,
            };
            store.insert_org(&o, &m).unwrap();
            store
                .insert_project(&Project {
                    id: project,
                    org_id: org,
                    slug: "p".into(),
                    name: String::new(),
                    secret_hash: [0; 32],
                    created_at: 0,
                })
                .unwrap();
        }
        let mut w = Writes::new();
        let mut link = |project: u64, id: u64, name: &str| {
            let r = RepoLink {
                id,
                project_id: project,
                full_name: name.into(),
                branch_patterns: vec!["main".into()],
                include_drafts: false,
                created_at: 0,
                updated_at: 0,
            };
            w.put(keys::repo(project, id), &r).unwrap();
            let mut k = keys::legacy_repo_by_name_prefix();
            k.extend_from_slice(name.to_ascii_lowercase().as_bytes());
            w.0.insert(k, pair_bytes(&r));
        };
        link(10, 1, "Acme/One");
        link(10, 2, "acme/both");
        link(20, 3, "acme/both-too");
        link(20, 4, "acme/removed");
        store.apply(w).unwrap();
        let mut b = ScmBatch::default();
        let inst = |id: u64, held: &[&str], removed: &[&str]| Installation {
            id,
            account_login: "acme".into(),
            account_type: "Organization".into(),
            repository_selection: "selected".into(),
            state: crate::InstallationState::Active,
            repositories: held.iter().map(|s| s.to_string()).collect(),
            removed: removed.iter().map(|s| s.to_string()).collect(),
            created_at: id as i64,
            updated_at: 0,
        };
        // One organization's links (names compared case-blind); both; none.
        b.put_installation(&inst(100, &["acme/one"], &[])).unwrap();
        b.put_installation(&inst(200, &["acme/both"], &["acme/both-too"]))
            .unwrap();
        b.put_installation(&inst(300, &["acme/unlinked"], &[]))
            .unwrap();
        b.put_installation(&inst(400, &[], &["acme/removed"]))
            .unwrap();
        b.commit(&store).unwrap();

        assert_eq!(store.bind_installations().unwrap(), 2);
        let org = |id| store.installation_binding(id).unwrap().organization_id;
        assert_eq!(
            [org(100), org(200), org(300), org(400)],
            [Some(1), None, None, Some(2)]
        );
        // Those left unbound are recorded as seen, so they are not bound later by the rule for
        // an installation first seen by a single-organization service.
        for id in [200, 300] {
            assert!(store.installation_binding_if_seen(id).unwrap().is_some());
        }
        // The index now answers per organization only.
        assert_eq!(store.repo_by_name(1, "acme/ONE").unwrap().unwrap().id, 1);
        assert!(store.repo_by_name(2, "acme/one").unwrap().is_none());
        assert_eq!(
            store.repo_by_name(2, "acme/both-too").unwrap().unwrap().id,
            3
        );
        let legacy = store
            .inner
            .records
            .scan_prefix(keys::legacy_repo_by_name_prefix())
            .count();
        assert_eq!(legacy, 0);
        // Once per data directory.
        assert_eq!(store.bind_installations().unwrap(), 0);
    }
    on_each_engine!(installations_stored_before_organizations_are_bound_once_by_their_links);

    fn segments(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir.join("webhook-payloads"))
            .unwrap()
            .count()
    }

    /// The embedded store's payload log only (a shared engine keeps payloads as records).
    #[test]
    fn log_retention_deletes_payload_segments_only_once_no_delivery_needs_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        store
            .inner
            .spool
            .segment_bytes
            .store(1, std::sync::atomic::Ordering::Relaxed);
        // Three batches, one segment each: seqs 1, 2 (old) and 3 (new).
        let mut stored = Vec::new();
        for (seq, at) in [(1, 100), (2, 200), (3, 10_000)] {
            let mut item = [(delivery(seq, at), Some(bytes::Bytes::from_static(b"abc")))];
            store.claim_deliveries(&mut item, i64::MAX).unwrap();
            stored.push(item[0].0.clone());
        }
        assert_eq!(segments(dir.path()), 3);
        assert_eq!(store.payload(&stored[0]).unwrap().unwrap(), b"abc");

        // Seq 1 still queued: kept whatever its age, and so is every later segment.
        process_and_expire(&store, &stored[1]);
        assert_eq!(segments(dir.path()), 3);
        assert!(store.delivery(2).unwrap().is_none());
        assert_eq!(store.payload(&stored[0]).unwrap().unwrap(), b"abc");

        // Once seq 1 is processed and expired, segments 1 and 2 go; 3 (open) stays.
        process_and_expire(&store, &stored[0]);
        assert_eq!(segments(dir.path()), 1);
        assert!(
            store.payload(&stored[0]).is_err(),
            "a missing segment is damage"
        );
        assert_eq!(store.payload(&stored[2]).unwrap().unwrap(), b"abc");
    }

    /// A store written when the queue was one key per delivery: the keys go at open, and
    /// the queue (the list of queued deliveries) still holds the deliveries, in order, until
    /// each is worked.
    #[test]
    fn a_legacy_queue_is_dropped_at_open_and_the_list_is_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let first = store.new_ids(Seq::Delivery, 3).unwrap();
        let mut items: Vec<_> = (first..first + 3)
            .map(|s| (delivery(s, 100), Some(bytes::Bytes::from_static(b"p"))))
            .collect();
        store.claim_deliveries(&mut items, i64::MAX).unwrap();
        let legacy = keys::legacy_queued_prefix();
        for s in first..first + 3 {
            let mut k = legacy.clone();
            k.extend_from_slice(&s.to_be_bytes());
            store.inner.records.insert(k, Vec::new()).unwrap();
        }
        store.flush_blocking().unwrap();
        drop(store);

        let store = Store::reopen(dir.path());
        assert_eq!(store.inner.records.scan_prefix(&legacy).count(), 0);
        assert_eq!(
            store.queued_after(0, 10).unwrap(),
            (first..first + 3).collect::<Vec<_>>()
        );
        assert_eq!(store.queued_after(first, 1).unwrap(), vec![first + 1]);
        let mut d = store.delivery(first + 1).unwrap().unwrap();
        d.outcome = DeliveryOutcome::Processed;
        let mut b = ScmBatch::default();
        b.finish_delivery(&d).unwrap();
        b.commit(&store).unwrap();
        assert_eq!(store.queued_deliveries().unwrap(), vec![first, first + 2]);
        assert_eq!(store.deliveries_queued().unwrap(), 2);
    }

    /// A batch the intake journaled and answered for, which sled lost in a crash, is written
    /// again at open: claimed, queued, its payload readable, its seq never handed out again.
    /// An id claimed before by an earlier delivery (past its window) is claimed again; of two
    /// lost deliveries of one id the later is kept; a torn tail sends the next batch to a new
    /// segment, where the next open still finds its journal.
    #[test]
    fn journaled_batches_sled_lost_are_recovered_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let first = store.new_ids(Seq::Delivery, 1).unwrap();
        let mut item = [(
            delivery(first, 100),
            Some(bytes::Bytes::from_static(b"one")),
        )];
        store.claim_deliveries(&mut item, i64::MAX).unwrap();

        // The crash: seqs s..s+4 reach the journal, never sled: s with a payload, s+1 an
        // ignored event, s+2 seq 1's id again, s+3 and s+4 one id twice.
        let s = store.new_ids(Seq::Delivery, 5).unwrap();
        let mut lost = vec![
            delivery(s, 200),
            Delivery::received(s + 1, "star-id".into(), "star".into(), 200, false, 0),
            delivery(s + 2, 200),
            delivery(s + 3, 200),
            delivery(s + 4, 200),
        ];
        lost[2].delivery_id = item[0].0.delivery_id.clone();
        lost[4].delivery_id = lost[3].delivery_id.clone();
        store
            .inner
            .spool
            .append_journaled(s, &[(s, b"two")], |at| {
                lost[0].payload_at = at.first().copied();
                journal_record(s + 4, &lost).map(Some)
            })
            .unwrap();
        // A counter rolled back with sled's lost tail.
        store
            .inner
            .seq
            .insert(Seq::Delivery.name().as_bytes(), &first.to_be_bytes()[..])
            .unwrap();
        store.flush_blocking().unwrap();
        drop(store);

        let store = Store::reopen(dir.path());
        assert_eq!(store.deliveries_recovered(), 4);
        let two = store.delivery(s).unwrap().expect("recovered");
        assert_eq!(two.outcome, DeliveryOutcome::Queued);
        assert_eq!(store.payload(&two).unwrap().unwrap(), b"two");
        assert!(store.is_claimed(&two.delivery_id, 0).unwrap());
        let star = store.delivery_by_id("star-id").unwrap().expect("recovered");
        assert_eq!(star.outcome, DeliveryOutcome::Ignored);
        assert_eq!(
            store
                .delivery_by_id(&item[0].0.delivery_id)
                .unwrap()
                .unwrap()
                .seq,
            s + 2,
            "claimed again, as the intake did"
        );
        assert!(
            store.delivery(s + 3).unwrap().is_none(),
            "the later one is kept"
        );
        assert_eq!(
            store
                .delivery_by_id(&lost[3].delivery_id)
                .unwrap()
                .unwrap()
                .seq,
            s + 4
        );
        assert_eq!(
            store.queued_after(0, 10).unwrap(),
            vec![first, s, s + 2, s + 4]
        );
        assert!(store.new_ids(Seq::Delivery, 1).unwrap() > s + 4);

        // A torn tail: the next batch goes to a new segment, and its journal is found.
        let seg = dir.path().join("webhook-payloads");
        let count = std::fs::read_dir(&seg).unwrap().count();
        let path = std::fs::read_dir(&seg)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max()
            .unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, &[0xff; 5]).unwrap();
        drop(f);
        drop(store);
        let store = Store::reopen(dir.path());
        let next = store.new_ids(Seq::Delivery, 1).unwrap();
        store
            .inner
            .spool
            .append_journaled(next, &[], |_| {
                journal_record(next, &[delivery(next, 300)]).map(Some)
            })
            .unwrap();
        assert_eq!(std::fs::read_dir(&seg).unwrap().count(), count + 1);
        store.flush_blocking().unwrap();
        drop(store);
        let store = Store::reopen(dir.path());
        assert!(store.delivery(next).unwrap().is_some());
    }

    /// The journal `claim_deliveries` writes brings back what it stored: here sled's copy is
    /// taken away (worked, then expired) and the watermark moved back, as a crash before
    /// sled's flush would leave it.
    /// The embedded store's payload log only (a shared engine keeps payloads as records).
    #[test]
    fn the_intakes_own_journal_restores_its_deliveries() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open(dir.path());
        let seq = store.new_ids(Seq::Delivery, 2).unwrap();
        let mut items = [
            (delivery(seq, 1), Some(bytes::Bytes::from_static(b"abc"))),
            (
                Delivery::received(seq + 1, "ignored-id".into(), "star".into(), 1, false, 0),
                None,
            ),
        ];
        store.claim_deliveries(&mut items, i64::MAX).unwrap();
        let stored = items[0].0.clone();
        process_and_expire(&store, &stored);
        assert!(store.delivery(seq).unwrap().is_none());
        assert!(store.delivery(seq + 1).unwrap().is_none());
        store
            .inner
            .records
            .insert(keys::journal_applied(), (seq - 1).to_be_bytes())
            .unwrap();
        store.flush_blocking().unwrap();
        drop(store);

        let store = Store::reopen(dir.path());
        assert_eq!(store.deliveries_recovered(), 2);
        let d = store.delivery(seq).unwrap().expect("restored");
        assert_eq!(d.outcome, DeliveryOutcome::Queued);
        assert_eq!(d.payload_at, stored.payload_at);
        assert_eq!(store.payload(&d).unwrap().unwrap(), b"abc");
        assert!(store.delivery_by_id("ignored-id").unwrap().is_some());
        assert_eq!(store.verify_lists().unwrap(), Vec::<String>::new());
    }
}
