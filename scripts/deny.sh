#!/usr/bin/env bash
# Supply-chain checks with cargo-deny (policy in deny.toml), for the
# workspace (drainshim and drainshim-bench) and for the fuzz crate (its own
# lock file).
#
# Blocking: licenses, bans, sources. Advisories are reported only: the
# RustSec advisory DB is a git repository on GitHub, which this project's
# machines and CI cannot reach. If the DB is already on the machine (under
# $CARGO_HOME/advisory-dbs) it is used as it is, without fetching; if it is
# not, the advisories check is skipped and says so. Either way its result
# never fails this script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/cargo-tools.sh" cargo-deny
deny=${DRAINSHIM_CACHE:-$root/.cache}/cargo-tools/bin/cargo-deny
cd "$root"

status=0
for manifest in Cargo.toml fuzz/Cargo.toml; do
  echo "deny: $manifest: licenses, bans, sources" >&2
  "$deny" --manifest-path "$manifest" --workspace --config deny.toml check \
    --hide-inclusion-graph licenses bans sources || status=1
done

db_dir=${CARGO_HOME:-$HOME/.cargo}/advisory-dbs
if compgen -G "$db_dir/*/crates" >/dev/null; then
  echo "deny: advisories (local DB in $db_dir, not refreshed; not blocking)" >&2
  "$deny" --workspace --config deny.toml --offline check --hide-inclusion-graph advisories \
    || echo "deny: advisories reported findings (above); not blocking" >&2
else
  echo "deny: advisories NOT checked: no advisory DB on this machine and GitHub is unreachable (not blocking)" >&2
fi
exit $status
