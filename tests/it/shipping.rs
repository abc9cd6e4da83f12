//! What ships and how it introduces itself: `--version` names the commit and
//! the features, the default build's dependency graph leaves out the
//! bench's, `bench` and `demo` say how to get drainshim-bench when it is
//! missing, `-o` is `--format`, and `install` reads `DRAINSHIM_TO` (and its
//! old name, with a warning). All on the real binary or the real manifest.

use crate::support;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Output;

use serde_json::Value;
use support::*;

/// Runs `program args` (bounded by [`WAIT`]) in the crate's directory.
async fn output(program: &str, args: &[&str]) -> Output {
    tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(program)
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{program} {args:?} did not finish"))
    .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"))
}

/// `drainshim 0.1.0 (commit abc1234, features: none)`: the commit is the
/// checkout's. Other commits may land in the tree between the build and this
/// test, so the one named must be HEAD or one of its ancestors, never a
/// commit the checkout does not have; without git it is `unknown`.
#[tokio::test]
async fn version_names_the_commit_and_the_features() {
    let (code, out, err) = run_bin(&["--version"]).await;
    assert_eq!(code, Some(0), "{err}");
    let features = if cfg!(feature = "mimalloc") {
        "mimalloc"
    } else {
        "none"
    };
    let prefix = format!("drainshim {} (commit ", env!("CARGO_PKG_VERSION"));
    let suffix = format!(", features: {features})\n");
    let commit = out
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(&suffix))
        .unwrap_or_else(|| panic!("--version printed {out:?}, not {prefix}<commit>{suffix:?}"));

    let head = output("git", &["rev-parse", "HEAD"]).await;
    if !head.status.success() {
        assert_eq!(commit, "unknown", "no git checkout here");
        return;
    }
    assert!(
        commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit:?} is not a short commit hash"
    );
    let object = format!("{commit}^{{commit}}");
    let known = output("git", &["rev-parse", "--verify", "--quiet", &object]).await;
    assert!(
        known.status.success(),
        "{commit} is no commit of this checkout"
    );
    let ancestor = output("git", &["merge-base", "--is-ancestor", commit, "HEAD"]).await;
    assert!(
        ancestor.status.success(),
        "{commit} is not HEAD or behind it"
    );
}

/// `cargo build` (the default build, the image's) compiles no bench proto
/// and none of the bench's crates: they are drainshim-bench's (bench/), a
/// dev-dependency here, and drainshim has no feature that brings them. The
/// normal and build dependency graph, walked from drainshim. envoy-types
/// (src/envoy's enums) still depends on tonic and prost; it is left out of
/// the walk so the assertion is about drainshim's own edges.
#[tokio::test]
async fn the_production_build_compiles_no_bench_dependencies() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let out = output(
        env!("CARGO"),
        &[
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--manifest-path",
            manifest.to_str().expect("utf-8 path"),
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().expect("id"),
                p["name"].as_str().expect("name"),
            )
        })
        .collect();
    let nodes: HashMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|n| (n["id"].as_str().expect("id"), n))
        .collect();
    let root = meta["resolve"]["root"].as_str().expect("resolve.root");
    assert_eq!(names[root], "drainshim");
    // The default build is the product: no default features, none for the bench.
    let package = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["id"] == root)
        .expect("drainshim's package");
    let features: BTreeSet<&str> = package["features"]
        .as_object()
        .expect("features")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(features, BTreeSet::from(["mimalloc"]), "{features:?}");

    // Every crate the build compiles, but for dev-dependencies (tests, benches).
    let mut compiled = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        let name = names[id];
        if name == "envoy-types" || !compiled.insert(name) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().expect("deps") {
            let shipped = dep["dep_kinds"]
                .as_array()
                .expect("dep_kinds")
                .iter()
                .any(|k| k["kind"].as_str() != Some("dev"));
            if shipped {
                todo.push(dep["pkg"].as_str().expect("pkg"));
            }
        }
    }
    // Sanity: the walk found the crates production code does use.
    for needed in ["hyper", "h2", "tungstenite", "rustls", "prost"] {
        assert!(compiled.contains(needed), "{needed} missing: {compiled:?}");
    }
    for bench_only in [
        "drainshim-bench",
        "tonic",
        "tonic-prost",
        "tonic-prost-build",
        "protoc-bin-vendored",
        "tokio-tungstenite",
        "plotters",
        "tempfile",
    ] {
        assert!(
            !compiled.contains(bench_only),
            "the default build compiles {bench_only}"
        );
    }
}

