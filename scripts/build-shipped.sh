#!/usr/bin/env bash
# Builds the production binary: the one the image ships (Dockerfile) and the
# one the guard and footprint benchmarks measure (make bench). One script, so
# the two cannot drift apart:
#
#   release profile, drainshim's default features (none: the bench, the
#   demo, the bench proto, tonic and the WebSocket client are drainshim-bench's,
#   not built here), x86_64-unknown-linux-gnu linked fully static
#   (crt-static: glibc and every C object inside the binary, no loader, no
#   shared library), and the allocator chosen below.
#
# Usage: scripts/build-shipped.sh [--allocator system|mimalloc] [--profile P] [--out PATH]
#   --allocator  system (default: glibc's malloc, the shipped one) or mimalloc
#                (cargo feature `mimalloc`), for comparing the two
#   --profile    cargo profile (default release, the shipped one)
#   --out        where the binary goes (default target/shipped/drainshim,
#                target/shipped-mimalloc/drainshim with --allocator mimalloc)
#
# Then it checks what it built: no ELF interpreter and no shared library
# needed (readelf), and `--version` and `sidecar --help` run.
# DRAINSHIM_COMMIT names the commit for --version where there is no .git
# (the image build; see build.rs).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cargo=${CARGO:-cargo}
target=x86_64-unknown-linux-gnu
allocator=system
profile=release
out=

die() { echo "build-shipped: $*" >&2; exit 1; }

while (($#)); do
  case $1 in
    --allocator) allocator=${2:?--allocator needs system or mimalloc}; shift 2 ;;
    --profile) profile=${2:?--profile needs a cargo profile}; shift 2 ;;
    --out) out=${2:?--out needs a path}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

features=()
case $allocator in
  system) default_out=$root/target/shipped/drainshim ;;
  mimalloc) features=(--features mimalloc); default_out=$root/target/shipped-mimalloc/drainshim ;;
  *) die "--allocator must be system or mimalloc, not $allocator" ;;
esac
out=${out:-$default_out}
command -v readelf >/dev/null || die "readelf is needed to check the binary (Debian: binutils)"

# A target directory of its own: the static flags change every crate's
# fingerprint, and sharing target/ with the ordinary builds (or the fuzz
# builds, which also name this target) would rebuild both sides every time.
build_dir=$root/target/shipped-build
# --target keeps the flags off the host side (build scripts, proc macros);
# the variable scoped to the target adds them to whatever RUSTFLAGS says.
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
CARGO_TARGET_DIR=$build_dir "$cargo" build --locked --profile "$profile" \
  "${features[@]}" --target "$target" -p drainshim --bin drainshim \
  --manifest-path "$root/Cargo.toml"

case $profile in
  dev|test) profile_dir=debug ;;
  *) profile_dir=$profile ;;
esac
built=$build_dir/$target/$profile_dir/drainshim
[[ -x $built ]] || die "cargo reported success but $built is missing"

# Static: no program interpreter (ld-linux) and no DT_NEEDED entry. A
# static-pie still has a dynamic section, so ldd's answer varies; these two
# facts do not.
if readelf -lW "$built" | grep -q 'INTERP'; then
  die "$built asks for an ELF interpreter: not static"
fi
if readelf -dW "$built" | grep -q '(NEEDED)'; then
  die "$built needs shared libraries: $(readelf -dW "$built" | grep '(NEEDED)' | tr -s ' ')"
fi

mkdir -p "$(dirname "$out")"
install -m 0755 "$built" "$out"
version=$("$out" --version) || die "$out --version failed"
"$out" sidecar --help >/dev/null || die "$out sidecar --help failed"
echo "build-shipped: $version, static $target, allocator $allocator, profile $profile: $out" >&2
