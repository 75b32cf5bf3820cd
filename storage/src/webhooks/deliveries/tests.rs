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
    let mut b = WebhookBatch::default();
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
        let mut b = WebhookBatch::default();
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
        .payload_log
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
    let mut b = WebhookBatch::default();
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
        .payload_log
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
        .payload_log
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
