//! The operator console: over plain HTTP (sign-in, the cookie's attributes, a page without a
//! session, CSRF refusal) and in a real browser (Debian's Chromium driven through
//! chromedriver by fantoccini): sign in, find an offline device, open it, see a firing alert,
//! read a rollout's phase and pause it, sign out. Screenshots of each page are kept under
//! `target/console-screenshots/`.

use std::time::Duration;

use fantoccini::{Client, Locator};
use serde_json::{Value, json};

use crate::common::*;
use crate::configurations::capsule;
use crate::deployments::{DEPS, device};
use crate::evaluation::{heartbeat, rule, wait_alerts, webhook};
use crate::peers::Sink;

mod browser;
mod roles;
mod signin;

/// The device tokens `seeded` made: (server, device name, token).
static TOKENS: std::sync::Mutex<Vec<(String, String, String)>> = std::sync::Mutex::new(Vec::new());

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

/// The page's CSRF field.
fn csrf_of(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .unwrap()
        .to_string()
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
