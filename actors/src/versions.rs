//! Capsule and configuration versions and the constraints that select them (strict
//! `MAJOR.MINOR.PATCH`; `^`, `~`, ranges, wildcards), on top of the `semver` crate with our
//! own parsing layer for the forms it
//! reads differently: a bare `1.2.3` is exact here (a caret requirement in Cargo's rules),
//! and a bare partial `1.2` / `1` is a wildcard.
//!
//! Versions are strict `MAJOR.MINOR.PATCH`: no `v`, pre-release, build metadata or leading
//! zeros. Constraints: exact, partial (`1.2`, `1`), wildcards (`1.2.*`, `1.*`), caret, tilde,
//! comparators (`>=`, `>`, `<=`, `<`, `=`) and comma-joined AND of them; anything else is 422.

use std::fmt;

use semver::{Version, VersionReq};

use crate::error::{Error, Result};

/// A strict `MAJOR.MINOR.PATCH`.
pub fn parse_version(field: &str, s: &str) -> Result<Version> {
    let bad = || Error::unprocessable(field, format!("{s:?} is not a MAJOR.MINOR.PATCH version"));
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 3 || parts.iter().any(|p| !is_number(p)) {
        return Err(bad());
    }
    Version::parse(s).map_err(|_| bad())
}

/// Digits without a leading zero (a lone `0` is fine).
fn is_number(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 18
        && p.bytes().all(|b| b.is_ascii_digit())
        && !(p.len() > 1 && p.starts_with('0'))
}

/// A parsed constraint; `Display` gives back what was written.
#[derive(Debug, Clone)]
pub struct Constraint {
    text: String,
    req: VersionReq,
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Constraint {
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::unprocessable(field, format!("{s:?} is not a version constraint: {why}"))
        };
        let mut normalized = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("empty comparator"));
            }
            let (op, rest) = split_op(part);
            let rest = rest.trim();
            let pieces: Vec<&str> = rest.split('.').collect();
            if pieces.is_empty() || pieces.len() > 3 {
                return Err(bad("expected MAJOR[.MINOR[.PATCH]]"));
            }
            // Numbers, with `*` allowed only as trailing pieces of a bare wildcard.
            let mut seen_star = false;
            for (i, p) in pieces.iter().enumerate() {
                if *p == "*" {
                    if i == 0 || !op.is_empty() {
                        return Err(bad("a wildcard needs a major version and no operator"));
                    }
                    seen_star = true;
                } else if seen_star || !is_number(p) {
                    return Err(bad("versions are numbers without leading zeros"));
                }
            }
            let item = match (op, pieces.len(), seen_star) {
                // Bare forms: a full version is exact, a partial one a wildcard.
                ("", 3, false) => format!("={rest}"),
                ("", _, false) => format!("{rest}.*"),
                ("", _, true) => rest.to_string(),
                (op, _, _) => format!("{op}{rest}"),
            };
            normalized.push(item);
        }
        let req = VersionReq::parse(&normalized.join(", ")).map_err(|e| bad(&e.to_string()))?;
        Ok(Self {
            text: s.trim().to_string(),
            req,
        })
    }

    pub fn matches(&self, v: &Version) -> bool {
        self.req.matches(v)
    }
}

fn split_op(s: &str) -> (&str, &str) {
    for op in [">=", "<=", ">", "<", "=", "^", "~"] {
        if let Some(rest) = s.strip_prefix(op) {
            return (op, rest);
        }
    }
    ("", s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        parse_version("v", s).unwrap()
    }

    fn m(c: &str, ver: &str) -> bool {
        Constraint::parse("c", c).unwrap().matches(&v(ver))
    }

    #[test]
    fn strict_versions() {
        assert_eq!(v("1.2.3"), Version::new(1, 2, 3));
        assert_eq!(v("0.0.0"), Version::new(0, 0, 0));
        for bad in [
            "v1.2.3",
            "1.2",
            "1",
            "1.2.3-beta",
            "1.2.3+b1",
            "01.2.3",
            "1.02.3",
            "1.2.03",
            "",
            "a.b.c",
            "1.2.3.4",
            " 1.2.3",
        ] {
            assert!(parse_version("v", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exact_is_exact_unlike_cargo() {
        assert!(m("1.2.3", "1.2.3"));
        assert!(!m("1.2.3", "1.2.4"));
        assert!(!m("1.2.3", "1.3.0"));
        assert!(m("=1.2.3", "1.2.3"));
    }

    #[test]
    fn partials_and_wildcards() {
        for c in ["1.2", "1.2.*"] {
            assert!(m(c, "1.2.0") && m(c, "1.2.9"), "{c}");
            assert!(!m(c, "1.3.0") && !m(c, "1.1.9"), "{c}");
        }
        for c in ["1", "1.*", "1.*.*"] {
            assert!(m(c, "1.0.0") && m(c, "1.9.9"), "{c}");
            assert!(!m(c, "2.0.0") && !m(c, "0.9.9"), "{c}");
        }
    }

    #[test]
    fn caret_and_tilde_including_zero_majors() {
        assert!(m("^1.2.0", "1.2.0") && m("^1.2.0", "1.9.9"));
        assert!(!m("^1.2.0", "2.0.0") && !m("^1.2.0", "1.1.9"));
        assert!(m("^0.2.3", "0.2.3") && m("^0.2.3", "0.2.9"));
        assert!(!m("^0.2.3", "0.3.0") && !m("^0.2.3", "0.2.2"));
        assert!(m("^0.0.3", "0.0.3") && !m("^0.0.3", "0.0.4"));
        assert!(m("^1.2", "1.5.0") && !m("^1.2", "2.0.0"));
        assert!(m("~1.2.0", "1.2.7") && !m("~1.2.0", "1.3.0") && !m("~1.2.0", "1.1.9"));
        assert!(m("~1.2", "1.2.0") && !m("~1.2", "1.3.0"));
        assert!(m("~1", "1.9.0") && !m("~1", "2.0.0"));
    }

    #[test]
    fn comparators_and_and() {
        assert!(m(">=1.2.0", "1.2.0") && !m(">=1.2.0", "1.1.9"));
        assert!(m("<2.0.0", "1.9.9") && !m("<2.0.0", "2.0.0"));
        assert!(m(">1.0.0", "1.0.1") && !m(">1.0.0", "1.0.0"));
        assert!(m("<=1.0.0", "1.0.0") && !m("<=1.0.0", "1.0.1"));
        let c = ">=1.2.0, <2.0.0";
        assert!(m(c, "1.2.0") && m(c, "1.99.0"));
        assert!(!m(c, "2.0.0") && !m(c, "1.1.0"));
        assert!(m(">= 1.2.0,<1.4.0", "1.3.5"));
        assert!(m(">=1.2", "1.2.0") && m("<2", "1.9.9") && !m("<2", "2.0.0"));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "*",
            "x",
            "v1.2.3",
            "^1.2.3-beta",
            "1.2.3+b",
            ">=01.2.0",
            "1.*.3",
            "^1.*",
            ">=1.2.0,",
            ",1.0.0",
            "1.2.3.4",
            "==1.2.3",
            "1.2.3 || 2.0.0",
            ">=*",
        ] {
            assert!(Constraint::parse("c", bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            Constraint::parse("c", " ^1.2.0 ").unwrap().to_string(),
            "^1.2.0"
        );
    }
}
