//! The library's layering (docs/design.md, "The parts"), held against the
//! code: top-level modules of `src/` import each other without cycles, only
//! `main` and `cli` name `cli`, `metrics` and the leaves import nothing of
//! the crate above them, nothing in `src/` reaches for the bench (it is a
//! crate of its own, drainshim-bench, on top of this one), and
//! `src/` keeps its parts in rooms (the two modes apart, few files loose).
//! The top level holds `proto/` and `benches/`, as the design draws it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/guard/relay/mod.rs` -> `guard`; `src/main.rs` -> `main`.
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
    let body = match text.find("#[cfg(test)]\nmod tests {") {
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
        assert!(!deps.contains("bench"), "{module} imports a bench module");
    }
    assert!(
        !g.contains_key("bench"),
        "src/bench/ is back in the product"
    );
}

/// The product does not know its harness: no file of `src/` names
/// drainshim-bench's crate (the `bench` and `demo` subcommands run its
/// binary, by name).
#[test]
fn the_product_does_not_link_the_bench() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files {
        let code = production_code(&std::fs::read_to_string(&file).expect("read"));
        assert!(
            !code.contains("drainshim_bench"),
            "{} uses the drainshim_bench crate",
            file.display()
        );
    }
}

/// The repository's top level as docs/design.md draws it: the product's
/// manifest and sources, the bench protocol and the benchmarks, the deploy
/// files, the tests and the image's recipe. drainshim-bench (`bench/`)
/// reads the proto and the benches from there and keeps neither inside.
#[test]
fn the_top_level_holds_proto_and_benches() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in [
        "Cargo.toml",
        "src",
        "proto",
        "deploy",
        "benches",
        "tests",
        "Dockerfile",
    ] {
        assert!(root.join(name).exists(), "no {name} at the top level");
    }
    for inside in ["bench/proto", "bench/benches"] {
        assert!(
            !root.join(inside).exists(),
            "{inside} is back inside the harness"
        );
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

/// Every server of drainshim's own HTTP (the control endpoints, the node
/// agent, the webhook) serves through `http::server`, a leaf: the webhook
/// borrows nothing of `control`, and no file but `src/http/server.rs` builds
/// a hyper server connection itself.
#[test]
fn the_servers_share_http_server() {
    let g = graph();
    assert!(!g["inject"].contains("control"), "inject imports control");
    for server in ["control", "node", "inject"] {
        assert!(g[server].contains("http"), "{server} does not use http");
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let builders: Vec<_> = files
        .iter()
        .filter(|f| !f.starts_with(src.join("guard")))
        .filter(|f| {
            production_code(&std::fs::read_to_string(f).expect("read"))
                .contains("server::conn::http1::Builder")
        })
        .map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string())
        .collect();
    assert_eq!(
        builders,
        ["http/server.rs"],
        "HTTP/1.1 servers built outside http::server"
    );
}

/// The sidecar and the node agent are two rooms of the same kind: what
/// both use lives in a room of its own (`control`, `drain`, `guard`), so
/// neither imports the other; and `src/` holds at most eight loose files
/// (the crate's root, the binary, the settings and the leaves).
#[test]
fn src_keeps_its_parts_in_rooms() {
    let g = graph();
    assert!(!g["sidecar"].contains("node"), "sidecar imports node");
    assert!(!g["node"].contains("sidecar"), "node imports sidecar");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loose: Vec<String> = std::fs::read_dir(&src)
        .expect("read src/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
        .collect();
    assert!(
        loose.len() <= 8,
        "{} loose files in src/: {loose:?}",
        loose.len()
    );
}

/// The module a file is, as a path under its folder: `relay/client.rs` ->
/// ["relay", "client"]; `relay/mod.rs` -> ["relay"].
fn module_path(rel: &Path) -> Vec<String> {
    let mut here: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if here.last().is_some_and(|l| l == "mod") {
        here.pop();
    }
    here
}

/// The guard modules a file names: `guard::x`, `super::x` (resolved from
/// the file's place), and `x::` at the start of a `use` of the guard's own
/// submodules: the first name under `guard` of each.
fn guard_file_imports(guard: &Path, file: &Path, text: &str) -> BTreeSet<String> {
    let rel = file.strip_prefix(guard).expect("under src/guard/");
    let here = module_path(rel);
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices("guard::") {
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        out.insert(ident(&text[i + "guard::".len()..]));
    }
    for (i, _) in text.match_indices("super::") {
        let before = text[..i].chars().last();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        // `super::super::x` from `relay/client.rs` is guard's `x`.
        let mut level = here.len();
        let mut rest = &text[i..];
        while let Some(r) = rest.strip_prefix("super::") {
            level = level.saturating_sub(1);
            rest = r;
        }
        let mut path: Vec<String> = here[..level.min(here.len())].to_vec();
        if rest.starts_with('{') {
            let group = &rest[1..rest.find('}').unwrap_or(rest.len())];
            for item in group.split(',') {
                let name = ident(item.trim());
                if !name.is_empty() {
                    let mut p = path.clone();
                    p.push(name);
                    out.insert(p[0].clone());
                }
            }
        } else {
            path.push(ident(rest));
            out.insert(path[0].clone());
        }
    }
    out
}

/// The guard's wings (`src/guard/relay/`, the HTTP/2 path, and
/// `src/guard/h1/`, HTTP/1.1) import the core and never each other, and
/// the core imports neither; only `accept` (and `mod.rs`, which declares
/// them) names both.
#[test]
fn the_guard_wings_import_the_core_never_each_other() {
    let guard = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guard");
    let mut files = Vec::new();
    rust_files(&guard, &mut files);
    assert!(files.len() > 20, "too few guard files: {files:?}");
    let mut seen = BTreeSet::new();
    for file in files {
        let rel = file.strip_prefix(&guard).expect("under guard");
        let wing = match rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy())
        {
            Some(c) if c == "relay" || c == "h1" => c.to_string(),
            _ => String::new(),
        };
        seen.insert(wing.clone());
        let text = production_code(&std::fs::read_to_string(&file).expect("read"));
        let names = guard_file_imports(&guard, &file, &text);
        let forbidden: &[&str] = match wing.as_str() {
            "relay" => &["h1", "accept"],
            "h1" => &["relay", "accept"],
            _ if rel == Path::new("mod.rs") || rel == Path::new("accept.rs") => &[],
            _ => &["relay", "h1"],
        };
        let bad: Vec<_> = names
            .iter()
            .filter(|n| forbidden.contains(&n.as_str()))
            .collect();
        assert!(bad.is_empty(), "{} imports {bad:?}", rel.display());
    }
    assert!(
        seen.contains("relay") && seen.contains("h1"),
        "the wings are gone: {seen:?}"
    );
}

/// The connection drivers (both wings and the WebSocket relay) are given
/// the narrow `Handle` of `src/guard/handle.rs`, never the guard's whole
/// state: none of their files names `Inner`.
#[test]
fn the_drivers_see_the_guard_through_its_handle_only() {
    let guard = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guard");
    let mut checked = 0;
    for dir in ["relay", "h1", "websocket"] {
        let mut files = Vec::new();
        rust_files(&guard.join(dir), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read");
            let code = production_code(&text);
            assert!(
                !names_word(&code, "Inner"),
                "{} reaches past the handle into Inner",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 15, "too few driver files: {checked}");
    assert!(!names_word(
        "struct InnerCount; let x: MyInner = y;",
        "Inner"
    ));
    assert!(names_word("fn f(g: &Arc<Inner>) {}", "Inner"));
}

/// What a driver may call is the handle's methods, exactly: adding one is
/// a decision made here. None of them starts or ends a drain, or hands out
/// the stream registry or the task tracker, and no driver names those.
#[test]
fn the_handle_offers_a_driver_only_what_it_may_call() {
    let guard = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guard");
    let text = std::fs::read_to_string(guard.join("handle.rs")).expect("read handle.rs");
    let code = production_code(&text);
    let start = code.find("impl Handle {").expect("impl Handle");
    let end = code[start..]
        .find("\n}\n")
        .map_or(code.len(), |e| start + e);
    let mut methods = Vec::new();
    let mut test_only = false;
    for line in code[start..end].lines().map(str::trim_start) {
        if let Some(rest) = line
            .strip_prefix("pub fn ")
            .or_else(|| line.strip_prefix("pub async fn "))
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !test_only {
                methods.push(name);
            }
        }
        if !line.is_empty() {
            test_only = line == "#[cfg(test)]";
        }
    }
    methods.sort();
    let mut allowed = vec![
        // What to reach and how.
        "config",
        "connector",
        "connect_app",
        // Streams: register one, read and end its connection's.
        "register",
        "try_register",
        "try_register_relayed",
        "connection_streams",
        // Tasks and connections.
        "spawn",
        "count_connection",
        // Watch the drain (never start it).
        "goaway_all",
        "terminate_all",
        "closing",
        "goaway_all_asked",
        "terminating",
        // A connection's own age.
        "max_age",
        "lifecycle",
        // Counting what it did.
        "signals",
        "record_termination",
        "record_ungraceful",
        "record_blind_ending",
        "record_dropped",
        "record_app_lost",
        "record_goaway",
        "record_app_goaway",
        "limited",
    ];
    allowed.sort_unstable();
    assert_eq!(
        methods, allowed,
        "the handle's methods changed: decide here"
    );

    for dir in ["relay", "h1", "websocket"] {
        let mut files = Vec::new();
        rust_files(&guard.join(dir), &mut files);
        // (A wing's unit tests, in tests.rs or tests/, build a metrics registry.)
        let unit_tests =
            |f: &Path| f.ends_with("tests.rs") || f.components().any(|c| c.as_os_str() == "tests");
        for file in files
            .into_iter()
            .filter(|f| !unit_tests(f.strip_prefix(&guard).unwrap_or(f)))
        {
            let code = production_code(&std::fs::read_to_string(&file).expect("read"));
            for word in [
                "Registry",
                "TaskTracker",
                "begin_terminating",
                "terminate_within",
            ] {
                assert!(
                    !names_word(&code, word),
                    "{} names {word}: a driver must not reach the registry, the tracker or the drain",
                    file.display()
                );
            }
        }
    }
}

/// Whether `code` holds `word` as a whole identifier.
fn names_word(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[test]
fn the_layering_rule_sees_a_wing_importing_the_other() {
    let guard = Path::new("/x/src/guard");
    let file = guard.join("relay/client.rs");
    for text in [
        "use crate::guard::h1::serve;",
        "use super::super::h1::serve;",
        "use super::super::{body, h1};",
        "crate::guard::h1::serve(a).await",
    ] {
        let names = guard_file_imports(guard, &file, text);
        assert!(names.contains("h1"), "{text}: {names:?}");
    }
    // A sibling in the same wing, and the core, are fine.
    let names = guard_file_imports(
        guard,
        &file,
        "use super::blocks::x; use crate::guard::body;",
    );
    assert_eq!(
        names,
        BTreeSet::from(["relay".to_string(), "body".to_string()])
    );
}

/// Each struct in `code` with named fields, and how many it has: the lines
/// directly inside its braces (not in a nested block) that name a field,
/// whatever its visibility.
fn struct_fields(code: &str) -> Vec<(String, usize)> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (i, _) in code.match_indices("struct ") {
        if code[..i].chars().next_back().is_some_and(ident) {
            continue;
        }
        let rest = &code[i + "struct ".len()..];
        let name: String = rest.chars().take_while(|c| ident(*c)).collect();
        // Past the generics, which may hold `(` (`F: Fn(u8)`).
        let mut at = name.len();
        if rest[at..].starts_with('<') {
            let mut depth = 0;
            for (j, c) in rest[at..].char_indices() {
                match c {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    at += j + 1;
                    break;
                }
            }
        }
        let Some(open) = rest[at..].find(['{', ';', '(']).map(|o| at + o) else {
            continue;
        };
        if !rest[open..].starts_with('{') {
            continue;
        }
        // A line is read when it starts in the struct's own braces; one
        // that starts deeper goes on a line above (an attribute's or a
        // type's).
        let (mut depth, mut line_depth) = (0, 0);
        let mut line = String::new();
        let mut fields = 0;
        for c in rest[open..].chars() {
            match c {
                '{' | '(' | '[' => depth += 1,
                '}' | ')' | ']' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                break;
            }
            if c == '\n' {
                fields += usize::from(line_depth == 1 && names_a_field(&line));
                line.clear();
                line_depth = depth;
            } else {
                line.push(c);
            }
        }
        out.push((name, fields));
    }
    out
}

/// Whether one line of a struct's body (at its own depth) declares a field:
/// `name: Type`, after any visibility (`pub`, `pub(crate)`, `pub(in x)`).
fn names_a_field(line: &str) -> bool {
    let l = line.trim();
    if l.starts_with("//") || l.starts_with('#') {
        return false;
    }
    let l = match l.strip_prefix("pub") {
        Some(r) if r.starts_with('(') => r.find(')').map_or(r, |e| &r[e + 1..]),
        Some(r) if r.starts_with(' ') => r,
        _ => l,
    };
    l.trim_start().split_once(':').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Every file of `src/` but unit tests (a `tests.rs` or a `tests/` folder),
/// as `(path under src/, its production code)`.
fn production_files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .iter()
        .map(|f| f.strip_prefix(&src).unwrap_or(f))
        .filter(|rel| {
            !rel.ends_with("tests.rs") && !rel.components().any(|c| c.as_os_str() == "tests")
        })
        .map(|rel| {
            let text = std::fs::read_to_string(src.join(rel)).expect("read");
            (rel.display().to_string(), production_code(&text))
        })
        .collect()
}

/// The most fields a struct of `src/` holds: past it, some of them belong
/// together in a type of their own, with a name.
const MAX_FIELDS: usize = 15;

/// The structs of `src/` allowed past [`MAX_FIELDS`] (file, struct, why).
/// An entry that is no longer over the limit fails the rule: drop it.
const WIDE_STRUCTS: &[(&str, &str, &str)] = &[
    (
        "cli/agent.rs",
        "SidecarArgs",
        "clap: one field per flag of `drainshim sidecar` (its timers and the guard's tuning \
         already flattened into groups of their own)",
    ),
    (
        "cli/plan.rs",
        "PlanArgs",
        "clap: one field per flag of `drainshim plan`",
    ),
];

/// Issue 40, then issue 57 for all of `src/`: the code is owning types
/// (docs/design.md, "The relay's map"): no struct holds more than
/// [`MAX_FIELDS`] fields but those [`WIDE_STRUCTS`] names, and no file
/// outside the unit tests imports with a glob (`use super::*`,
/// `use Enum::*`, `pub use m::*`), so each part names what it takes from
/// the others.
#[test]
fn src_is_owning_types() {
    let files = production_files();
    assert!(files.len() > 100, "too few files of src/: {}", files.len());
    let mut wide = Vec::new();
    let mut exempted = BTreeSet::new();
    let mut globs = Vec::new();
    let mut seen = BTreeSet::new();
    for (file, code) in &files {
        for (name, n) in struct_fields(code) {
            seen.insert(name.clone());
            if n <= MAX_FIELDS {
                continue;
            }
            match WIDE_STRUCTS
                .iter()
                .find(|(f, s, _)| f == file && *s == name)
            {
                Some((f, s, why)) => {
                    if why.starts_with("clap:") {
                        let at = code.find(&format!("struct {s} ")).expect("the struct");
                        let derive = code[..at].rfind("#[derive(").expect("a derive");
                        assert!(
                            code[derive..at].contains("Args")
                                || code[derive..at].contains("Parser"),
                            "{f} {s} is exempted as clap's but derives neither Args nor Parser"
                        );
                    }
                    exempted.insert((*f, *s));
                }
                None => wide.push(format!("{file} {name}: {n} fields")),
            }
        }
        // `::*` is only ever a glob: `use a::*;`, `pub use a::*;`,
        // `use a::{b::*, c};`.
        globs.extend(
            code.lines()
                .filter(|l| l.contains("::*"))
                .map(|l| format!("{file}: {}", l.trim())),
        );
    }
    for name in ["Relay", "Metrics", "Limits", "Pod", "Shared"] {
        assert!(
            seen.contains(name),
            "the rule found no `struct {name}`: it reads nothing"
        );
    }
    assert!(
        wide.is_empty(),
        "structs over {MAX_FIELDS} fields: {wide:#?}"
    );
    let stale: Vec<_> = WIDE_STRUCTS
        .iter()
        .filter(|(f, s, _)| !exempted.contains(&(*f, *s)))
        .collect();
    assert!(
        stale.is_empty(),
        "exempted but not over the limit (any more): {stale:#?}"
    );
    assert!(
        globs.is_empty(),
        "glob imports outside the unit tests: {globs:#?}"
    );
}

#[test]
fn the_field_count_sees_fields() {
    let code = "/// doc\npub(super) struct A<'a> {\n    /// x\n    pub(super) x: u32,\n    y: HashMap<u32, Vec<u8>>,\n    #[allow(dead_code)]\n    z: &'a str,\n}\nstruct B;\nstruct C(u8);\n";
    assert_eq!(struct_fields(code), vec![("A".to_string(), 3)]);
    // Any visibility; generics with parentheses; a nested block's lines
    // (a field's type spread over lines) are not fields; an indented struct
    // ends at its own brace.
    let code = "struct D<F: Fn(u8)> {\n    pub(crate) a: u8,\n    pub(in crate::x) b: F,\n    c: Box<dyn Fn(\n        u8,\n    )>,\n}\nfn f() {\n    struct E {\n        e: u8,\n    }\n    let g = E { e: 1 };\n}\nfn destruct (a: u8) {}\n";
    assert_eq!(
        struct_fields(code),
        vec![("D".to_string(), 3), ("E".to_string(), 1)]
    );
}

/// The relay's rooms (docs/design.md, "The relay's map"): each file of
/// `src/guard/relay/` is a room, each folder (`client/`, `ending/`) one
/// room, `mod.rs` the room on top. The rooms a file names, by
/// `super::x` (resolved from its place), `crate::guard::relay::x` and, in
/// `mod.rs`, `x::` of a child room; a name that is no room is an item of
/// `mod.rs`.
fn relay_room_imports(
    rooms: &BTreeSet<String>,
    rel: &Path,
    text: &str,
) -> (String, BTreeSet<String>) {
    let here = module_path(rel);
    let room = here.first().cloned().unwrap_or_else(|| "mod".to_string());
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let room_of = |path: &[String]| -> Option<String> {
        match path.first() {
            None => Some("mod".to_string()),
            Some(first) if rooms.contains(first) => Some(first.clone()),
            Some(first) if first.is_empty() => None,
            Some(_) => Some("mod".to_string()),
        }
    };
    let preceded = |i: usize| {
        text[..i]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut out = BTreeSet::new();
    let mut add = |path: Vec<String>, names: Vec<String>| {
        for name in names {
            let mut p = path.clone();
            p.push(name);
            if let Some(r) = room_of(&p) {
                out.insert(r);
            }
        }
    };
    let names_at = |rest: &str| -> Vec<String> {
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            group.split(',').map(|i| ident(i.trim())).collect()
        } else {
            vec![ident(rest)]
        }
    };
    for (i, _) in text.match_indices("super::") {
        if preceded(i) {
            continue;
        }
        let mut level = here.len();
        let mut rest = &text[i..];
        while let Some(r) = rest.strip_prefix("super::") {
            level = level.saturating_sub(1);
            rest = r;
        }
        if level == 0 && here.is_empty() {
            continue; // `super::` from `mod.rs` is the guard, not a room.
        }
        add(here[..level.min(here.len())].to_vec(), names_at(rest));
    }
    for (i, _) in text.match_indices("guard::relay::") {
        add(Vec::new(), names_at(&text[i + "guard::relay::".len()..]));
    }
    if here.is_empty() {
        for r in rooms {
            let needle = format!("{r}::");
            for (i, _) in text.match_indices(&needle) {
                if !preceded(i) {
                    out.insert(r.clone());
                }
            }
        }
    }
    out.remove(&room);
    out.retain(|r| !r.is_empty());
    (room, out)
}

/// The relay's rooms name each other one way: no room names a room that
/// names it back, however far round, so no arrow of the relay's drawing
/// runs back up. The protocol that ends a stream (`ends.rs`) stands above
/// the stream store, the ending's rules and state (`ending/`) below it.
/// A child that takes `Relay` from `mod.rs` is not named back by it: the
/// fuzz harness (`feed.rs`) is a public module, not re-exported.
#[test]
fn the_relay_rooms_name_each_other_one_way() {
    let relay = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guard/relay");
    let rooms: BTreeSet<String> = std::fs::read_dir(&relay)
        .expect("read relay/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            name.trim_end_matches(".rs").to_string()
        })
        .filter(|n| n != "tests" && n != "mod")
        .collect();
    assert!(rooms.len() > 15, "too few relay rooms: {rooms:?}");
    let mut files = Vec::new();
    rust_files(&relay, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&relay).expect("under relay/");
        if rel.starts_with("tests") {
            continue;
        }
        let text = production_code(&std::fs::read_to_string(&file).expect("read"));
        let (room, names) = relay_room_imports(&rooms, rel, &text);
        g.entry(room).or_default().extend(names);
    }
    assert!(
        g.get("mod").is_some_and(|d| d.len() > 10),
        "mod.rs names too few rooms: {:?}",
        g.get("mod")
    );
    let back: Vec<_> = g
        .iter()
        .flat_map(|(a, deps)| deps.iter().map(move |b| (a, b)))
        .filter(|(a, b)| reaches(&g, b, a))
        .collect();
    assert!(
        back.is_empty(),
        "relay rooms that name each other: {back:?}"
    );
}

#[test]
fn the_relay_room_rule_sees_a_room_named_back() {
    let rooms: BTreeSet<String> = ["ending", "ends", "streams", "feed", "client"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let set = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "ending/state.rs",
            "use crate::guard::relay::streams::Stream;",
            "ending",
            &["streams"],
        ),
        (
            "ending/state.rs",
            "use super::super::streams::{Stream, Streams};",
            "ending",
            &["streams"],
        ),
        (
            "ending/state.rs",
            "use super::cadence::Cadence;",
            "ending",
            &[],
        ),
        ("feed.rs", "use super::Relay;", "feed", &["mod"]),
        (
            "mod.rs",
            "pub use feed::{feed, FeedStep};",
            "mod",
            &["feed"],
        ),
        (
            "client/streams.rs",
            "use super::super::{ends::Ends, Relay};",
            "client",
            &["ends", "mod"],
        ),
    ];
    for (file, text, room, want) in cases {
        let (r, names) = relay_room_imports(&rooms, Path::new(file), text);
        assert_eq!((r.as_str(), names), (room, set(want)), "{file}: {text}");
    }
}
