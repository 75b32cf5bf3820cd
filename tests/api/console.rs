//! The operator console: over plain HTTP (sign-in, the cookie's attributes, a page without a
//! session, CSRF refusal) and in a real browser (Debian's Chromium driven through
//! chromedriver by fantoccini): sign in, find an offline device, open it, see a firing alert,
//! read a rollout's phase and pause it, sign out. Screenshots of each page are kept under
//! `target/console-screenshots/`.

use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::common::*;
use crate::configurations::capsule;
use crate::deployments::{DEPS, device};
use crate::evaluation::{fast, heartbeat, rule, wait_alerts, webhook};
use crate::peers::Sink;

/// A project with an online robot running hot (a firing alert) with a session of logs, an
/// offline robot, and a package whose rollout is in its canary phase; returns the package
/// id.
async fn seeded(s: &Srv, sink: &Sink) -> u64 {
    let (on, tok) = device(s, "r-online", json!({"site": "lab"})).await;
    TOKENS
        .lock()
        .unwrap()
        .push((s.base.clone(), "r-online".into(), tok.clone()));
    let sid = crate::sessions::session(s, on, &tok).await;
    post_lines(s, sid, &tok, "boot", 3).await;
    device(s, "r-offline", json!({"site": "lab"})).await;
    let hook = webhook(s, sink).await;
    rule(
        s,
        hook,
        json!({"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 90, "duration_seconds": 0}),
    )
    .await;
    heartbeat(s, on, &tok, json!({"cpu": 97.5})).await;
    wait_alerts(s, "state=firing", 1).await;
    let cap = capsule(s, "nav", "1.0.0").await;
    let r = s
        .post(
            DEPS,
            s.key(),
            json!({"name": "nav canary", "composition_tag": "nav-1", "capsule_id": cap,
                "target_devices": [{"labels": {"site": "lab"}}],
                "rollout": {"phases": [
                    {"name": "canary", "devices": {"count": 1}, "min_wait_seconds": 3600},
                    {"name": "rest", "devices": {"percent": 100}}]}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    dep
}

/// A form body (`application/x-www-form-urlencoded`), as a browser posts it.
trait Form {
    fn form_of<K: AsRef<str>, V: AsRef<str>>(self, pairs: &[(K, V)]) -> Self;
}

impl Form for reqwest::RequestBuilder {
    fn form_of<K: AsRef<str>, V: AsRef<str>>(self, pairs: &[(K, V)]) -> Self {
        let mut f = form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs {
            f.append_pair(k.as_ref(), v.as_ref());
        }
        self.header("content-type", "application/x-www-form-urlencoded")
            .body(f.finish())
    }
}

/// Posts `n` lines whose messages start with `marker`, through the API with the device's
/// token.
async fn post_lines(s: &Srv, sid: u64, tok: &str, marker: &str, n: usize) {
    let lines: Vec<Value> = (0..n)
        .map(|i| json!({"timestamp": "2026-03-01T10:00:05.000Z", "level": "info", "module": "nav", "message": format!("{marker} line {i}")}))
        .collect();
    let r = s
        .post(&format!("{DEV}/sessions/{sid}/logs"), tok, json!(lines))
        .await;
    assert_eq!(r.status, 202, "{}", r.body);
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn cookie_of(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("fleetops_session="))
        .map(String::from)
}

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

/// chromedriver on a free port, and a headless Chromium session through it.
struct Browser {
    driver: std::process::Child,
    client: Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

async fn browser() -> Browser {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let driver = std::process::Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromedriver (Debian's chromium-driver, installed by .ci/run)");
    let profile = tempfile::tempdir().unwrap();
    let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                     format!("--user-data-dir={}", profile.path().display())]
        }
    }))
    .unwrap();
    let mut last = None;
    for _ in 0..100 {
        match ClientBuilder::rustls()
            .unwrap()
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(client) => {
                return Browser {
                    driver,
                    client,
                    _profile: profile,
                };
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no WebDriver session: {last:?}");
}

async fn shot(c: &Client, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.png")),
        c.screenshot().await.unwrap(),
    )
    .unwrap();
}

/// The text of the first element matching `css`, waiting for it (a click's navigation may
/// still be under way: an element of the page being left goes stale, so it is looked up again).
async fn text(c: &Client, css: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(t) = e.text().await
        {
            return t;
        }
        assert!(std::time::Instant::now() < deadline, "{css} never appeared");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the page's address satisfies `ok` (a click's navigation is done).
async fn until_url(c: &Client, ok: impl Fn(&url::Url) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(u) = c.current_url().await
            && ok(&u)
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the page never changed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the live tail shows (or, with `present` false, does not show) a line containing
/// `needle`, waiting up to 10 s for it to appear.
async fn wait_tail(c: &Client, needle: &str, present: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let html = c
            .find(Locator::Css("#tail-lines"))
            .await
            .unwrap()
            .html(true)
            .await
            .unwrap_or_default();
        if html.contains(needle) == present {
            return;
        }
        assert!(
            present && std::time::Instant::now() < deadline,
            "{needle}: present {}",
            !present
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A device's token is shown once at creation; the tests keep a second one by name.
async fn device_token(s: &Srv, name: &str) -> String {
    TOKENS
        .lock()
        .unwrap()
        .iter()
        .find(|(b, n, _)| *b == s.base && n == name)
        .map(|(_, _, t)| t.clone())
        .unwrap()
}

static TOKENS: std::sync::Mutex<Vec<(String, String, String)>> = std::sync::Mutex::new(Vec::new());

each_backend!(an_operator_finds_the_offline_robot_the_alert_and_the_rollout_in_a_browser);
async fn an_operator_finds_the_offline_robot_the_alert_and_the_rollout_in_a_browser() {
    let sink = Sink::start().await;
    let s = start_with(|c| {
        fast(c);
        c.devices.offline_after_seconds = 3600;
    })
    .await;
    let dep = seeded(&s, &sink).await;
    let b = browser().await;
    let c = &b.client;

    // Sign in.
    c.goto(&s.url("/console")).await.unwrap();
    assert!(
        c.current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/console/login")
    );
    shot(c, "1-sign-in").await;
    c.find(Locator::Css("#email"))
        .await
        .unwrap()
        .send_keys(&s.admin.email)
        .await
        .unwrap();
    c.find(Locator::Css("#password"))
        .await
        .unwrap()
        .send_keys(ADMIN_PASSWORD)
        .await
        .unwrap();
    c.find(Locator::Css("#signin"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path() == "/console").await;
    let link = text(c, "main a").await;
    assert!(link.contains("default"), "{link}");
    shot(c, "2-projects").await;

    // The fleet: counts, then the offline filter finds the offline robot only.
    c.find(Locator::Css("main a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path() == "/console/default/default").await;
    assert_eq!(text(c, "#count-total").await, "2");
    assert_eq!(text(c, "#count-offline").await, "1");
    c.find(Locator::Css("#status"))
        .await
        .unwrap()
        .select_by_value("offline")
        .await
        .unwrap();
    c.find(Locator::Css("form.filters button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| {
        u.query().is_some_and(|q| q.contains("status=offline"))
    })
    .await;
    assert_eq!(text(c, "a.device").await, "r-offline");
    assert_eq!(c.find_all(Locator::Css("a.device")).await.unwrap().len(), 1);
    shot(c, "3-fleet-offline").await;
    c.find(Locator::Css("a.device"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path().contains("/devices/")).await;
    assert_eq!(text(c, "#device-status").await, "offline");
    shot(c, "4-device").await;

    // The online robot's session: the query shows its lines; a line posted through the API
    // appears in the live tail; scrolled up, the tail holds new lines until resumed.
    let on = s
        .get(&format!("{DEV}/devices?name=r-online"), s.key())
        .await
        .body["items"][0]["id"]
        .as_u64()
        .unwrap();
    // Heartbeats too close together for the history to keep them: the chart ends at the
    // latest all the same, a metric seen once is a dot, numbers are rounded, and the time
    // axis is labelled.
    let tok = device_token(&s, "r-online").await;
    // (Above the seeded rule's threshold, so its alert keeps firing.)
    for cpu in [95.123456789012, 96.0, 98.0] {
        heartbeat(&s, on, &tok, json!({"cpu": cpu})).await;
    }
    heartbeat(&s, on, &tok, json!({"cpu": 99.0, "batt": 12.3456789012})).await;
    c.goto(&s.url(&format!("/console/default/default/devices/{on}")))
        .await
        .unwrap();
    let captions: Vec<String> = {
        let mut v = Vec::new();
        for f in c
            .find_all(Locator::Css("figure.chart figcaption"))
            .await
            .unwrap()
        {
            v.push(f.text().await.unwrap());
        }
        v
    };
    assert_eq!(captions.len(), 2, "{captions:?}");
    assert!(
        captions[0].starts_with("batt: 1 point (one kept per 10 s at most")
            && captions[0].ends_with("min 12.346, max 12.346"),
        "{captions:?}"
    );
    // The first kept sample and the latest at least (a slow machine may keep one between).
    assert!(
        captions[1].starts_with("cpu: ")
            && captions[1].contains(" points ")
            && captions[1].ends_with("max 99")
            && !captions[1].contains("95.1234"),
        "{captions:?}"
    );
    assert_eq!(
        c.find_all(Locator::Css("figure.chart circle.point"))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        c.find_all(Locator::Css("figure.chart polyline"))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        c.find_all(Locator::Css("figure.chart text.axis"))
            .await
            .unwrap()
            .len(),
        3
    );
    shot(c, "3b-device-metrics").await;
    c.find(Locator::Css("a.session"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path().contains("/sessions/")).await;
    assert_eq!(text(c, "#log-total").await, "3 matching lines");
    let sid: u64 = c
        .current_url()
        .await
        .unwrap()
        .path()
        .rsplit('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.find(Locator::Css("#tail[data-open='1']")).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the live tail never connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tok = device_token(&s, "r-online").await;
    post_lines(&s, sid, &tok, "fresh-from-api", 1).await;
    wait_tail(c, "fresh-from-api line 0", true).await;
    shot(c, "5-session-live").await;
    // Enough lines to scroll, then the reader scrolls up: new lines wait.
    post_lines(&s, sid, &tok, "filler", 300).await;
    wait_tail(c, "filler line 299", true).await;
    c.execute(
        "var l = document.getElementById('tail-lines'); l.scrollTop = 0; l.dispatchEvent(new Event('scroll')); return l.scrollTop;",
        vec![],
    )
    .await
    .unwrap();
    post_lines(&s, sid, &tok, "while-paused", 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !text(c, "#tail-status")
        .await
        .starts_with("Paused: 1 new lines")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            text(c, "#tail-status").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_tail(c, "while-paused line 0", false).await;
    c.find(Locator::Css("#tail-resume"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_tail(c, "while-paused line 0", true).await;

    // The firing alert, with its notification's outcome.
    c.find(Locator::LinkText("Alerts"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path().ends_with("/alerts")).await;
    assert_eq!(text(c, "tr.alert.firing .state").await, "firing");
    shot(c, "6-alerts").await;

    // The rollout's phase, paused from the page (a CSRF-checked write from the browser).
    c.goto(&s.url(&format!("/console/default/default/deployments/{dep}")))
        .await
        .unwrap();
    assert_eq!(text(c, "#current-phase").await, "canary");
    assert_eq!(text(c, "#rollout-state").await, "running");
    shot(c, "7-rollout").await;
    c.find(Locator::Css("#rollout-action"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while text(c, "#rollout-state").await != "paused" {
        assert!(std::time::Instant::now() < deadline, "never shown paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = s.get(&format!("{DEPS}/{dep}/rollout"), s.key()).await;
    assert_eq!(r.body["state"], "paused");

    // The other pages: pipeline (capsules, configurations), alert rules with a backtest of a
    // draft rule, webhooks and test runs.
    c.goto(&s.url("/console/default/default/pipeline"))
        .await
        .unwrap();
    assert!(text(c, "main table").await.contains("nav"));
    shot(c, "8-pipeline").await;
    c.goto(&s.url("/console/default/default/rules"))
        .await
        .unwrap();
    assert!(
        text(c, "main")
            .await
            .contains("\"signing_secret\":\"****\""),
        "secrets masked"
    );
    let area = c.find(Locator::Css("#condition")).await.unwrap();
    area.send_keys(r#"{"type": "metric_threshold", "metric": "cpu", "operator": "gt", "threshold": 90, "duration_seconds": 0}"#)
        .await
        .unwrap();
    let hours = c.find(Locator::Css("#hours")).await.unwrap();
    hours.clear().await.unwrap();
    hours.send_keys("1").await.unwrap();
    c.find(Locator::Css("#backtest"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path().ends_with("/rules/backtest")).await;
    assert!(
        text(c, "#backtest-result")
            .await
            .starts_with("1 of 2 devices would have fired")
    );
    shot(c, "9-rules-backtest").await;
    c.goto(&s.url("/console/default/default/webhooks"))
        .await
        .unwrap();
    text(c, "main table").await;
    shot(c, "10-webhooks").await;

    // Sign out: back to the sign-in page, and the console is closed again.
    c.find(Locator::Css("form.signout button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_url(c, |u| u.path().ends_with("/console/login")).await;
    text(c, "#signin").await;
    c.goto(&s.url("/console/default/default")).await.unwrap();
    assert!(
        c.current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/console/login")
    );
    b.client.clone().close().await.unwrap();
}

/// The page's CSRF field.
fn csrf_of(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap()
        .to_string()
}

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

each_backend!(a_member_retries_a_failed_device_from_the_rollout_page);
/// A phase's failed device is listed on the rollout page with the words of its report and a
/// Retry button for a member (none for a viewer); the button offers the package again.
async fn a_member_retries_a_failed_device_from_the_rollout_page() {
    let s = start().await;
    let (d, tok) = device(&s, "r-bad", json!({"site": "x"})).await;
    let cap = capsule(&s, "nav", "1.0.0").await;
    let r = s
        .post(
            DEPS,
            s.key(),
            json!({"name": "nav", "composition_tag": "nav-1", "capsule_id": cap,
                "target_devices": [d],
                "rollout": {"phases": [{"name": "only", "devices": {"percent": 100}}]}}),
        )
        .await;
    let dep = r.body["id"].as_u64().unwrap();
    let r = s
        .post(&format!("{DEPS}/{dep}/activate"), s.key(), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s
        .post(
            &format!("{}/{dep}/status", crate::updates::UPDATE),
            &tok,
            json!({"status": "failed", "message": "hook exit 3"}),
        )
        .await;
    assert_eq!(r.status, 202);
    let c = no_redirects();
    let page = s.url(&format!("/console/default/default/deployments/{dep}"));
    let html = |cookie: String| {
        let (c, page) = (c.clone(), page.clone());
        async move {
            let r = c.get(page).header("cookie", cookie).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let viewer = format!("fleetops_session={}", s.member_key("viewer").await);
    let v = html(viewer).await;
    assert!(
        v.contains("hook exit 3") && !v.contains(&format!("retry-{d}")),
        "{v}"
    );
    let member = format!("fleetops_session={}", s.member_key("member").await);
    let m = html(member.clone()).await;
    assert!(m.contains(&format!("id=\"retry-{d}\"")), "{m}");
    let r = c
        .post(s.url(&format!(
            "/console/default/default/deployments/{dep}/rollout/devices/{d}/retry"
        )))
        .header("cookie", &member)
        .form_of(&[("csrf", csrf_of(&m))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let view = s.get(&format!("{DEPS}/{dep}/rollout"), s.key()).await;
    assert_eq!(
        view.body["phases"][0]["counts"]["retrying"], 1,
        "{}",
        view.body
    );
}
