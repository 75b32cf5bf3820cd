//! The module graph of `actors/` read from its `use` paths: no import cycles, and the rules
//! (pure functions and types) import neither handles nor writers. Run by `cargo test`, so CI
//! holds the layering.

#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fleetops_testkit::layering::{code, cycle_from, paths};

/// Modules the rules may use: other rules and leaf helpers that depend on nothing stateful.
const RULES_MAY_USE: &[&str] = &["error", "versions", "clock", "text"];

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    fleetops_testkit::layering::graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
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
                "session::search",
                "webhooks::secret",
                "webhooks::deliveries",
                "webhooks::repositories",
                "webhooks::runs",
                "webhooks::views",
            ]
            .contains(&m)
    };
    // A handle's own tests (`<handle>::tests`) are the handle's.
    let inside_handle = |m: &str| handle(m) || m.strip_suffix("::tests").is_some_and(&handle);
    let g = graph();
    for w in WRITERS {
        assert!(g.contains_key(*w), "no module {w}");
        // A writer's own submodules (its feed, schedule, commit...) are the writer too.
        let parts = g
            .keys()
            .filter(|m| *m == w || (m.starts_with(&format!("{w}::")) && !inside_handle(m)));
        for m in parts {
            for d in &g[m] {
                assert!(!handle(d), "writer {m} imports the handle module {d}");
            }
        }
    }
}

/// Each family's messages to a project's writer are built only by that family's handles
/// (the writer's own module and its tests match and build them too).
#[test]
fn project_messages_are_built_only_by_their_familys_handles() {
    // Each family's enum by name, and its variant of `ProjectMsg`.
    const BUILT_BY: &[(&str, &[&str])] = &[
        ("DevicesMsg", &["project/handle.rs"]),
        ("ProjectMsg::Devices", &["project/handle.rs"]),
        ("SessionsMsg", &["session/handle.rs"]),
        ("ProjectMsg::Sessions", &["session/handle.rs"]),
        ("PipelineMsg", &["pipeline/"]),
        ("ProjectMsg::Pipeline", &["pipeline/"]),
        (
            "AlertingMsg",
            &["alerts/integrations.rs", "alerts/rules.rs"],
        ),
        (
            "ProjectMsg::Alerting",
            &["alerts/integrations.rs", "alerts/rules.rs"],
        ),
    ];
    const WRITER: &[&str] = &["project/mod.rs", "project/messages.rs", "project/tests.rs"];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("readable src").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut seen = BTreeSet::new();
    for f in &files {
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        if WRITER.contains(&rel.as_str()) {
            continue;
        }
        let text = code(&std::fs::read_to_string(f).expect("readable file"));
        for (msg, allowed) in BUILT_BY {
            if text.contains(msg) {
                assert!(
                    allowed.iter().any(|a| rel.starts_with(a)),
                    "{rel} builds {msg}: only {allowed:?} may"
                );
                seen.insert(*msg);
            }
        }
    }
    for msg in ["DevicesMsg", "SessionsMsg", "PipelineMsg", "AlertingMsg"] {
        assert!(seen.contains(msg), "{msg} was not found: {seen:?}");
    }
}
