//! The library's layering (docs/design.md, "The parts"), held against the
//! code: top-level modules of `src/` import each other without cycles, only
//! `main` and `cli` name `cli`, `metrics` and the leaves import nothing of
//! the crate above them, and nothing but `cli` needs the bench feature.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/guard/stream.rs` -> `guard`; `src/main.rs` -> `main`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src/");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its `#[cfg(test)]` module (tests may reach
/// anywhere) and without comments.
fn production_code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// module -> the crate modules it names (`crate::x`, `drainshim::x`).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = module_of(&src, &file);
        let text = production_code(&std::fs::read_to_string(&file).expect("read"));
        let deps = g.entry(from.clone()).or_default();
        for prefix in ["crate::", "drainshim::"] {
            for (i, _) in text.match_indices(prefix) {
                let rest = &text[i + prefix.len()..];
                let to: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !to.is_empty() && to != from {
                    deps.insert(to);
                }
            }
            // `use crate::{a, b::c}` groups.
            for (i, _) in text.match_indices(&format!("{prefix}{{")) {
                let group = &text[i + prefix.len() + 1..];
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let to: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !to.is_empty() && to != from && to != "self" {
                        deps.insert(to);
                    }
                }
            }
        }
    }
    g
}

fn reaches(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = g
        .get(from)
        .map(|d| d.iter().map(String::as_str).collect())
        .unwrap_or_default();
    while let Some(m) = stack.pop() {
        if m == to {
            return true;
        }
        if seen.insert(m) {
            if let Some(d) = g.get(m) {
                stack.extend(d.iter().map(String::as_str));
            }
        }
    }
    false
}

#[test]
fn src_has_no_import_cycles() {
    let g = graph();
    assert!(g.len() > 15, "too few modules found: {:?}", g.keys());
    let cycles: Vec<_> = g
        .iter()
        .flat_map(|(a, deps)| deps.iter().map(move |b| (a, b)))
        .filter(|(a, b)| reaches(&g, b, a))
        .collect();
    assert!(cycles.is_empty(), "imports that close a cycle: {cycles:?}");
}

#[test]
fn the_library_takes_settings_not_flags() {
    let g = graph();
    for (module, deps) in &g {
        if module != "main" && module != "cli" {
            assert!(!deps.contains("cli"), "{module} imports cli");
        }
        if !matches!(module.as_str(), "main" | "cli" | "lib" | "bench") {
            assert!(!deps.contains("bench"), "{module} needs the bench feature");
        }
    }
}

#[test]
fn metrics_and_the_leaves_stand_alone() {
    let g = graph();
    for leaf in ["metrics", "config", "http", "error", "timer"] {
        let deps = &g[leaf];
        let above: Vec<_> = deps.iter().filter(|d| *d != "config").collect();
        assert!(above.is_empty(), "{leaf} imports {above:?}");
    }
}
