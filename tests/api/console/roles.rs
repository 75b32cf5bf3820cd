//! Roles on the console pages, the secure cookie and allowed origins, and the rate limit on
//! pages.

use serde_json::json;

use super::*;
use crate::deployments::DEPS;
use crate::evaluation::fast;
use crate::peers::Sink;

each_backend!(roles_refresh_secure_cookie_and_origins);
/// Roles (a viewer reads, gets no pause button and 403 on the form; a member pauses), a
/// refresh that keeps every open form valid, the `Secure` cookie behind a TLS proxy, and the
/// origins a sign-in and the live tail's WebSocket accept.
async fn roles_refresh_secure_cookie_and_origins() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
        c.auth.token_ttl_seconds = 4;
        c.http.trusted_proxies = vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let dep = seeded(&s, &sink).await;
    let c = no_redirects();
    let page = format!("/console/default/default/deployments/{dep}");
    let action = s.url(&format!("{page}/rollout/pause"));
    let get = |cookie: String, path: String| {
        let c = c.clone();
        let url = s.url(&path);
        async move {
            let r = c.get(url).header("cookie", cookie).send().await.unwrap();
            let set = cookie_of(&r);
            (r.status().as_u16(), set, r.text().await.unwrap())
        }
    };

    // A viewer reads the rollout, is offered no pause, and the form is refused all the same.
    let viewer = format!("fleetops_session={}", s.member_key("viewer").await);
    let (st, _, html) = get(viewer.clone(), page.clone()).await;
    assert_eq!(st, 200);
    assert!(html.contains("id=\"current-phase\"") && !html.contains("rollout-action"));
    let r = c
        .post(&action)
        .header("cookie", &viewer)
        .form_of(&[("csrf", csrf_of(&html))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // A viewer's backtest is refused (the API's role), and nothing is run for it.
    let r = c
        .post(s.url("/console/default/default/rules/backtest"))
        .header("cookie", &viewer)
        .form_of(&[
            ("csrf", csrf_of(&html).as_str()),
            ("condition", r#"{"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 1, "duration_seconds": 0}"#),
            ("hours", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Charged like any authenticated response, with the rate-limit headers.
    for h in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(r.headers().contains_key(h), "{h}");
    }
    let body = r.text().await.unwrap();
    assert!(body.contains("Not enough permissions.") && !body.contains("backtest-result"));
    // The role is checked before the form is read: a viewer's oversized form is 403 as
    // well, where a member's is 413.
    let oversized = [
        ("csrf", csrf_of(&html)),
        ("condition", "x".repeat(16 * 1024)),
    ];
    let r = c
        .post(s.url("/console/default/default/rules/backtest"))
        .header("cookie", &viewer)
        .form_of(&oversized)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let member = format!("fleetops_session={}", s.member_key("member").await);
    let r = c
        .post(s.url("/console/default/default/rules/backtest"))
        .header("cookie", &member)
        .form_of(&oversized)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // The rollout's form too: its role before its body.
    for (cookie, status) in [(&viewer, 403), (&member, 413)] {
        let r = c
            .post(&action)
            .header("cookie", cookie)
            .form_of(&oversized)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status);
    }
    // Another project's session: its export and files are 404 from this project's pages.
    let other = s
        .post(
            "/api/v1/organizations/default/projects",
            s.key(),
            json!({"slug": "other"}),
        )
        .await;
    assert_eq!(other.status, 201, "{}", other.body);
    let sid = s.get(&format!("{DEV}/sessions"), s.key()).await.body["items"][0]["id"]
        .as_u64()
        .unwrap();
    for path in [
        format!("/console/default/other/sessions/{sid}/export?format=csv"),
        format!("/console/default/other/sessions/{sid}/files/anything"),
    ] {
        let (st, _, _) = get(viewer.clone(), path.clone()).await;
        assert_eq!(st, 404, "{path}");
    }
    let member = format!("fleetops_session={}", s.member_key("member").await);
    let (_, _, html) = get(member.clone(), page.clone()).await;
    assert!(html.contains("rollout-action"));

    // Signed in through a TLS proxy: the cookie is Secure; an https page's sign-in is taken,
    // another origin's is refused (login CSRF).
    let host = s.base.trim_start_matches("http://").to_string();
    let login = |origin: String, proto: &'static str| {
        c.post(s.url("/console/login"))
            .header("origin", origin)
            .header("x-forwarded-proto", proto)
            .form_of(&[
                ("email", s.admin.email.as_str()),
                ("password", ADMIN_PASSWORD),
            ])
            .send()
    };
    let r = login("http://evil.example".into(), "http").await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(cookie_of(&r).is_none());
    let r = login(format!("http://{host}"), "https").await.unwrap();
    assert_eq!(
        r.status(),
        403,
        "the page was https: an http origin is another origin"
    );
    let r = login(format!("https://{host}"), "https").await.unwrap();
    assert_eq!(r.status(), 303);
    assert!(cookie_of(&r).unwrap().ends_with("; Secure"));
    let r = login(format!("http://{host}"), "http").await.unwrap();
    assert_eq!(r.status(), 303);
    let first = cookie_of(&r).unwrap();
    assert!(!first.contains("Secure"));
    let first = first.split(';').next().unwrap().to_string();

    // Past half the token's life (4 s) a page replaces the cookie; the forms of pages
    // rendered before keep working, with the old cookie and with the new one.
    let (_, none, html) = get(first.clone(), page.clone()).await;
    assert!(none.is_none(), "not yet half-way");
    let csrf = csrf_of(&html);
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let (_, set, html) = get(first.clone(), page.clone()).await;
    let second = set
        .expect("refreshed")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_ne!(second, first);
    assert_eq!(csrf_of(&html), csrf, "one CSRF token per sign-in");
    let r = c
        .post(&action)
        .header("cookie", &second)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let r = c
        .post(s.url(&format!("{page}/rollout/resume")))
        .header("cookie", &first)
        .form_of(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        s.get(&format!("{DEPS}/{dep}/rollout"), s.key()).await.body["state"],
        "running"
    );

    // Expiry: a token left past its life (4 s; `exp` is whole seconds) no longer opens a page.
    let (st, _, _) = get(second.clone(), page.clone()).await;
    assert_eq!(st, 200);
    tokio::time::sleep(std::time::Duration::from_millis(6000)).await;
    let (st, set, _) = get(second.clone(), page.clone()).await;
    assert_eq!((st, set), (303, None), "an expired session signs in again");
    let (st, set, _) = get(first.clone(), page.clone()).await;
    assert_eq!((st, set), (303, None), "an expired token is not refreshed");
    let second = {
        let r = login(format!("http://{host}"), "http").await.unwrap();
        cookie_of(&r)
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    };

    // The WebSocket takes the cookie only with this console's exact origin.
    let sid = s.get(&format!("{DEV}/sessions"), s.key()).await.body["items"][0]["id"]
        .as_u64()
        .unwrap();
    let ws = format!(
        "{}/api/v1/ws/organizations/default/projects/default/sessions/{sid}/logs",
        s.base.replace("http://", "ws://")
    );
    for (origin, want) in [
        (None, 401),
        (Some("null".to_string()), 401),
        (Some(format!("https://{host}")), 401),
        (Some(format!("http://{host}")), 101),
    ] {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut rq = ws.as_str().into_client_request().unwrap();
        rq.headers_mut().insert("cookie", second.parse().unwrap());
        if let Some(o) = &origin {
            rq.headers_mut().insert("origin", o.parse().unwrap());
        }
        let got = match tokio_tungstenite::connect_async(rq).await {
            Ok((_, r)) => r.status().as_u16(),
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => r.status().as_u16(),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(got, want, "origin {origin:?}");
    }
}

each_backend!(a_console_page_past_the_rate_limit_is_429_with_its_headers);
/// A console page past the tier's limit is a 429 page carrying the same headers the API's
/// 429 carries (the limit, none remaining, the reset and `Retry-After`).
async fn a_console_page_past_the_rate_limit_is_429_with_its_headers() {
    let s = start_with(|c| {
        c.tiers.insert(
            "free".into(),
            fleetops::config::TierFile {
                requests_per_minute: Some(2),
                storage_bytes: None,
            },
        );
    })
    .await;
    let cookie = format!("fleetops_session={}", s.member_key("viewer").await);
    let c = no_redirects();
    let page = s.url("/console/default/default/webhooks");
    for remaining in ["1", "0"] {
        let r = c.get(&page).header("cookie", &cookie).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let h = r.headers();
        assert_eq!(h["x-ratelimit-limit"], "2");
        assert_eq!(h["x-ratelimit-remaining"], remaining);
    }
    let r = c.get(&page).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let h = r.headers().clone();
    assert_eq!(h["x-ratelimit-limit"], "2");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    assert!(h.contains_key("x-ratelimit-reset"));
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(
        h["content-type"].to_str().unwrap().starts_with("text/html"),
        "a page, not the API's JSON"
    );
    let body = r.text().await.unwrap();
    assert!(
        body.contains(&format!("Try again in {retry} seconds.")),
        "{body}"
    );
}
