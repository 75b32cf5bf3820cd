//! The module graph of a crate, read from its `use` paths (`crate::`, `super::`, `self::`),
//! and the cycles in it: what the layering tests of every crate check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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
pub fn module_of(src: &Path, file: &Path) -> String {
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
pub fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path starting with `crate::`, `super::` or `self::`, with `{a, b::c}` groups
/// expanded one level.
pub fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .find(|p| b[i..].starts_with(p.as_bytes()))
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

/// The module graph of the crate whose sources are under `src`: each module (`a::b`; the
/// crate root is "") and the modules it imports (its own ancestors and children left out).
pub fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut all = Vec::new();
    files(src, &mut all);
    let src = src.to_path_buf();
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
pub fn cycle_from(
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

/// An import cycle of `g`, if it has one: the modules around it.
pub fn first_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    g.keys().find_map(|m| {
        let mut path = vec![m.clone()];
        cycle_from(g, m, m, &mut path, &mut BTreeSet::new())
    })
}
