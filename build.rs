//! Names the build for `--version`: the git commit and the enabled features.
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    println!(
        "cargo:rustc-env=DRAINSHIM_VERSION={} (commit {}, features: {})",
        std::env::var("CARGO_PKG_VERSION")?,
        commit(),
        features()
    );
    Ok(())
}

/// The commit DRAINSHIM_COMMIT names (the image build, which copies no
/// `.git`), else the checkout's short commit, else `unknown` (a source
/// tarball): never a failed build. Reruns when HEAD moves: HEAD itself (a
/// checkout), the branch it names (a commit) and packed-refs (a gc).
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=DRAINSHIM_COMMIT");
    if let Some(given) = std::env::var("DRAINSHIM_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        return given.trim().to_string();
    }
    for path in ["HEAD", "packed-refs"] {
        watch(git(&["rev-parse", "--git-path", path]));
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(git(&["rev-parse", "--git-path", &branch]));
    }
    git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

/// Reruns the build script when `path` changes; only for files that exist,
/// since cargo reruns on every build for a missing one.
fn watch(path: Option<String>) {
    if let Some(path) = path.filter(|p| std::path::Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// Runs git in the crate's directory; `None` when git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

/// The enabled features, `mimalloc` or `none` (cargo sets CARGO_FEATURE_<NAME>
/// for each; `default` only turns others on).
fn features() -> String {
    let mut on: Vec<String> = std::env::vars()
        .filter_map(|(k, _)| k.strip_prefix("CARGO_FEATURE_").map(str::to_string))
        .filter(|f| f != "DEFAULT")
        .map(|f| f.to_lowercase().replace('_', "-"))
        .collect();
    on.sort();
    if on.is_empty() {
        "none".into()
    } else {
        on.join(",")
    }
}
