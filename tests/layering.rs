//! Every crate of the workspace is free of import cycles between its modules: read from the
//! sources (`fleetops_testkit::layering`), run by `cargo test`, so CI holds it. The actors
//! crate's own layering (rules, writers, handles) is `actors/tests/layering.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use fleetops_testkit::layering::{first_cycle, graph};

/// The module graph of the crate in `dir` (from the workspace root), checked to be read.
fn crate_graph(dir: &str) -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join("src");
    let g = graph(&src);
    assert!(g.len() > 3, "the sources of {dir} were not read: {g:?}");
    g
}

fn assert_acyclic(dir: &str) {
    if let Some(c) = first_cycle(&crate_graph(dir)) {
        panic!("import cycle in {dir}: {}", c.join(" -> "));
    }
}

#[test]
fn the_binary_has_no_import_cycle() {
    assert_acyclic(".");
}

#[test]
fn the_http_crate_has_no_import_cycle() {
    assert_acyclic("http");
}

#[test]
fn the_actors_crate_has_no_import_cycle() {
    assert_acyclic("actors");
}

#[test]
fn the_storage_crate_has_no_import_cycle() {
    assert_acyclic("storage");
}

#[test]
fn the_agent_crate_has_no_import_cycle() {
    assert_acyclic("agent");
}

#[test]
fn the_testkit_crate_has_no_import_cycle() {
    assert_acyclic("testkit");
}

#[test]
fn a_cycle_through_three_modules_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\nmod d;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::write(src.join("b.rs"), "use super::c::{Y, Z};\n").unwrap();
    std::fs::write(src.join("c.rs"), "fn f() { crate::a::g() }\n").unwrap();
    std::fs::write(src.join("d.rs"), "// crate::a is only named in a comment\n").unwrap();
    let g = graph(&src);
    let c = first_cycle(&g).expect("the cycle a -> b -> c -> a");
    assert_eq!(c.len(), 4, "{c:?}");
    assert!(g["d"].is_empty(), "{g:?}");
    std::fs::write(src.join("c.rs"), "fn f() {}\n").unwrap();
    assert_eq!(first_cycle(&graph(&src)), None);
}
