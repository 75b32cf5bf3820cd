//! The delivery log: the dedup window (a delivery's id claimed with its write), the intake
//! and its journal in the payload log, the worker's queue (the list of queued deliveries) and
//! retention.

use super::*;

/// The delivery log's lists: every delivery, or a project's, each whole or by outcome.
pub(super) fn delivery_list(project: Option<u64>, outcome: Option<DeliveryOutcome>) -> ListId {
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

/// A batch's journal record: its last seq (so an applied batch is skipped unread), then
/// its deliveries as stored.
pub(super) fn journal_record(last: u64, deliveries: &[Delivery]) -> Result<Vec<u8>> {
    let mut j = last.to_be_bytes().to_vec();
    j.extend_from_slice(&codec::encode(&deliveries)?);
    Ok(j)
}

pub(super) fn bad_journal(applied: u64) -> crate::StorageError {
    crate::StorageError::Corrupt(format!(
        "a journal record in the payload log past seq {applied} is shorter than its header"
    ))
}

/// The writes that claim a delivery's id and store it. A delivery stored `Queued` is in the
/// worker's queue: the list of queued deliveries, ordered by seq, is the queue.
pub(super) fn claim_writes(w: &mut Writes, d: &Delivery) -> Result<()> {
    w.0.insert(keys::delivery_by_id(&d.delivery_id), id_entry(d));
    w.put_listed(keys::delivery(d.seq), d)
}

/// What a delivery's id maps to: its seq and its receipt time (big-endian), so the dedup
/// window is one read. Retention removes the entry only while it is still these bytes.
pub(super) fn id_entry(d: &Delivery) -> Vec<u8> {
    let mut entry = d.seq.to_be_bytes().to_vec();
    entry.extend_from_slice(&d.received_at.to_be_bytes());
    entry
}

/// Whether an id's entry (read with the write) says a delivery received at or after
/// `since` holds the id.
pub(super) fn held_since(entry: Option<&[u8]>, since: i64) -> bool {
    entry
        .and_then(pair)
        .is_some_and(|(_, at)| at as i64 >= since)
}

impl Store {
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
            .payload_log
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
            if let Err(cut) = self.inner.payload_log.cut_back(mark) {
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
        let log = &self.inner.payload_log;
        let counter = self.current_id(Seq::Delivery)?;
        let newest_segment = log.last_segment()?.unwrap_or(0);
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
            log.start_new_segment()?;
            self.raise_ids(Seq::Delivery, from)?;
            self.inner
                .records
                .insert(keys::journal_applied(), from.to_be_bytes())?;
            self.inner.db.flush()?;
            return Ok(0);
        };
        let (journals, torn) = log.journals_after(applied)?;
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
            log.start_new_segment()?;
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
            Some(at) => match self.inner.payload_log.read(at, d.payload_len)? {
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
        let current = self.inner.payload_log.current()?;
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
        self.inner.payload_log.release_before(oldest, current)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
