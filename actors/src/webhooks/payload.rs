//! The fields of host payloads the worker reads (the events a source host sends: pull
//! requests, pushes, check suites, installations), every one optional so that a
//! payload missing what a handler needs is skipped with a reason rather than failing to parse;
//! branch patterns; idempotency keys.

use serde::Deserialize;

/// The events the service subscribes to; anything else is answered `ignored` unparsed.
pub const SUBSCRIBED: [&str; 6] = [
    "installation",
    "installation_repositories",
    "pull_request",
    "push",
    "workflow_run",
    "check_suite",
];

/// A commit id as one spelling: hex is case-blind, and a run is found by its commit (the
/// `commit_sha` filter, idempotency keys, the commit index), so every run stores it
/// lower-cased whatever the host sent.
fn commit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(|mut s| {
        s.make_ascii_lowercase();
        s
    }))
}

#[derive(Debug, Default, Deserialize)]
pub struct Payload {
    pub action: Option<String>,
    pub number: Option<u64>,
    pub pull_request: Option<PullRequest>,
    pub repository: Option<Repository>,
    pub installation: Option<InstallationRef>,
    pub repositories: Option<Vec<Repository>>,
    pub repositories_added: Option<Vec<Repository>>,
    pub repositories_removed: Option<Vec<Repository>>,
    pub repository_selection: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    #[serde(default, deserialize_with = "commit")]
    pub after: Option<String>,
    pub deleted: Option<bool>,
    pub check_suite: Option<CheckSuite>,
    pub workflow_run: Option<WorkflowRun>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PullRequest {
    pub number: Option<u64>,
    pub head: Option<GitRef>,
    pub base: Option<GitRef>,
    pub draft: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct GitRef {
    #[serde(default, deserialize_with = "commit")]
    pub sha: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Repository {
    pub full_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct InstallationRef {
    pub id: Option<u64>,
    pub account: Option<Account>,
    pub repository_selection: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Account {
    pub login: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct CheckSuite {
    #[serde(default, deserialize_with = "commit")]
    pub head_sha: Option<String>,
    pub head_branch: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct WorkflowRun {
    pub id: Option<u64>,
    pub run_attempt: Option<u64>,
    #[serde(default, deserialize_with = "commit")]
    pub head_sha: Option<String>,
    pub head_branch: Option<String>,
    pub conclusion: Option<String>,
    pub html_url: Option<String>,
    pub logs_url: Option<String>,
    pub artifacts_url: Option<String>,
}

impl Payload {
    pub fn repo_name(&self) -> Option<&str> {
        self.repository.as_ref()?.full_name.as_deref()
    }
    pub fn installation_id(&self) -> Option<u64> {
        self.installation.as_ref()?.id
    }
}

/// Full names in a list of repositories (entries without one are left out).
pub fn names(list: &Option<Vec<Repository>>) -> Vec<String> {
    list.iter()
        .flatten()
        .filter_map(|r| r.full_name.clone())
        .collect()
}

/// A branch pattern: `*` matches within one `/`-separated segment.
pub fn matches(pattern: &str, branch: &str) -> bool {
    let p: Vec<&str> = pattern.split('/').collect();
    let b: Vec<&str> = branch.split('/').collect();
    p.len() == b.len() && p.iter().zip(&b).all(|(p, b)| segment(p, b))
}

/// Glob of one segment with `*` (iterative, so no pattern can make it blow up).
fn segment(p: &str, s: &str) -> bool {
    let (p, s) = (p.as_bytes(), s.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while si < s.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some(pi);
                mark = si;
                pi += 1;
            }
            Some(c) if Some(c) == s.get(si) => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some(st) => {
                    pi = st + 1;
                    mark += 1;
                    si = mark;
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|c| *c == b'*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_patterns() {
        assert!(matches("main", "main"));
        assert!(!matches("main", "main2"));
        assert!(matches("release/*", "release/1.0"));
        assert!(!matches("release/*", "release/1/2"));
        assert!(!matches("release/*", "release"));
        assert!(matches("feat-*-x", "feat-abc-x"));
        assert!(matches("*", "anything"));
        assert!(!matches("*", "a/b"));
        assert!(matches("*/*", "a/b"));
    }

    #[test]
    fn real_payloads_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/payloads");
        let entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        assert_eq!(entries.len(), 12);
        for e in entries {
            let bytes = std::fs::read(e.path()).unwrap();
            let p: Payload = serde_json::from_slice(&bytes).unwrap();
            assert!(p.action.is_some() || p.git_ref.is_some(), "{:?}", e.path());
        }
    }
}
