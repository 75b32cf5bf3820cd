//! Every key layout, in one place. All keys start with `v1/`; ids are big-endian so that a
//! prefix scan returns them in id order (creation order).

pub(crate) const V: &[u8] = b"v1/";

fn key(parts: &[&[u8]]) -> Vec<u8> {
    let mut k = V.to_vec();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            k.push(b'/');
        }
        k.extend_from_slice(p);
    }
    k
}

/// A time as a list order. Times before 1970 count as 1970: a negative time mapped onto the
/// upper half would put long runs of 0xff in keys, which sled 0.34's reverse iteration
/// cannot step across (it seeks a node's predecessor with only four 0xff bytes and panics).
pub(crate) fn ord(t: i64) -> u64 {
    t.max(0) as u64
}

fn be(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

// Users.
pub(crate) fn user(id: u64) -> Vec<u8> {
    key(&[b"u", &be(id)])
}
pub(crate) fn user_by_email(email: &str) -> Vec<u8> {
    key(&[b"ix-email", email.as_bytes()])
}
pub(crate) fn user_prefix() -> Vec<u8> {
    key(&[b"u", b""])
}

// Organizations and memberships.
pub(crate) fn org(id: u64) -> Vec<u8> {
    key(&[b"o", &be(id)])
}
/// How many reservations of the organization's storage were written: each bumps it, on
/// the condition that it still holds what the reservation's count was made under.
pub(crate) fn quota_epoch(org: u64) -> Vec<u8> {
    key(&[b"o-quota", &be(org)])
}
pub(crate) fn org_by_slug(slug: &str) -> Vec<u8> {
    key(&[b"ix-oslug", slug.as_bytes()])
}
pub(crate) fn member(org: u64, user: u64) -> Vec<u8> {
    key(&[b"m", &be(org), &be(user)])
}
pub(crate) fn member_prefix(org: u64) -> Vec<u8> {
    key(&[b"m", &be(org), b""])
}
pub(crate) fn user_org(user: u64, org: u64) -> Vec<u8> {
    key(&[b"um", &be(user), &be(org)])
}
/// An organization whose data is still being purged (its record, kept until the purge ends).
pub(crate) fn org_deletion(org: u64) -> Vec<u8> {
    key(&[b"odel", &be(org)])
}
pub(crate) fn org_deletion_prefix() -> Vec<u8> {
    key(&[b"odel", b""])
}
pub(crate) fn user_org_prefix(user: u64) -> Vec<u8> {
    key(&[b"um", &be(user), b""])
}

/// A signed-out sign-in: a user and the sign-in its tokens descend from.
pub(crate) fn signed_out(user: u64, sign_in: &str) -> Vec<u8> {
    key(&[b"so", &be(user), sign_in.as_bytes()])
}
pub(crate) fn signed_out_prefix() -> Vec<u8> {
    key(&[b"so", b""])
}

// Projects.
pub(crate) fn project(id: u64) -> Vec<u8> {
    key(&[b"p", &be(id)])
}
pub(crate) fn project_by_slug(org: u64, slug: &str) -> Vec<u8> {
    key(&[b"ix-pslug", &be(org), slug.as_bytes()])
}
pub(crate) fn org_project(org: u64, project: u64) -> Vec<u8> {
    key(&[b"op", &be(org), &be(project)])
}
pub(crate) fn org_project_prefix(org: u64) -> Vec<u8> {
    key(&[b"op", &be(org), b""])
}

// API keys.
pub(crate) fn api_key(id: u64) -> Vec<u8> {
    key(&[b"k", &be(id)])
}
pub(crate) fn api_key_by_hash(hash: &[u8; 32]) -> Vec<u8> {
    key(&[b"ix-khash", hash])
}
pub(crate) fn user_key(user: u64, id: u64) -> Vec<u8> {
    key(&[b"uk", &be(user), &be(id)])
}
pub(crate) fn user_key_prefix(user: u64) -> Vec<u8> {
    key(&[b"uk", &be(user), b""])
}

// Devices and groups.
pub(crate) fn device(project: u64, id: u64) -> Vec<u8> {
    key(&[b"d", &be(project), &be(id)])
}
pub(crate) fn device_prefix(project: u64) -> Vec<u8> {
    key(&[b"d", &be(project), b""])
}
pub(crate) fn device_by_token(hash: &[u8; 32]) -> Vec<u8> {
    key(&[b"ix-dtok", hash])
}
pub(crate) fn group(project: u64, id: u64) -> Vec<u8> {
    key(&[b"g", &be(project), &be(id)])
}
pub(crate) fn group_prefix(project: u64) -> Vec<u8> {
    key(&[b"g", &be(project), b""])
}

// Sessions: the record, its counters, its log chunks (in the `logs` tree).
pub(crate) fn session(project: u64, id: u64) -> Vec<u8> {
    key(&[b"s", &be(project), &be(id)])
}
pub(crate) fn session_prefix(project: u64) -> Vec<u8> {
    key(&[b"s", &be(project), b""])
}
pub(crate) fn session_project(id: u64) -> Vec<u8> {
    key(&[b"ix-sproj", &be(id)])
}
pub(crate) fn session_counters(id: u64) -> Vec<u8> {
    key(&[b"sc", &be(id)])
}
/// The last batch sequence number a session's sender had stored ([`crate::Store::append_batch`]).
pub(crate) fn session_batch_seq(id: u64) -> Vec<u8> {
    key(&[b"sbs", &be(id)])
}
pub(crate) fn log_chunk(session: u64, seq: u64) -> Vec<u8> {
    key(&[b"l", &be(session), &be(seq)])
}
pub(crate) fn log_prefix(session: u64) -> Vec<u8> {
    key(&[b"l", &be(session), b""])
}
/// A chunk's [`crate::LogSummary`], in the logs tree beside it.
pub(crate) fn log_summary(session: u64, seq: u64) -> Vec<u8> {
    key(&[b"ls", &be(session), &be(seq)])
}
pub(crate) fn log_summary_prefix(session: u64) -> Vec<u8> {
    key(&[b"ls", &be(session), b""])
}
/// A chunk's text filter ([`crate::sessions::text_filter`]), in the logs tree beside it.
pub(crate) fn log_text_filter(session: u64, seq: u64) -> Vec<u8> {
    key(&[b"lt", &be(session), &be(seq)])
}
pub(crate) fn log_text_filter_prefix(session: u64) -> Vec<u8> {
    key(&[b"lt", &be(session), b""])
}
/// Where a sealed chunk is in the blob store ([`crate::sessions::segments::ChunkLocation`]).
pub(crate) fn log_location(session: u64, seq: u64) -> Vec<u8> {
    key(&[b"lo", &be(session), &be(seq)])
}
pub(crate) fn log_location_prefix(session: u64) -> Vec<u8> {
    key(&[b"lo", &be(session), b""])
}
/// A segment whose session was deleted: to be deleted from the blob store.
pub(crate) fn doomed_segment(segment: &str) -> Vec<u8> {
    key(&[b"ldel", segment.as_bytes()])
}
pub(crate) fn doomed_segment_prefix() -> Vec<u8> {
    key(&[b"ldel", b""])
}
/// The first chunk sequence number of a session not sealed yet ([`crate::sessions::seal`]).
pub(crate) fn log_seal_cursor(session: u64) -> Vec<u8> {
    key(&[b"lq", &be(session)])
}
/// Present while a session has unsealed chunks: when the oldest of them arrived.
pub(crate) fn log_pending(session: u64) -> Vec<u8> {
    key(&[b"lp", &be(session)])
}
pub(crate) fn log_pending_prefix() -> Vec<u8> {
    key(&[b"lp", b""])
}

pub(crate) fn artifact(session: u64, path: &str) -> Vec<u8> {
    key(&[b"a", &be(session), path.as_bytes()])
}
pub(crate) fn artifact_prefix(session: u64) -> Vec<u8> {
    key(&[b"a", &be(session), b""])
}

pub(crate) fn capsule(project: u64, id: u64) -> Vec<u8> {
    key(&[b"c", &be(project), &be(id)])
}
/// A capsule confirm answered 202 whose validation has not finished; the value is the
/// checksum the client gave.
pub(crate) fn pending_validation(project: u64, id: u64) -> Vec<u8> {
    key(&[b"cpv", &be(project), &be(id)])
}
pub(crate) fn pending_validation_prefix() -> Vec<u8> {
    key(&[b"cpv", b""])
}
pub(crate) fn capsule_prefix(project: u64) -> Vec<u8> {
    key(&[b"c", &be(project), b""])
}
/// Names cannot hold `/` (they match `[A-Za-z0-9][A-Za-z0-9._-]*`), so the separator is safe.
pub(crate) fn capsule_by_version(project: u64, name: &str, version: &str) -> Vec<u8> {
    key(&[
        b"ix-cver",
        &be(project),
        name.as_bytes(),
        version.as_bytes(),
    ])
}

pub(crate) fn config(project: u64, id: u64) -> Vec<u8> {
    key(&[b"cf", &be(project), &be(id)])
}
pub(crate) fn config_prefix(project: u64) -> Vec<u8> {
    key(&[b"cf", &be(project), b""])
}
pub(crate) fn config_by_version(project: u64, name: &str, version: &str) -> Vec<u8> {
    key(&[
        b"ix-cfver",
        &be(project),
        name.as_bytes(),
        version.as_bytes(),
    ])
}
pub(crate) fn deployment(project: u64, id: u64) -> Vec<u8> {
    key(&[b"dp", &be(project), &be(id)])
}
pub(crate) fn deployment_prefix(project: u64) -> Vec<u8> {
    key(&[b"dp", &be(project), b""])
}
pub(crate) fn device_result(deployment: u64, device: u64) -> Vec<u8> {
    key(&[b"dr", &be(deployment), &be(device)])
}
pub(crate) fn device_result_prefix(deployment: u64) -> Vec<u8> {
    key(&[b"dr", &be(deployment), b""])
}
/// A project's rollout results by the time they came (each result's latest report only), so
/// the results of the last minutes are read without reading every result the project keeps.
pub(crate) fn result_by_time(project: u64, at: i64, deployment: u64, device: u64) -> Vec<u8> {
    key(&[
        b"drt",
        &be(project),
        &be(ord(at)),
        &be(deployment),
        &be(device),
    ])
}
/// Where a project's results by time from `at` on start.
pub(crate) fn result_by_time_from(project: u64, at: i64) -> Vec<u8> {
    key(&[b"drt", &be(project), &be(ord(at))])
}
pub(crate) fn all_device_results_prefix() -> Vec<u8> {
    key(&[b"dr", b""])
}
pub(crate) fn result_by_time_prefix(project: u64) -> Vec<u8> {
    key(&[b"drt", &be(project), b""])
}
// Device updates: the latest state per (package, device), each device's report history
// (oldest first), and per-package rollout plans.
pub(crate) fn device_progress(deployment: u64, device: u64) -> Vec<u8> {
    key(&[b"dps", &be(deployment), &be(device)])
}
pub(crate) fn device_progress_prefix(deployment: u64) -> Vec<u8> {
    key(&[b"dps", &be(deployment), b""])
}
/// How many times a member offered a package again to a device that failed it.
pub(crate) fn device_offer(deployment: u64, device: u64) -> Vec<u8> {
    key(&[b"dpo", &be(deployment), &be(device)])
}
pub(crate) fn device_offer_prefix(deployment: u64) -> Vec<u8> {
    key(&[b"dpo", &be(deployment), b""])
}
pub(crate) fn device_history(device: u64, at: i64, deployment: u64, state: u8) -> Vec<u8> {
    let at = u64::try_from(at.max(0)).unwrap_or(0);
    key(&[b"dh", &be(device), &be(at), &be(deployment), &[state]])
}
pub(crate) fn device_history_prefix(device: u64) -> Vec<u8> {
    key(&[b"dh", &be(device), b""])
}
pub(crate) fn rollout(deployment: u64) -> Vec<u8> {
    key(&[b"ro", &be(deployment)])
}
pub(crate) fn rollout_prefix() -> Vec<u8> {
    key(&[b"ro", b""])
}
pub(crate) fn capsule_source(capsule: u64) -> Vec<u8> {
    key(&[b"csrc", &be(capsule)])
}
/// A project's own log retention ([`crate::sessions::LogRetention`]).
pub(crate) fn project_log_retention(project: u64) -> Vec<u8> {
    key(&[b"plr", &be(project)])
}
pub(crate) fn project_policy(project: u64) -> Vec<u8> {
    key(&[b"ppol", &be(project)])
}

// Inbound webhooks.
pub(crate) fn delivery_by_id(delivery_id: &str) -> Vec<u8> {
    key(&[b"ix-wd", delivery_id.as_bytes()])
}
pub(crate) fn delivery(seq: u64) -> Vec<u8> {
    key(&[b"wd", &be(seq)])
}
pub(crate) fn delivery_prefix() -> Vec<u8> {
    key(&[b"wd", b""])
}
/// A delivery's payload, on an engine other processes share (the embedded store keeps
/// payloads in the data directory's payload log).
pub(crate) fn delivery_payload(seq: u64) -> Vec<u8> {
    key(&[b"wd-payload", &be(seq)])
}
/// The last seq of the intake's batches sled holds (written with each batch).
pub(crate) fn journal_applied() -> Vec<u8> {
    key(&[b"wdj"])
}
/// The worker's old queue, one key per queued delivery, which older stores hold; the list of
/// queued deliveries took its place, and these keys are only removed, at open.
pub(crate) fn legacy_queued_prefix() -> Vec<u8> {
    key(&[b"wdq", b""])
}
pub(crate) fn installation(id: u64) -> Vec<u8> {
    key(&[b"inst", &be(id)])
}
pub(crate) fn installation_prefix() -> Vec<u8> {
    key(&[b"inst", b""])
}
/// Repository names are compared case-insensitively, as the host does.
pub(crate) fn repo_hold(full_name: &str) -> Vec<u8> {
    key(&[b"ix-hold", full_name.to_ascii_lowercase().as_bytes()])
}
pub(crate) fn repo(project: u64, id: u64) -> Vec<u8> {
    key(&[b"repo", &be(project), &be(id)])
}
pub(crate) fn repo_prefix(project: u64) -> Vec<u8> {
    key(&[b"repo", &be(project), b""])
}
/// A link by its organization and name: a repository links to one project at most within an
/// organization, and links of different organizations never meet.
pub(crate) fn repo_by_name(org: u64, full_name: &str) -> Vec<u8> {
    key(&[
        b"ix-orepo",
        &be(org),
        full_name.to_ascii_lowercase().as_bytes(),
    ])
}
/// The index of links by name alone, which stores written before links were per organization
/// hold; only read and removed, once, at open.
pub(crate) fn legacy_repo_by_name_prefix() -> Vec<u8> {
    key(&[b"ix-repo", b""])
}
/// The organization an installation is bound to.
pub(crate) fn installation_binding(id: u64) -> Vec<u8> {
    key(&[b"inst-org", &be(id)])
}
pub(crate) fn run(project: u64, id: u64) -> Vec<u8> {
    key(&[b"tr", &be(project), &be(id)])
}
pub(crate) fn run_prefix(project: u64) -> Vec<u8> {
    key(&[b"tr", &be(project), b""])
}
pub(crate) fn run_queue(project: u64, id: u64) -> Vec<u8> {
    key(&[b"trq", &be(project), &be(id)])
}
pub(crate) fn run_queue_prefix(project: u64) -> Vec<u8> {
    key(&[b"trq", &be(project), b""])
}
pub(crate) fn running(id: u64) -> Vec<u8> {
    key(&[b"trr", &be(id)])
}
pub(crate) fn running_prefix() -> Vec<u8> {
    key(&[b"trr", b""])
}
pub(crate) fn run_by_key(idempotency_key: &str) -> Vec<u8> {
    key(&[b"ix-trk", idempotency_key.as_bytes()])
}
/// In-flight runs of a pull request. `#` cannot occur in a repository name.
pub(crate) fn pr_run(full_name: &str, number: u64, id: u64) -> Vec<u8> {
    key(&[
        b"ix-trpr",
        format!("{}#{number}", full_name.to_ascii_lowercase()).as_bytes(),
        &be(id),
    ])
}
pub(crate) fn pr_run_prefix(full_name: &str, number: u64) -> Vec<u8> {
    key(&[
        b"ix-trpr",
        format!("{}#{number}", full_name.to_ascii_lowercase()).as_bytes(),
        b"",
    ])
}

/// Every run of a commit in a repository (any event, any status), for the next attempt of a
/// rerequested check suite. `@` cannot occur in a repository name.
pub(crate) fn commit_run(full_name: &str, sha: &str, id: u64) -> Vec<u8> {
    key(&[
        b"ix-trc",
        format!(
            "{}@{}",
            full_name.to_ascii_lowercase(),
            sha.to_ascii_lowercase()
        )
        .as_bytes(),
        &be(id),
    ])
}
pub(crate) fn commit_run_prefix(full_name: &str, sha: &str) -> Vec<u8> {
    key(&[
        b"ix-trc",
        format!(
            "{}@{}",
            full_name.to_ascii_lowercase(),
            sha.to_ascii_lowercase()
        )
        .as_bytes(),
        b"",
    ])
}
/// Every run of every project.
pub(crate) fn all_runs_prefix() -> Vec<u8> {
    key(&[b"tr", b""])
}

/// Every record of a listed family, all projects (list indexes are rebuilt from these).
pub(crate) fn all_devices_prefix() -> Vec<u8> {
    key(&[b"d", b""])
}
pub(crate) fn all_sessions_prefix() -> Vec<u8> {
    key(&[b"s", b""])
}
pub(crate) fn all_configs_prefix() -> Vec<u8> {
    key(&[b"cf", b""])
}
pub(crate) fn all_deployments_prefix() -> Vec<u8> {
    key(&[b"dp", b""])
}
pub(crate) fn all_alerts_prefix() -> Vec<u8> {
    key(&[b"al", b""])
}

/// The trailing big-endian id of a key built above.
pub(crate) fn trailing_id(k: &[u8]) -> Option<u64> {
    let n = k.len().checked_sub(8)?;
    k.get(n..)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
}

// Alerting.
pub(crate) fn integration(project: u64, id: u64) -> Vec<u8> {
    key(&[b"ig", &be(project), &be(id)])
}
pub(crate) fn integration_prefix(project: u64) -> Vec<u8> {
    key(&[b"ig", &be(project), b""])
}
pub(crate) fn all_integrations_prefix() -> Vec<u8> {
    key(&[b"ig", b""])
}
pub(crate) fn alert_rule(project: u64, id: u64) -> Vec<u8> {
    key(&[b"ar", &be(project), &be(id)])
}
pub(crate) fn alert_rule_all_prefix() -> Vec<u8> {
    key(&[b"ar", b""])
}
pub(crate) fn alert_rule_prefix(project: u64) -> Vec<u8> {
    key(&[b"ar", &be(project), b""])
}
pub(crate) fn alert(project: u64, id: u64) -> Vec<u8> {
    key(&[b"al", &be(project), &be(id)])
}
pub(crate) fn alert_prefix(project: u64) -> Vec<u8> {
    key(&[b"al", &be(project), b""])
}
/// The evaluator's durable state of one (rule, device): a condition holding since a moment
/// (not yet fired), or the id of the alert firing now.
pub(crate) fn condition(project: u64, rule: u64, device: u64) -> Vec<u8> {
    key(&[b"acs", &be(project), &be(rule), &be(device)])
}
pub(crate) fn condition_prefix(project: u64) -> Vec<u8> {
    key(&[b"acs", &be(project), b""])
}
pub(crate) fn condition_rule_prefix(project: u64, rule: u64) -> Vec<u8> {
    key(&[b"acs", &be(project), &be(rule), b""])
}
pub(crate) fn notification(alert: u64, id: u64) -> Vec<u8> {
    key(&[b"nt", &be(alert), &be(id)])
}
pub(crate) fn notification_prefix(alert: u64) -> Vec<u8> {
    key(&[b"nt", &be(alert), b""])
}
/// One heartbeat's metrics kept for backtests.
pub(crate) fn metric_sample(project: u64, device: u64, at: i64) -> Vec<u8> {
    key(&[b"mh", &be(project), &be(device), &be(at.max(0) as u64)])
}
pub(crate) fn metric_sample_project_prefix(project: u64) -> Vec<u8> {
    key(&[b"mh", &be(project), b""])
}
pub(crate) fn metric_sample_prefix(project: u64, device: u64) -> Vec<u8> {
    key(&[b"mh", &be(project), &be(device), b""])
}
/// The expiry index of samples: time first, so pruning reads only what expired.
/// The expiry index entry of the metric sample stored under `k` (a [`metric_sample`] key).
pub(crate) fn metric_sample_expiry_of(k: &[u8]) -> Option<Vec<u8>> {
    // ... be(project) '/' be(device) '/' be(at)
    let n = k.len().checked_sub(26)?;
    let t = k.get(n..)?;
    let id = |b: &[u8]| <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes);
    let (project, device, at) = (id(&t[0..8])?, id(&t[9..17])?, id(&t[18..26])?);
    Some(metric_sample_expiry(at as i64, project, device))
}
pub(crate) fn metric_sample_expiry(at: i64, project: u64, device: u64) -> Vec<u8> {
    key(&[b"mhx", &be(at.max(0) as u64), &be(project), &be(device)])
}
pub(crate) fn metric_sample_expiry_prefix() -> Vec<u8> {
    key(&[b"mhx", b""])
}
/// The expiry index of resolved alerts: resolution time first, so pruning reads only what
/// expired.
pub(crate) fn alert_expiry(resolved_at: i64, project: u64, id: u64) -> Vec<u8> {
    key(&[
        b"alx",
        &be(resolved_at.max(0) as u64),
        &be(project),
        &be(id),
    ])
}
pub(crate) fn alert_expiry_prefix() -> Vec<u8> {
    key(&[b"alx", b""])
}
/// A notification still owed (value: its record's key).
pub(crate) fn owed_notification(id: u64) -> Vec<u8> {
    key(&[b"ntq", &be(id)])
}
pub(crate) fn owed_notification_prefix() -> Vec<u8> {
    key(&[b"ntq", b""])
}

