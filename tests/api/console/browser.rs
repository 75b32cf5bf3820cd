//! The console in a real browser (Chromium through chromedriver): an operator finds the offline
//! robot, the alert and the rollout, and a member retries a failed device.

use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use super::*;
use crate::configurations::capsule;
use crate::deployments::{DEPS, device};
use crate::evaluation::{fast, heartbeat};
use crate::peers::Sink;

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
