//! The module graph of `actors/` read from its `use` paths: no import cycles, and the rules
//! (pure functions and types) import neither handles nor writers. Run by `cargo test`, so CI
//! holds the layering.

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules the rules may use: other rules and leaf helpers that depend on nothing stateful.
const RULES_MAY_USE: &[&str] = &["error", "versions", "clock", "text"];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable src").flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs` is the root, "".
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file
        .strip_prefix(src)
        .expect("under src")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts.join("::")
}

/// The code without comments and without the `#[cfg(test)] mod tests` tail.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path starting with `crate::`, `super::` or `self::`, with `{a, b::c}` groups
/// expanded one level.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| code[i..].starts_with(**p))
            .filter(|_| i == 0 || !ident(b[i - 1]));
        let Some(_) = starts else {
            i += 1;
            continue;
        };
        let mut j = i;
        while j < b.len() && (ident(b[j]) || b[j] == b':') {
            j += 1;
        }
        let base = code[i..j].trim_end_matches(':').to_string();
        if code[i..j].ends_with("::") && j < b.len() && b[j] == b'{' {
            let end = code[j..].find('}').map_or(b.len(), |e| j + e);
            for item in code[j + 1..end].split(',') {
                let item = item.trim().split([' ', ':']).next().unwrap_or("");
                if !item.is_empty() && item != "self" {
                    out.push(format!("{base}::{item}"));
                }
            }
            j = end;
        }
        out.push(base);
        i = j.max(i + 1);
    }
    out
}

/// The longest existing module a path names, relative to `from`.
fn resolve(mods: &BTreeSet<String>, from: &str, path: &str) -> Option<String> {
    let mut segs: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").collect()
    };
    match segs.first().copied() {
        Some("crate") => {
            base.clear();
            segs.remove(0);
        }
        Some("self") => {
            segs.remove(0);
        }
        Some("super") => {
            while segs.first() == Some(&"super") {
                base.pop();
                segs.remove(0);
            }
        }
        _ => return None,
    }
    (0..=segs.len()).rev().find_map(|n| {
        let m = base
            .iter()
            .chain(segs.iter().take(n))
            .copied()
            .collect::<Vec<_>>()
            .join("::");
        mods.contains(&m).then_some(m)
    })
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mods: BTreeSet<String> = all.iter().map(|f| module_of(&src, f)).collect();
    let mut edges = BTreeMap::new();
    for f in &all {
        let m = module_of(&src, f);
        let text = std::fs::read_to_string(f).expect("readable file");
        let deps: BTreeSet<String> = paths(&code(&text))
            .iter()
            .filter_map(|p| resolve(&mods, &m, p))
            // A module's own children and ancestors are its inside, not a dependency.
            .filter(|d| !d.is_empty() && *d != m && !m.starts_with(&format!("{d}::")))
            .collect();
        edges.insert(m, deps);
    }
    edges
}

/// A cycle through `start`, if any (depth-first).
fn cycle_from(
    g: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    at: &str,
    path: &mut Vec<String>,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    for next in g.get(at).into_iter().flatten() {
        if next == start {
            let mut c = path.clone();
            c.push(start.to_string());
            return Some(c);
        }
        if seen.insert(next.clone()) {
            path.push(next.clone());
            if let Some(c) = cycle_from(g, start, next, path, seen) {
                return Some(c);
            }
            path.pop();
        }
    }
    None
}

#[test]
fn the_module_graph_has_no_cycles() {
    let g = graph();
    assert!(g.len() > 20, "the source was not read: {g:?}");
    for m in g.keys() {
        let mut path = vec![m.clone()];
        let mut seen = BTreeSet::new();
        if let Some(c) = cycle_from(&g, m, m, &mut path, &mut seen) {
            panic!("import cycle: {}", c.join(" -> "));
        }
    }
}

/// The top-level module (family) of a module: `alerts::rules` is in `alerts`.
fn family(m: &str) -> &str {
    m.split("::").next().unwrap_or(m)
}

