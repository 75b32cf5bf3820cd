//! The console's cookie session: the API's own short-lived JWT in an `HttpOnly`,
//! `SameSite=Strict` cookie (`Secure` when the request came over TLS through a trusted proxy),
//! refreshed once half its life has passed (bounded by the API's refresh window), and a CSRF
//! token for every form that changes something: a hash of the session's token, which a page of
//! another origin can neither read (the cookie is `HttpOnly`) nor compute.

use sha2::{Digest, Sha256};

/// The cookie's name.
pub const COOKIE: &str = "fleetops_session";

/// The session token in a `Cookie` header, if any.
pub fn token(cookie_header: Option<&str>) -> Option<&str> {
    cookie_header?
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The `Set-Cookie` value carrying `token` for `max_age` seconds.
pub fn set(token: &str, max_age: u64, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that ends the session.
pub fn clear(secure: bool) -> String {
    set("", 0, secure)
}

/// The CSRF token of a session: hex SHA-256 of a fixed label and the session's token.
pub fn csrf(token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"fleetops-console-csrf\0");
    h.update(token.as_bytes());
    hex(&h.finalize())
}

/// Whether a form's CSRF field is the session's (constant time).
pub fn csrf_ok(token: &str, given: Option<&str>) -> bool {
    let want = csrf(token);
    given.is_some_and(|g| {
        g.len() == want.len()
            && g.bytes()
                .zip(want.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}

/// Whether a token issued at `issued_at` (Unix seconds) should be replaced now: once half
/// of its `ttl` has passed.
pub fn needs_refresh(issued_at: i64, now: i64, ttl: u64) -> bool {
    now.saturating_sub(issued_at) >= (ttl / 2) as i64
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others_and_set_strictly() {
        assert_eq!(
            token(Some("a=1; fleetops_session=tok.en; b=2")),
            Some("tok.en")
        );
        assert_eq!(token(Some("fleetops_session=")), None);
        assert_eq!(token(Some("other=1")), None);
        assert_eq!(token(None), None);
        let c = set("t", 3600, false);
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Max-Age=3600")
        );
        assert!(!c.contains("Secure"));
        assert!(set("t", 1, true).ends_with("; Secure"));
        assert!(
            clear(false).starts_with("fleetops_session=; ") && clear(false).contains("Max-Age=0")
        );
    }

    #[test]
    fn csrf_is_bound_to_the_session_and_refused_otherwise() {
        let t = "header.payload.sig";
        let good = csrf(t);
        assert!(csrf_ok(t, Some(&good)));
        assert!(!csrf_ok(t, None));
        assert!(!csrf_ok(t, Some("")));
        assert!(!csrf_ok(t, Some(&csrf("another.session.token"))));
        let mut bad = good.clone();
        bad.replace_range(0..1, if good.starts_with('0') { "1" } else { "0" });
        assert!(!csrf_ok(t, Some(&bad)));
    }

    #[test]
    fn a_token_is_refreshed_after_half_its_life() {
        assert!(!needs_refresh(1_000, 1_000, 3600));
        assert!(!needs_refresh(1_000, 2_799, 3600));
        assert!(needs_refresh(1_000, 2_800, 3600));
        assert!(needs_refresh(1_000, 9_999, 3600));
    }
}
