//! The fuzz gate's judgement (`scripts/fuzz.sh`), on targets that stand in
//! for libFuzzer: the script's own code, with the fuzzing left out. Beside
//! the tests at idle priority (`FUZZ_DEFER`), a target that had less than
//! half its seconds in CPU is not passed but sent to run again on its own;
//! run on its own, a target first replays every input saved as a hang or a
//! slow unit, and one that still hangs fails the run, however rarely
//! fuzzing would find it again.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::WAIT;

/// A stand-in for a libFuzzer binary: given files, it runs each once
/// (exit 70, libFuzzer's timeout code here, for one that holds `HANG`);
/// otherwise it "fuzzes" for a second of sleep, no CPU, and prints the
/// final stats the script reads.
const TARGET: &str = r#"#!/usr/bin/env bash
files=()
for a in "$@"; do
  case $a in -*) ;; *) [[ -f $a ]] && files+=("$a") ;; esac
done
if [[ ${#files[@]} -gt 0 ]]; then
  for f in "${files[@]}"; do
    if grep -q HANG "$f"; then echo "ALARM: working on the last Unit for 10 seconds"; exit 70; fi
  done
  exit 0
fi
sleep 1
echo "stat::number_of_executed_units: 5000"
echo "stat::slowest_unit_time_sec: 0"
"#;

struct Rig {
    dir: tempfile::TempDir,
}

impl Rig {
    /// A cache with a stand-in cargo-fuzz (at the version the script pins,
    /// so nothing is installed) and a target directory holding `targets`.
    fn new(targets: &[&str]) -> Rig {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let tools = std::fs::read_to_string(root.join("scripts/cargo-tools.sh")).expect("read");
        let version = tools
            .split("[cargo-fuzz]=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("cargo-tools.sh pins cargo-fuzz")
            .trim_end_matches(')');
        let bin = dir.path().join("cache/cargo-tools/bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        write_exec(&bin.join("cargo-fuzz"), "#!/usr/bin/env bash\nexit 0\n");
        std::fs::write(bin.join(".cargo-fuzz.version"), format!("{version}\n")).expect("stamp");
        let rustc = std::process::Command::new("rustc")
            .arg("-vV")
            .output()
            .expect("rustc -vV");
        let triple = String::from_utf8_lossy(&rustc.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
            .expect("rustc's host");
        let release = dir.path().join("target").join(triple).join("release");
        std::fs::create_dir_all(&release).expect("mkdir");
        for t in targets {
            write_exec(&release.join(t), TARGET);
        }
        Rig { dir }
    }

    fn artifacts(&self, target: &str) -> PathBuf {
        let a = self.dir.path().join("artifacts").join(target);
        std::fs::create_dir_all(&a).expect("mkdir");
        a
    }

    /// `scripts/fuzz.sh seconds targets...`, with `defer` as FUZZ_DEFER.
    async fn run(&self, seconds: u32, targets: &[&str], defer: Option<&Path>) -> Output {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut cmd = tokio::process::Command::new(root.join("scripts/fuzz.sh"));
        cmd.arg(seconds.to_string())
            .args(targets)
            .env("DRAINSHIM_CACHE", self.dir.path().join("cache"))
            .env("FUZZ_TARGET_DIR", self.dir.path().join("target"))
            .env("FUZZ_ARTIFACTS", self.dir.path().join("artifacts"))
            .env_remove("FUZZ_DEFER")
            .kill_on_drop(true);
        if let Some(d) = defer {
            cmd.env("FUZZ_DEFER", d);
        }
        tokio::time::timeout(WAIT, cmd.output())
            .await
            .expect("fuzz.sh finished")
            .expect("fuzz.sh ran")
    }
}

fn write_exec(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn said(o: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test]
async fn a_target_starved_of_cpu_beside_the_tests_runs_again_on_its_own() {
    let rig = Rig::new(&["starved"]);
    let defer = rig.dir.path().join("deferred");
    let o = rig.run(2, &["starved"], Some(&defer)).await;
    assert!(o.status.success(), "{}", said(&o));
    assert_eq!(
        std::fs::read_to_string(&defer).expect("the deferral file"),
        "starved\n",
        "{}",
        said(&o)
    );
    assert!(said(&o).contains("again on its own"), "{}", said(&o));
    // On its own the same run is judged, and passes on its inputs.
    let o = rig.run(2, &["starved"], None).await;
    assert!(o.status.success(), "{}", said(&o));
    assert!(!said(&o).contains("again on its own"), "{}", said(&o));
}

#[tokio::test]
async fn a_hang_saved_beside_the_tests_fails_the_run_on_its_own() {
    let rig = Rig::new(&["hangs", "fixed"]);
    std::fs::write(rig.artifacts("hangs").join("timeout-0a1b"), "HANG").expect("write");
    std::fs::write(rig.artifacts("fixed").join("slow-unit-2c3d"), "fast now").expect("write");
    let o = rig.run(1, &["hangs", "fixed"], None).await;
    assert_eq!(o.status.code(), Some(1), "{}", said(&o));
    let out = said(&o);
    assert!(
        out.contains("hangs") && out.contains("a saved hang"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("fixed") && l.contains("execs") && !l.contains("FAILED")),
        "an input that no longer hangs passes: {out}"
    );
}
