use super::*;

#[test]
fn a_configuration_is_checked_against_its_package_before_it_is_taken() {
    let body = br#"{"speed": 2}"#;
    let sha = hex::encode(sha2::Sha256::digest(body));
    assert!(matches!(
        check_configuration(body, body.len() as u64, &sha.to_ascii_uppercase()),
        Ok(v) if v == serde_json::json!({"speed": 2})
    ));
    // Another size, another digest, or bytes that are not JSON: refused, with why.
    for (bytes, size, digest, why) in [
        (&body[..], 99, sha.clone(), "does not match"),
        (
            &body[..],
            body.len() as u64,
            "00".repeat(32),
            "does not match",
        ),
    ] {
        match check_configuration(bytes, size, &digest) {
            Err(ConfigProblem::Refused(m)) => assert!(m.contains(why), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    let junk = b"speed: [";
    let junk_sha = hex::encode(sha2::Sha256::digest(junk));
    match check_configuration(junk, junk.len() as u64, &junk_sha) {
        Err(ConfigProblem::Refused(m)) => assert!(m.contains("not JSON"), "{m}"),
        other => panic!("{other:?}"),
    }
}

fn at(stage: &str, etag: Option<&str>) -> State {
    State {
        deployment_id: Some(4),
        etag: etag.map(str::to_string),
        stage: stage.into(),
        reported: vec![stage.into()],
        ..State::default()
    }
}

#[test]
fn a_failed_package_answered_with_a_new_etag_is_installed_again() {
    assert_eq!(
        next_step(&at("failed", Some("\"a\"")), 4, Some("\"b\"")),
        Step::Start
    );
    assert_eq!(
        next_step(&at("failed", None), 4, Some("\"b\"")),
        Step::Start
    );
    // The same answer again is no retry.
    assert_eq!(
        next_step(&at("failed", Some("\"a\"")), 4, Some("\"a\"")),
        Step::Keep
    );
    assert_eq!(next_step(&at("failed", Some("\"a\"")), 4, None), Step::Keep);
}

#[test]
fn a_succeeded_package_is_not_installed_again_whatever_its_etag() {
    assert_eq!(
        next_step(&at("succeeded", Some("\"a\"")), 4, Some("\"b\"")),
        Step::Keep
    );
}

#[test]
fn a_new_package_starts_and_an_unfinished_one_goes_on() {
    assert_eq!(next_step(&State::default(), 4, Some("\"a\"")), Step::Start);
    assert_eq!(
        next_step(&at("succeeded", Some("\"a\"")), 5, Some("\"a\"")),
        Step::Start
    );
    assert_eq!(
        next_step(&at("installing", Some("\"a\"")), 4, Some("\"b\"")),
        Step::Resume
    );
    assert_eq!(next_step(&at("downloading", None), 4, None), Step::Resume);
}

#[test]
fn a_failed_package_is_settled_once_its_rollback_ran_and_both_were_reported() {
    let mut st = at("failed", None);
    assert!(st.settled());
    st.rollback = Some("pending".into());
    assert!(!st.settled());
    st.rollback = Some("rolled_back".into());
    assert!(!st.settled());
    st.reported.push("rolled_back".into());
    assert!(st.settled());
    // Killed after the rollback, before `failed` was reported.
    st.reported = vec!["downloading".into(), "installing".into()];
    assert!(!st.settled());
}

#[test]
fn the_rollback_hooks_end_is_rolled_back_or_rollback_failed_with_its_words() {
    assert_eq!(rollback_outcome(Some(0), "ok"), ("rolled_back", None));
    let (o, m) = rollback_outcome(Some(4), "no previous version");
    assert_eq!(o, "rollback_failed");
    assert_eq!(
        m.as_deref(),
        Some("the rollback hook ended with status 4: no previous version")
    );
    assert_eq!(rollback_outcome(None, "").0, "rollback_failed");
}

#[test]
fn a_state_kept_before_rollbacks_existed_still_reads() {
    let st: State = serde_json::from_str(
        r#"{"deployment_id": 4, "etag": null, "stage": "failed", "reported": ["failed"]}"#,
    )
    .unwrap();
    assert_eq!(st.rollback, None);
    assert!(st.settled());
}
