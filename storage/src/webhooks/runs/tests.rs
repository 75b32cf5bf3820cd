use super::*;
use crate::testing::on_each_engine;

/// A run changed since its writer read it is not overwritten (two runners claiming
/// one run: the second gets a conflict), and a new run cannot take an idempotency
/// key a run of its project holds, while a rerun takes it over.
fn run_writes_are_conditional_on_what_their_writer_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::testing::open(dir.path());
    let r = store.new_run(run_fields("k")).unwrap();
    let mut b = WebhookBatch::default();
    b.put_new_run(&r).unwrap();
    b.commit(&store).unwrap();
    let read = store.run(1, r.id).unwrap().unwrap();
    let claim = |lease| {
        let mut c = read.clone();
        c.status = RunStatus::Running;
        c.lease_expires_at = Some(lease);
        let mut b = WebhookBatch::default();
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
    let mut b = WebhookBatch::default();
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
    let mut b = WebhookBatch::default();
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
    let mut b = WebhookBatch::default();
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
    let make = |b: &mut WebhookBatch, key: &str| {
        let r = store.new_run(run_fields(key)).unwrap();
        b.put_rerun(&r).unwrap();
        store.run(1, r.id).unwrap().unwrap_or_else(|| (*r).clone())
    };
    let cancel = |b: &mut WebhookBatch, r: &TestRun| {
        let mut c = store.run(1, r.id).unwrap().unwrap();
        let old = c.clone();
        c.status = RunStatus::Cancelled;
        b.put_run(&old, &c).unwrap();
    };
    let by_key = |k: &str| store.run_by_key(k).unwrap().map(|r| r.id);
    let commit = |b: WebhookBatch| b.commit(&store).unwrap();

    // The key moved to a newer run before: cancelling the older leaves it there.
    let mut b = WebhookBatch::default();
    let older = make(&mut b, "k");
    commit(b);
    let mut b = WebhookBatch::default();
    let newer = make(&mut b, "k");
    commit(b);
    assert_eq!(by_key("k"), Some(newer.id));
    let mut b = WebhookBatch::default();
    cancel(&mut b, &older);
    commit(b);
    assert_eq!(by_key("k"), Some(newer.id), "the newer run keeps its key");

    // The same within one batch: the newer run is made, then the older cancelled.
    let mut b = WebhookBatch::default();
    let first = make(&mut b, "j");
    commit(b);
    let mut b = WebhookBatch::default();
    let second = make(&mut b, "j");
    cancel(&mut b, &first);
    commit(b);
    assert_eq!(by_key("j"), Some(second.id));

    // The holder cancelled: its entry goes.
    let mut b = WebhookBatch::default();
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
        let mut b = WebhookBatch::default();
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
    let mut b = WebhookBatch::default();
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