/// A lease ([`crate::leases`]), by name.
pub(crate) fn lease(name: &str) -> Vec<u8> {
    key(&[b"lease", name.as_bytes()])
}

/// Every lease's key starts with this.
pub(crate) fn lease_prefix() -> Vec<u8> {
    key(&[b"lease", b""])
}

/// An enrollment token of a project ([`crate::devices::enrollment`]).
pub(crate) fn enrollment(project: u64, id: u64) -> Vec<u8> {
    key(&[b"enr", &be(project), &be(id)])
}
pub(crate) fn enrollment_prefix(project: u64) -> Vec<u8> {
    key(&[b"enr", &be(project), b""])
}
/// Its index entry by the token's SHA-256: the project and id, 16 bytes.
pub(crate) fn enrollment_by_hash(hash: &[u8; 32]) -> Vec<u8> {
    key(&[b"ix-enr", hash])
}

/// An enrollment's attempt, by the SHA-256 of its token's hash and the robot's enrollment
/// id: the project and device it enrolled, 16 bytes.
pub(crate) fn enrollment_attempt(hash: &[u8; 32]) -> Vec<u8> {
    key(&[b"ix-enr-at", hash])
}

/// A section's counter ([`crate::sections`]), by name.
pub(crate) fn section(name: &str) -> Vec<u8> {
    key(&[b"section", name.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_samples_expiry_entry_is_found_from_its_key() {
        assert_eq!(
            metric_sample_expiry_of(&metric_sample(3, 258, 1_700_000_000_123)),
            Some(metric_sample_expiry(1_700_000_000_123, 3, 258))
        );
        assert_eq!(metric_sample_expiry_of(b"short"), None);
    }

    #[test]
    fn ids_sort_numerically_and_prefixes_do_not_overlap() {
        assert!(device(1, 2) < device(1, 256));
        assert!(device(1, 2).starts_with(&device_prefix(1)));
        assert!(!device(2, 1).starts_with(&device_prefix(1)));
        assert!(!user_by_email("a").starts_with(&user_prefix()));
        assert_eq!(trailing_id(&group(3, 99)), Some(99));
    }
}