/// The graph between top-level modules: `a -> b` when some module of `a` imports some
/// module of `b` (imports inside one family left out).
fn family_graph(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, deps) in g {
        let from = family(m).to_string();
        let e = out.entry(from.clone()).or_default();
        for d in deps {
            if family(d) != from {
                e.insert(family(d).to_string());
            }
        }
    }
    out
}

#[test]
fn top_level_modules_import_each_other_in_one_direction() {
    let g = family_graph(&graph());
    assert!(
        g.get("alerts").is_some_and(|d| d.contains("project")),
        "the families were not read: {g:?}"
    );
    for m in g.keys() {
        let mut path = vec![m.clone()];
        let mut seen = BTreeSet::new();
        if let Some(c) = cycle_from(&g, m, m, &mut path, &mut seen) {
            panic!("import cycle between top-level modules: {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_family_graph_sees_a_cycle_of_two_families() {
    // `a::x` imports `b::y` and `b::z` imports `a`: no cycle between whole module paths, one
    // between the families.
    let mut g = BTreeMap::new();
    g.insert("a::x".to_string(), BTreeSet::from(["b::y".to_string()]));
    g.insert("b::z".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("b::y".to_string(), BTreeSet::new());
    g.insert("a".to_string(), BTreeSet::new());
    let f = family_graph(&g);
    let mut path = vec!["a".to_string()];
    assert!(cycle_from(&f, "a", "a", &mut path, &mut BTreeSet::new()).is_some());
    let mut path = vec!["a::x".to_string()];
    assert!(cycle_from(&g, "a::x", "a::x", &mut path, &mut BTreeSet::new()).is_none());
}

#[test]
fn rules_import_neither_handles_nor_writers() {
    let g = graph();
    let rules: Vec<_> = g.keys().filter(|m| m.starts_with("rules")).collect();
    assert!(rules.len() >= 3, "{rules:?}");
    for m in rules {
        for d in &g[m] {
            assert!(
                d.starts_with("rules") || RULES_MAY_USE.contains(&d.as_str()),
                "{m} uses {d}: rules may use only other rules and {RULES_MAY_USE:?}"
            );
        }
    }
}

#[test]
fn the_reader_sees_imports() {
    // The parser itself: a group, a nested path, `super`, and a comment that is ignored.
    let p = paths(&code(
        "use crate::a::{b, c::D};\nuse super::e;\n// crate::zzz\nlet x = crate::f::g();",
    ));
    for want in ["crate::a::b", "crate::a::c", "super::e", "crate::f::g"] {
        assert!(p.iter().any(|x| x == want), "{want} in {p:?}");
    }
    assert!(!p.iter().any(|x| x.contains("zzz")));
}

/// The writers (the actors and their state changes) import no handle: a handle calls its
/// writer, never the other way round. The webhook worker, the housekeeper and the rollout
/// controllers are not writers; they drive the writers through the handles. The two leaf
/// modules writers share with handles (`assignments`, `provenance`) are checked as writers.
#[test]
fn writers_import_no_handle() {
    const WRITERS: &[&str] = &[
        "directory",
        "project",
        "project::devices",
        "project::sessions",
        "project::capsules",
        "project::configurations",
        "project::deployments",
        "project::alerting",
        "alerts::evaluator",
        "alerts::notifier",
        "session",
        "quota",
        "webhooks::intake",
        "webhooks::installation",
        "webhooks::dispatcher",
        "webhooks::work",
        "assignments",
        "provenance",
    ];
    let handle = |m: &str| {
        m.ends_with("::handle")
            || m == "pipeline"
            || m.starts_with("pipeline::")
            || m == "webhooks"
            || m == "alerts"
            || [
                "alerts::integrations",
                "alerts::rules",
                "alerts::history",
                "alerts::backtest",
                "session::artifacts",
                "session::exports",
                "webhooks::secret",
                "webhooks::deliveries",
                "webhooks::repositories",
                "webhooks::runs",
                "webhooks::views",
            ]
            .contains(&m)
    };
    let g = graph();
    for w in WRITERS {
        let deps = g.get(*w).unwrap_or_else(|| panic!("no module {w}"));
        for d in deps {
            assert!(!handle(d), "writer {w} imports the handle module {d}");
        }
    }
}
