//! The console's sign-in cookie: the API's own short-lived JWT in an `HttpOnly`,
//! `SameSite=Strict` cookie (`Secure` when the request came over TLS through a trusted proxy),
//! refreshed once half its life has passed (bounded by the API's refresh window). Every form
//! that changes something carries the sign-in's CSRF token (`Authenticator::csrf_token`: an
//! HMAC under a server key, stable across refreshes so every open tab's forms stay valid).

/// The cookie's name (what signed-in browsers hold: renaming it would sign everyone out).
pub const COOKIE: &str = "fleetops_session";

/// The sign-in's token in a `Cookie` header, if any.
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

/// The `Set-Cookie` value that ends the sign-in.
pub fn clear(secure: bool) -> String {
    set("", 0, secure)
}

/// Whether a form's CSRF field is the sign-in's token `expected` (constant time; an empty
/// expectation matches nothing).
pub fn csrf_ok(expected: &str, given: Option<&str>) -> bool {
    !expected.is_empty()
        && given.is_some_and(|g| {
            g.len() == expected.len()
                && g.bytes()
                    .zip(expected.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        })
}

/// Whether a token issued at `issued_at` (Unix seconds) should be replaced now: once half
/// of its `ttl` has passed.
pub fn needs_refresh(issued_at: i64, now: i64, ttl: u64) -> bool {
    now.saturating_sub(issued_at) >= (ttl / 2) as i64
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
    fn csrf_is_refused_unless_it_is_the_sign_ins() {
        let good = "a1".repeat(32);
        assert!(csrf_ok(&good, Some(&good)));
        assert!(!csrf_ok(&good, None));
        assert!(!csrf_ok(&good, Some("")));
        assert!(!csrf_ok(&good, Some(&good[1..])));
        assert!(!csrf_ok(&good, Some(&"b1".repeat(32))));
        let mut bad = good.clone();
        bad.replace_range(63..64, "2");
        assert!(!csrf_ok(&good, Some(&bad)));
        // No expectation (no sign-in): nothing matches, not even an empty field.
        assert!(!csrf_ok("", Some("")));
    }

    #[test]
    fn a_token_is_refreshed_after_half_its_life() {
        assert!(!needs_refresh(1_000, 1_000, 3600));
        assert!(!needs_refresh(1_000, 2_799, 3600));
        assert!(needs_refresh(1_000, 2_800, 3600));
        assert!(needs_refresh(1_000, 9_999, 3600));
    }
}
