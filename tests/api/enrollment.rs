//! Enrollment tokens: an admin makes one; a robot registers itself with it and gets its own
//! device token, with no user credential on the robot.

use serde_json::json;

use crate::common::*;

const TOKENS: &str = "/api/v1/organizations/default/projects/default/enrollment-tokens";
const ENROLL: &str = "/api/v1/device/enroll";

async fn make_token(s: &Srv, body: serde_json::Value) -> (u64, String) {
    let r = s.post(TOKENS, s.key(), body).await;
    assert_eq!(r.status, 201, "{}", r.body);
    (
        r.body["id"].as_u64().unwrap(),
        r.body["token"].as_str().unwrap().to_string(),
    )
}

each_backend!(a_robot_enrolls_with_a_token_and_works_with_its_own_device_token);
async fn a_robot_enrolls_with_a_token_and_works_with_its_own_device_token() {
    let s = start().await;
    let (_, token) = make_token(
        &s,
        json!({"name": "assembly line", "labels": {"fleet": "amr"},
               "allowed_label_keys": ["site"]}),
    )
    .await;
    assert!(token.starts_with("fopse_"), "{token}");
    let r = s
        .post(
            ENROLL,
            &token,
            json!({"name": "amr-7", "labels": {"site": "paris"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["name"], "amr-7");
    // The token's labels, and the robot's own under the keys it allows.
    assert_eq!(r.body["labels"], json!({"fleet": "amr", "site": "paris"}));
    assert_eq!(r.body["organization"], "default");
    assert_eq!(r.body["project_slug"], "default");
    let id = r.body["id"].as_u64().unwrap();
    let device_token = r.body["device_token"].as_str().unwrap().to_string();
    assert!(device_token.starts_with("fopsd_"));
    let r = s
        .post(
            &format!("{DEV}/devices/{id}/heartbeat"),
            &device_token,
            json!({"metrics": {"cpu": 0.5}}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    let r = s.get(&format!("{DEV}/devices/{id}"), s.key()).await;
    assert_eq!(r.body["status"], "online", "{}", r.body);
    // The list shows the use, never the token.
    let r = s.get(TOKENS, s.key()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["items"][0]["uses"], 1);
    assert!(r.body["items"][0].get("token").is_none(), "{}", r.body);
}

each_backend!(a_tokens_labels_are_fixed_and_a_robot_adds_labels_only_under_the_keys_it_allows);
async fn a_tokens_labels_are_fixed_and_a_robot_adds_labels_only_under_the_keys_it_allows() {
    let s = start().await;
    let (_, token) = make_token(
        &s,
        json!({"name": "staging", "labels": {"fleet": "staging"}, "allowed_label_keys": ["site"]}),
    )
    .await;
    // A robot holding a staging token cannot enroll as prod, nor add a key not allowed.
    let d = s
        .post(
            ENROLL,
            &token,
            json!({"name": "r1", "labels": {"fleet": "prod"}}),
        )
        .await
        .assert_error(422)
        .to_string();
    assert!(d.contains("\"fleet\""), "{d}");
    let d = s
        .post(
            ENROLL,
            &token,
            json!({"name": "r1", "labels": {"site": "lyon", "owner": "me"}}),
        )
        .await
        .assert_error(422)
        .to_string();
    assert!(d.contains("\"owner\""), "{d}");
    // Nothing was written.
    assert_eq!(
        s.get(&format!("{DEV}/devices"), s.key()).await.body["total"],
        0
    );
    assert_eq!(s.get(TOKENS, s.key()).await.body["items"][0]["uses"], 0);
    let r = s
        .post(
            ENROLL,
            &token,
            json!({"name": "r1", "labels": {"site": "lyon", "fleet": "staging"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(
        r.body["labels"],
        json!({"fleet": "staging", "site": "lyon"})
    );
    // By default a token allows no label of the robot's own.
    let (_, plain) = make_token(&s, json!({"name": "plain", "labels": {"fleet": "k"}})).await;
    s.post(
        ENROLL,
        &plain,
        json!({"name": "r2", "labels": {"site": "lyon"}}),
    )
    .await
    .assert_error(422);
    let list = s.get(TOKENS, s.key()).await;
    assert_eq!(list.body["items"][0]["allowed_label_keys"], json!(["site"]));
    assert_eq!(list.body["items"][1]["allowed_label_keys"], json!([]));
    // A token's own key cannot also be a robot's.
    let d = s
        .post(
            TOKENS,
            s.key(),
            json!({"name": "x", "labels": {"fleet": "k"}, "allowed_label_keys": ["fleet"]}),
        )
        .await
        .assert_error(422)
        .to_string();
    assert!(d.contains("allowed_label_keys"), "{d}");
    s.post(
        TOKENS,
        s.key(),
        json!({"name": "x", "allowed_label_keys": [""]}),
    )
    .await
    .assert_error(422);
}

each_backend!(an_enrollment_asked_again_with_its_id_answers_the_same_device_with_a_new_token);
async fn an_enrollment_asked_again_with_its_id_answers_the_same_device_with_a_new_token() {
    let s = start().await;
    let (_, token) = make_token(&s, json!({"name": "one", "single_use": true})).await;
    let body = json!({"name": "r1", "enrollment_id": "1b4e28ba-2fa1-41d2-883f-0016d3cca427"});
    let first = s.post(ENROLL, &token, body.clone()).await;
    assert_eq!(first.status, 201, "{}", first.body);
    // The answer was lost: the robot asks again, the single-use token used meanwhile.
    let again = s.post(ENROLL, &token, body.clone()).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.body["id"], first.body["id"]);
    assert_ne!(again.body["device_token"], first.body["device_token"]);
    assert_eq!(
        s.get(&format!("{DEV}/devices"), s.key()).await.body["total"],
        1
    );
    let id = first.body["id"].as_u64().unwrap();
    let beat = format!("{DEV}/devices/{id}/heartbeat");
    // Only the last answer's token works.
    s.post(
        &beat,
        first.body["device_token"].as_str().unwrap(),
        json!({}),
    )
    .await
    .assert_error(401);
    // Another enrollment with the used token is refused.
    s.post(
        ENROLL,
        &token,
        json!({"name": "r2", "enrollment_id": "another"}),
    )
    .await
    .assert_error(401);
    s.post(ENROLL, &token, json!({"name": "r2"}))
        .await
        .assert_error(401);
    let r = s
        .post(
            &beat,
            again.body["device_token"].as_str().unwrap(),
            json!({}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
    // Once its robot was seen, the enrollment is not answered again.
    s.post(ENROLL, &token, body).await.assert_error(401);
    assert_eq!(
        s.get(&format!("{DEV}/devices"), s.key()).await.body["total"],
        1
    );
    let (_, other) = make_token(&s, json!({"name": "two"})).await;
    s.post(
        ENROLL,
        &other,
        json!({"name": "r3", "enrollment_id": "not an id"}),
    )
    .await
    .assert_error(422);
}

each_backend!(a_single_use_token_enrolls_one_robot);
async fn a_single_use_token_enrolls_one_robot() {
    let s = start().await;
    let (_, token) = make_token(&s, json!({"name": "one", "single_use": true})).await;
    let first = s.post(ENROLL, &token, json!({"name": "r1"})).await;
    assert_eq!(first.status, 201, "{}", first.body);
    s.post(ENROLL, &token, json!({"name": "r2"}))
        .await
        .assert_error(401);
    let r = s.get(TOKENS, s.key()).await;
    assert_eq!(r.body["items"], json!([]));
}

each_backend!(concurrent_enrollments_with_a_single_use_token_enroll_exactly_one_robot);
async fn concurrent_enrollments_with_a_single_use_token_enroll_exactly_one_robot() {
    let s = start().await;
    let (_, token) = make_token(&s, json!({"name": "one", "single_use": true})).await;
    // Enrollment attempts count against the address's sign-in limit (10 a minute here).
    let tries = (0..8).map(|i| {
        let (s, token) = (&s, token.clone());
        async move {
            s.post(ENROLL, &token, json!({"name": format!("r{i}")}))
                .await
                .status
        }
    });
    let statuses = futures::future::join_all(tries).await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        7,
        "{statuses:?}"
    );
    let r = s.get(&format!("{DEV}/devices"), s.key()).await;
    assert_eq!(r.body["total"], 1, "{}", r.body);
}

each_backend!(a_revoked_or_expired_token_enrolls_nothing);
async fn a_revoked_or_expired_token_enrolls_nothing() {
    let s = start().await;
    let (id, revoked) = make_token(&s, json!({"name": "gone"})).await;
    let r = s.delete(&format!("{TOKENS}/{id}"), s.key()).await;
    assert_eq!(r.status, 204);
    s.post(ENROLL, &revoked, json!({"name": "r"}))
        .await
        .assert_error(401);
    let (_, expiring) = make_token(&s, json!({"name": "soon", "expires_in_seconds": 60})).await;
    assert_eq!(
        s.post(ENROLL, &expiring, json!({"name": "r1"}))
            .await
            .status,
        201
    );
    s.rt().clock.advance(std::time::Duration::from_secs(61));
    s.post(ENROLL, &expiring, json!({"name": "r2"}))
        .await
        .assert_error(401);
    // Neither a made-up token nor none at all.
    s.post(ENROLL, "fopse_made-up", json!({"name": "r"}))
        .await
        .assert_error(401);
    s.post(ENROLL, "", json!({"name": "r"}))
        .await
        .assert_error(401);
    let r = s.get(&format!("{DEV}/devices"), s.key()).await;
    assert_eq!(r.body["total"], 1, "{}", r.body);
}

each_backend!(enrollment_attempts_count_against_the_addresss_sign_in_limit);
async fn enrollment_attempts_count_against_the_addresss_sign_in_limit() {
    let s = start().await;
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(
            s.post(ENROLL, "fopse_guess", json!({"name": "r"}))
                .await
                .status,
        );
    }
    assert_eq!(&statuses[..10], &[401; 10]);
    assert_eq!(&statuses[10..], &[429; 2]);
}

each_backend!(enrollment_tokens_are_for_admins_and_checked_as_they_are_made);
async fn enrollment_tokens_are_for_admins_and_checked_as_they_are_made() {
    let s = start().await;
    let member = s.user("m@x.io").await;
    let r = s
        .post(
            "/api/v1/organizations/default/members",
            s.key(),
            json!({"email": "m@x.io", "role": "member"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    s.post(TOKENS, &member, json!({"name": "x"}))
        .await
        .assert_error(403);
    s.get(TOKENS, &member).await.assert_error(403);
    s.post(
        TOKENS,
        s.key(),
        json!({"name": "x", "expires_in_seconds": 0}),
    )
    .await
    .assert_error(422);
    s.post(TOKENS, s.key(), json!({"name": ""}))
        .await
        .assert_error(422);
    s.delete(&format!("{TOKENS}/999"), s.key())
        .await
        .assert_error(404);
    // A device token is no enrollment token, nor the other way round.
    let (_, token) = make_token(&s, json!({"name": "line"})).await;
    s.get(&format!("{DEV}/devices"), &token)
        .await
        .assert_error(401);
}
