//! Signing in to the console over HTTP: the cookie, CSRF, refresh, and signing out everywhere.

use serde_json::json;

use super::*;
use crate::deployments::DEPS;
use crate::evaluation::fast;
use crate::peers::Sink;

each_backend!(sign_in_cookie_and_csrf_over_http);
async fn sign_in_cookie_and_csrf_over_http() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
    })
    .await;
    let dep = seeded(&s, &sink).await;
    let c = no_redirects();

    // Without a session: every page sends to sign-in.
    for (path, want) in [
        ("/", "/console"),
        ("/console", "/console/login"),
        ("/console/default/default", "/console/login"),
    ] {
        let r = c.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 303, "{path}");
        assert_eq!(r.headers()["location"].to_str().unwrap(), want, "{path}");
    }
    let r = c.get(s.url("/console/login")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe"));

    // A wrong password: 401 and no cookie; the right one: a strict, HttpOnly cookie.
    let r = c
        .post(s.url("/console/login"))
        .form_of(&[("email", s.admin.email.as_str()), ("password", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(cookie_of(&r).is_none());
    let r = c
        .post(s.url("/console/login"))
        .form_of(&[
            ("email", s.admin.email.as_str()),
            ("password", ADMIN_PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let set = cookie_of(&r).unwrap();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"));
    assert!(!set.contains("Secure"), "plain HTTP without a proxy: {set}");
    let cookie = set.split(';').next().unwrap().to_string();
    let page = c
        .get(s.url("/console/default/default"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("r-offline") && html.contains("r-online"));
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap()
        .to_string();

    // A write without the CSRF field, with another's, or from another origin: 403, nothing
    // changed. With it: done.
    let action = s.url(&format!(
        "/console/default/default/deployments/{dep}/rollout/pause"
    ));
    for (form, origin) in [
        (vec![], None),
        (vec![("csrf", "0".repeat(64))], None),
        (vec![("csrf", csrf.clone())], Some("http://evil.example")),
    ] {
        let mut rb = c.post(&action).header("cookie", &cookie).form_of(&form);
        if let Some(o) = origin {
            rb = rb.header("origin", o);
        }
        assert_eq!(rb.send().await.unwrap().status(), 403);
    }
    let url = format!("{DEPS}/{dep}/rollout");
    assert_eq!(s.get(&url, s.key()).await.body["state"], json!("running"));
    let r = c
        .post(&action)
        .header("cookie", &cookie)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(s.get(&url, s.key()).await.body["state"], json!("paused"));

    // The live tail's WebSocket takes the cookie from a page of this origin only.
    let sid = {
        let l = s.get(&format!("{DEV}/sessions"), s.key()).await;
        l.body["items"][0]["id"].as_u64().unwrap()
    };
    let ws = format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs",
        s.base.replace("http://", "ws://")
    );
    let host = s.base.trim_start_matches("http://").to_string();
    for (origin, want) in [
        (format!("http://{host}"), 101),
        ("http://evil.example".into(), 401),
    ] {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut rq = ws.as_str().into_client_request().unwrap();
        rq.headers_mut().insert("cookie", cookie.parse().unwrap());
        rq.headers_mut().insert("origin", origin.parse().unwrap());
        let got = match tokio_tungstenite::connect_async(rq).await {
            Ok((_, r)) => r.status().as_u16(),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(got, want, "origin {origin}");
    }

    // The session's export, downloaded with the cookie, filtered like the page.
    let r = c
        .get(s.url(&format!(
            "/console/default/default/sessions/{sid}/export?search=boot+line+1&format=csv"
        )))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains(".csv")
    );
    let csv = r.text().await.unwrap();
    assert!(
        csv.contains("boot line 1") && !csv.contains("boot line 0"),
        "{csv}"
    );
    // An artifact, listed on the session's page and downloaded as an attachment (robots upload
    // these: never shown inline under the console's origin).
    let put = s
        .raw(
            s.http
                .put(s.url(&format!("{DEV}/sessions/{sid}/files/logs/run 1.html")))
                .bearer_auth(s.key())
                .header("content-type", "text/html")
                .body("<script>alert(1)</script>"),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.body);
    let html = c
        .get(s.url(&format!("/console/default/default/sessions/{sid}")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // An offset past the last page is an empty page; one past the deepest a query pages
    // (`[sessions] max_result_window`, u64::MAX here) is the API's 422, as a page.
    let far = |offset: u64| {
        c.get(s.url(&format!(
            "/console/default/default/sessions/{sid}?offset={offset}"
        )))
        .header("cookie", &cookie)
        .send()
    };
    assert_eq!(far(10_000).await.unwrap().status(), 200);
    let too_far = far(u64::MAX).await.unwrap();
    assert_eq!(too_far.status(), 422);
    assert!(
        too_far
            .text()
            .await
            .unwrap()
            .contains("page further with since")
    );
    let href = html
        .split("class=\"file\" href=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap()
        .to_string();
    let r = c
        .get(s.url(&href))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{href}");
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert!(
        r.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox")
    );
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(r.text().await.unwrap(), "<script>alert(1)</script>");

    // A draft's page lists what would block its activation.
    let draft = s
        .post(
            DEPS,
            s.key(),
            json!({"name": "later", "composition_tag": "x", "capsule_id": 1,
                "target_devices": [{"labels": {"site": "lab"}}]}),
        )
        .await;
    assert_eq!(draft.status, 201, "{}", draft.body);
    s.patch(
        "/api/v1/projects/default/default/policy",
        s.key(),
        json!({"require_passed_test_run": true}),
    )
    .await;
    let html = c
        .get(s.url(&format!(
            "/console/default/default/deployments/{}",
            draft.body["id"]
        )))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("id=\"blockers\"") && html.contains("declares no source commit"),
        "{html}"
    );

    // A project that does not exist: 404 as a page.
    let r = c
        .get(s.url("/console/default/nope"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Sign out clears the cookie.
    let r = c
        .post(s.url("/console/logout"))
        .header("cookie", &cookie)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(cookie_of(&r).unwrap().contains("Max-Age=0"));
}

each_backend!(signing_out_revokes_the_token_and_its_refreshes_everywhere);
/// Signing out of the console ends the sign-in on the server: a copy of the cookie's token,
/// and a token refreshed from it, are refused by the API and the console from then on; another
/// sign-in of the same user goes on, and the API's own sign-out ends that one.
async fn signing_out_revokes_the_token_and_its_refreshes_everywhere() {
    let s = start().await;
    let c = no_redirects();
    let r = c
        .post(s.url("/console/login"))
        .form_of(&[
            ("email", s.admin.email.as_str()),
            ("password", ADMIN_PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = cookie_of(&r)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let token = cookie
        .strip_prefix("fleetops_session=")
        .unwrap()
        .to_string();
    let html = c
        .get(s.url("/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = csrf_of(&html);
    let refreshed = s.post("/api/v1/auth/refresh", &token, json!({})).await;
    assert_eq!(refreshed.status, 200, "{}", refreshed.body);
    let refreshed = refreshed.body["access_token"].as_str().unwrap().to_string();
    // A second sign-in of the same user, likely in the same second.
    let other = s.login(&s.admin.email, ADMIN_PASSWORD).await;

    let r = c
        .post(s.url("/console/logout"))
        .header("cookie", &cookie)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    for t in [&token, &refreshed] {
        s.get("/api/v1/users/me", t).await.assert_error(401);
        s.post("/api/v1/auth/refresh", t, json!({}))
            .await
            .assert_error(401);
    }
    let page = c
        .get(s.url("/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 303, "the old cookie signs in no more");
    assert_eq!(s.get("/api/v1/users/me", &other).await.status, 200);

    // The API's sign-out: 204, then the token is refused; an API key has no sign-in to end.
    let r = s.post("/api/v1/auth/logout", &other, json!({})).await;
    assert_eq!(r.status, 204, "{}", r.body);
    s.get("/api/v1/users/me", &other).await.assert_error(401);
    s.post("/api/v1/auth/logout", s.key(), json!({}))
        .await
        .assert_error(403);
    // Kept across a restart.
    let s = s.restart().await;
    s.get("/api/v1/users/me", &token).await.assert_error(401);
}