/// `drainshim bench` and `drainshim demo` run drainshim-bench; where there is
/// none (a copy of drainshim alone, nothing on PATH) they exit 69 and say how
/// to get it, and `--help` says they need it.
#[tokio::test]
async fn bench_and_demo_say_how_to_get_drainshim_bench() {
    let (code, help, _) = run_bin(&["--help"]).await;
    assert_eq!(code, Some(0));
    for command in ["bench", "demo"] {
        // The command's line and the lines its text wraps onto.
        let mut lines = help
            .lines()
            .skip_while(|l| !l.starts_with(&format!("  {command} ")));
        let first = lines
            .next()
            .unwrap_or_else(|| panic!("--help lists no {command}: {help}"));
        let text: Vec<&str> = std::iter::once(first)
            .chain(lines.take_while(|l| l.starts_with("    ")))
            .map(str::trim)
            .collect();
        let text = text.join(" ");
        assert!(text.contains("needs drainshim-bench"), "{text}");
    }

    let alone = tempfile::tempdir().expect("tempdir");
    let copy = alone.path().join("drainshim");
    std::fs::copy(drainshim_bin(), &copy).expect("copy the binary");
    for args in [&["bench", "server", "--help"][..], &["demo"], &["bench"]] {
        let out = tokio::time::timeout(
            WAIT,
            tokio::process::Command::new(&copy)
                .args(args)
                .env("PATH", "")
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("finishes")
        .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert!(
            err.contains("drainshim-bench not found") && err.contains("cargo install --path bench"),
            "{args:?}: {err}"
        );
    }
}

/// kubectl's `-o json` works where `--format json` does, and the help says so.
#[tokio::test]
async fn o_is_format() {
    let (code, help, _) = run_bin(&["inventory", "--help"]).await;
    assert_eq!(code, Some(0));
    assert!(help.contains("-o, --format <FORMAT>"), "{help}");
    assert!(help.contains("DRAINSHIM_FORMAT"), "{help}");

    // An admin API with nothing listening: listed as unreachable, then exit 69.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let target = format!("http://127.0.0.1:{port}");
    let (code, json, err) = run_bin(&["inventory", "--envoy-admin", &target, "-o", "json"]).await;
    assert_eq!(code, Some(69), "{err}");
    let listed: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let (_, table, _) = run_bin(&["inventory", "--envoy-admin", &target, "-o", "table"]).await;
    assert!(serde_json::from_str::<Value>(&table).is_err(), "{table}");
    assert!(table.contains("UNREACHABLE"), "{table}");
}

/// Runs `drainshim install` with only `env` of the DRAINSHIM_*TO variables.
async fn install(env: &[(&str, &Path)]) -> (Option<i32>, String) {
    let mut cmd = tokio::process::Command::new(drainshim_bin());
    cmd.arg("install")
        .env_remove("DRAINSHIM_TO")
        .env_remove("DRAINSHIM_INSTALL_TO")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(WAIT, cmd.output())
        .await
        .expect("install did not finish")
        .expect("run install");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `install --to` reads DRAINSHIM_TO, as every flag reads DRAINSHIM_<FLAG>;
/// the old DRAINSHIM_INSTALL_TO still works and logs a warning naming the
/// new one; with neither, a usage error names --to.
#[tokio::test]
async fn install_reads_drainshim_to_and_warns_about_the_old_name() {
    let new = tempfile::tempdir().expect("tempdir");
    let (code, err) = install(&[("DRAINSHIM_TO", new.path())]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(new.path().join("drainshim").is_file());
    assert!(!err.contains("DRAINSHIM_INSTALL_TO"), "{err}");

    let old = tempfile::tempdir().expect("tempdir");
    let (code, err) = install(&[("DRAINSHIM_INSTALL_TO", old.path())]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(old.path().join("drainshim").is_file());
    let warning = err
        .lines()
        .find(|l| l.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning: {err}"));
    assert!(
        warning.contains("DRAINSHIM_INSTALL_TO") && warning.contains("DRAINSHIM_TO"),
        "{warning}"
    );

    // Both: the new name wins, and the old one is still warned about.
    let both = tempfile::tempdir().expect("tempdir");
    let unused = tempfile::tempdir().expect("tempdir");
    let (code, err) = install(&[
        ("DRAINSHIM_TO", both.path()),
        ("DRAINSHIM_INSTALL_TO", unused.path()),
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(both.path().join("drainshim").is_file());
    assert!(!unused.path().join("drainshim").exists());
    assert!(err.contains("DRAINSHIM_INSTALL_TO"), "{err}");

    let (code, err) = install(&[]).await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("--to"), "{err}");
}

/// Each command's help says what its timers do there: `drain` has no guard
/// to end streams, and only the sidecar's grace period has a --linger in it.
#[tokio::test]
async fn timer_help_fits_each_command() {
    let help = |cmd: &'static str| async move {
        let (code, out, err) = run_bin(&[cmd, "--help"]).await;
        assert_eq!(code, Some(0), "{cmd}: {err}");
        out
    };
    let drain = help("drain").await;
    assert!(
        drain.contains("`drain` has no guard to end them"),
        "{drain}"
    );
    assert!(!drain.contains("--linger"), "{drain}");
    let sidecar = help("sidecar").await;
    assert!(
        sidecar.contains("--parent-shutdown-time plus --linger"),
        "{sidecar}"
    );
    assert!(sidecar.contains("the stream guard, where there is one"));
    let node = help("node").await;
    assert!(!node.contains("--linger"), "{node}");
}
